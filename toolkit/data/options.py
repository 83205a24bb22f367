"""The settings of `dstk data prepare`, as frozen pydantic models (only pydantic and the standard library are
imported, so building the CLI parser stays fast). The CLI derives its threshold flags from these fields.

`PrepareOptions` is what decides the dataset (it is recorded in manifest.json); `ExecutionOptions` is only how
the work is spread over processes and nodes, which never changes a byte of the output."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolkit.data.clean import DEFAULT_BOILERPLATE

_STRICT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class QualityFilter(BaseModel):
    """Thresholds of the quality filters; a document failing several is counted under the first in `REASONS`."""

    model_config = _STRICT

    min_words: int = Field(default=5, ge=0)
    """Fewest words a document may have (Gopher: 50)."""
    max_words: int = Field(default=100_000, gt=0)
    """Most words a document may have (Gopher: 100,000)."""
    max_symbol_ratio: float = Field(default=1.0, gt=0)
    """Most non-alphanumeric, non-space characters per alphabetic character."""
    max_repetition: float = Field(default=0.15, gt=0, le=1)
    """Largest share of characters in word n-grams that occur more than once (Gopher, 5-grams: 0.15)."""
    repetition_ngram: int = Field(default=5, ge=2)
    """n of the repeated word n-grams measured by --max-repetition."""
    repetition_min_words: int = Field(default=50, ge=0)
    """Shorter documents skip the repetition filter (Gopher measured it on documents of >= 50 words)."""

    @model_validator(mode="after")
    def _check_range(self) -> QualityFilter:
        if self.min_words > self.max_words:
            raise ValueError(f"--min-words({self.min_words}) > --max-words({self.max_words})")
        return self


class DedupOptions(BaseModel):
    """Which duplicates to remove, and the MinHash LSH parameters of the near-duplicate pass."""

    model_config = _STRICT

    dedup: Literal["none", "exact", "near"] = "near"
    """near (the default: exact, then MinHash LSH on word shingles), exact (identical cleaned text), or none.
    Real corpora repeat themselves (boilerplate pages, mirrored code, quoted posts): the pipeline of the
    source articles cleans, then deduplicates, then filters for quality, then mixes domains."""
    shingle_size: int = Field(default=5, ge=1)
    """Words per shingle for the near-duplicate pass."""
    near_threshold: float = Field(default=0.7, gt=0, lt=1)
    """Jaccard similarity of shingle sets above which documents count as near duplicates. 0.7 with 128
    permutations gives 14 bands of 9 rows: FineWeb's curve (Penedo et al. 2024: 5-grams, 14 buckets × 8 hashes,
    aimed at documents ≥ 75 % similar), which catches a one-word edit of a 120-word page 96 % of the time where
    0.8 (9 × 13) catches it 63 % of the time; pairs at J = 0.5 still collide with probability 2.7 %."""
    num_perm: int = Field(default=128, ge=16, le=1024)
    """MinHash permutations per document (more: sharper threshold, slower)."""


class PrepareOptions(BaseModel):
    """Everything between reading and packing; the defaults keep every document of the demo corpus."""

    model_config = _STRICT

    packing: Literal["concat", "none"] = "concat"
    """concat: documents joined into rows of exactly seq_length tokens; none (--no-pack): a row per document,
    cut into pieces of seq_length when longer, for token-budget batching (dstk train --token-budget)."""
    boilerplate: tuple[str, ...] = DEFAULT_BOILERPLATE
    """Regexes (case-insensitive); lines matching one are removed."""
    languages: tuple[str, ...] | None = None
    """Keep documents whose `lang`/`language` field is one of these; untagged documents are kept."""
    quality: QualityFilter = QualityFilter()
    dedup: DedupOptions = DedupOptions()
    mix: dict[str, float] | None = None
    """Target token share per domain (see toolkit.data.mix.parse_mix); None: temperature sampling."""
    temperature: float = Field(default=1.0, gt=0)
    """Without a mix: domain weights ∝ tokens^(1/T); 1 keeps the natural proportions."""
    tokenizer_sample_mb: float = Field(default=200, gt=0)
    """--train-tokenizer learns from every k-th kept document, k chosen so that about this much text (MB)
    is read: BPE training memory grows with the number of distinct words, not the corpus."""
    max_shard_mb: float = Field(default=100, gt=0)
    """Largest Arrow shard of a split in MB (1e6 bytes); larger splits are written as several shards."""
    text_field: str = Field(default="text", min_length=1)
    """The field holding a record's text in JSONL, Parquet and HF datasets (plain text: the line)."""
    domain_field: str = Field(default="domain", min_length=1)
    """The field naming a record's domain; a record without it takes its file's stem (its folder's name for an
    HF dataset)."""
    format: Literal["arrow", "megatron", "both"] = "arrow"
    """arrow: dstk's packed rows (HF save_to_disk, what dstk train reads); megatron: Megatron's indexed dataset
    (.bin/.idx, a sequence per document ending with the end-of-text token); both."""


class ExecutionOptions(BaseModel):
    """Where and how wide `dstk data prepare` runs (datatrove executors); the output is the same either way."""

    model_config = _STRICT

    executor: Literal["local", "slurm"] = "local"
    """local: worker processes on this machine; slurm: job arrays submitted with sbatch, one task per array
    element, waited for here."""
    workers: int | None = Field(default=None, ge=1)
    """Tasks run at once: worker processes (local; default: the cores this process may use), or array
    elements running at once (slurm; default: no limit)."""
    tasks: int | None = Field(default=None, ge=1)
    """Shards the input is cut into, each read, filtered and tokenized by one task (default: 4 per worker, at
    most 64 MB each, at least 1 MB each; with slurm, 256 MB each)."""
    slurm_partition: str | None = None
    """#SBATCH --partition of every job (required with slurm)."""
    slurm_time: str = "24:00:00"
    """#SBATCH --time of every job."""
    slurm_cpus_per_task: int = Field(default=1, ge=1)
    """#SBATCH --cpus-per-task (the tokenizer uses them)."""
    slurm_mem_per_cpu: str = "2G"
    """#SBATCH --mem-per-cpu, e.g. 2G or 500M."""
    slurm_qos: str | None = None
    """#SBATCH --qos (default: the partition's)."""
