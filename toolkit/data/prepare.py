"""`dstk data prepare`: raw text files → cleaned, deduplicated, filtered, mixed, tokenized and packed training
sequences on disk (HF `datasets` Arrow), with a manifest that accounts for every document.

Stages, streaming (memory stays flat as the corpus grows, apart from a few bytes per document: the dedup
index and the per-document length, domain and split flag):

1. read (toolkit.data.read): JSONL/text files, domain per document, bad lines counted;
2. in the same pass (toolkit.data.filter): clean (toolkit.data.clean), language and quality filters
   (toolkit.data.quality), exact/near dedup (toolkit.data.dedup); the survivors are spilled to a work file;
3. tokenizer: a local one, or a byte-level BPE trained on the survivors;
4. tokenize into a flat token file (toolkit.data.store);
5. mix (toolkit.data.mix): per-domain token budgets, documents downsampled in seeded random order;
6. split ~2 % to validation by a hash of the text, shuffle each split with the seed, and pack: documents
   joined by an end-of-text token, cut into rows of exactly `seq_length` tokens; the last row of each split
   is padded (its real length is kept in `n_tokens`, padding gets label -100), so every kept token is
   trained on exactly once per epoch. With `--no-pack`, a row per document instead (pieces of `seq_length`
   when longer), for token-budget batching.

Every path is checked before any work (toolkit.data.paths): the inputs exist (each file read once, prepared
datasets inside an input folder skipped), `--out` is not inside an input folder and replaces an existing
dataset only with `--overwrite`, `--tokenizer` is a local tokenizer directory. The new dataset is built in a
work folder inside `out` and moved into place at the end, so a failed run loses nothing: a new `out` is
removed, an old dataset stays as it was.

The same inputs, options and seed give byte-identical Arrow files.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.data.dedup import Deduplicator
from toolkit.data.explain import no_validation, nothing_kept
from toolkit.data.filter import Survivors, batched, drops, filter_documents, is_validation, stage_counts
from toolkit.data.integrity import record as file_record
from toolkit.data.mix import check_mix, mixture_weights, select, shares, token_budgets
from toolkit.data.options import PrepareOptions
from toolkit.data.pack import pack, pack_chunks, write_split
from toolkit.data.paths import MANIFEST, TOKENIZER, check_out, create_dir, is_dataset
from toolkit.data.progress import Progress, Stage, count, rate
from toolkit.data.read import BAD_INPUT, expand_inputs, iter_records
from toolkit.data.store import TokenStore
from toolkit.data.tokenizer import load_tokenizer, tokenizer_hash, train_tokenizer
from toolkit.errors import UserError

# pack and pack_chunks live in toolkit.data.pack, filter_documents and is_validation in toolkit.data.filter;
# callers have always imported them from here
__all__ = [
    "MANIFEST",
    "PrepareOptions",
    "filter_documents",
    "is_validation",
    "iter_documents",
    "pack",
    "pack_chunks",
    "prepare",
    "split_order",
    "tokenize",
]
WORK = ".dstk-work"
SPLITS = ("train", "validation")


def iter_documents(paths: list[Path], stats: dict[str, int]) -> Iterator[str]:
    """Texts of every document; unreadable or malformed lines are counted in `stats`, never fatal."""
    for record in iter_records(paths, stats):
        yield record.text


def split_order(documents: np.ndarray, seed: int, split: str) -> np.ndarray:
    """The order in which a split's documents (indices in kept order) are packed: a seeded shuffle, so the
    domains interleave and a different seed gives different rows."""
    return np.random.default_rng([seed, SPLITS.index(split)]).permutation(documents)


def _read_spill(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


class _Sample:
    """Every k-th spilled document, k = ceil(spill size / limit): a uniform sample of about `limit_mb` MB
    across domains (the spill is in input order), to train the tokenizer in bounded memory."""

    def __init__(self, spill: Path, limit_mb: float, stage: Stage | None = None) -> None:
        self.spill, self.documents, self.stage = spill, 0, stage or Stage()
        self.stride = max(1, math.ceil(spill.stat().st_size / (limit_mb * 1e6)))

    def __iter__(self) -> Iterator[str]:
        for i, text in enumerate(_read_spill(self.spill)):
            if i % self.stride == 0:
                self.documents += 1
                self.stage.advance(1, documents=1)
                yield text
        self.stage.describe("tokenizer (merging)")


def tokenize(
    tok: Any, spill: Path, store: TokenStore, validation_fraction: float, stage: Stage | None = None
) -> np.ndarray:
    """Stage 4: every spilled document into `store`; returns the validation flag of each."""
    backend = tok.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    validation = bytearray()
    stage = stage or Stage()
    # token ids are Python ints until stored (~36 bytes each): keep batches small
    for batch in batched(_read_spill(spill), 256):
        store.append([e.ids for e in encode(batch, add_special_tokens=False)])
        validation.extend(is_validation(text, validation_fraction) for text in batch)
        stage.advance(len(batch), documents=len(batch))
    store.finish()
    return np.frombuffer(bytes(validation), dtype=bool)


def prepare(
    inputs: list[Path],
    out: Path,
    seq_length: int,
    *,
    tokenizer: Path | None = None,
    vocab_size: int | None = None,
    validation_fraction: float = 0.02,
    seed: int = 0,
    options: PrepareOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the pipeline on `inputs` into `out/{train,validation}`, `out/tokenizer` and `out/manifest.json`.
    `overwrite` allows replacing a dataset already in `out`; `progress` is told about each stage."""
    import datasets

    datasets.disable_progress_bars()
    if (tokenizer is None) == (vocab_size is None):
        raise UserError(
            "--tokenizer/--train-tokenizer: give exactly one (a local tokenizer dir, or a vocab size)"
        )
    if not 0 <= validation_fraction < 1:
        raise UserError(f"--validation-fraction: {validation_fraction} must be in [0, 1)")
    # every path before any work: a mistake costs milliseconds and writes nothing
    notes: list[str] = []
    files = expand_inputs(inputs, notes)
    check_out(out, [p for p in inputs if p.is_dir()], overwrite)
    tok = load_tokenizer(tokenizer) if tokenizer is not None else None
    if tok is not None and tok.eos_token_id is None:
        raise UserError(f"--tokenizer: {tokenizer} has no eos_token to separate documents")
    if is_dataset(out):
        notes.append(f"--overwrite: the dataset in {out} is replaced once the new one is complete")
    created = not out.exists()
    create_dir(out, "--out")
    work = out / WORK
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    job = _Job(
        files, out, work, seq_length, tokenizer, tok, vocab_size, validation_fraction, seed,
        options or PrepareOptions(), progress or Progress(), notes,
    )  # fmt: skip
    try:
        manifest = _run(job, [str(p) for p in inputs])
        _install(job.dataset, out)
        return manifest
    except BaseException:
        if created:  # leave no half-written output behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class _Job:
    """One prepare run: what was asked, and where it goes."""

    files: list[Path]
    out: Path
    work: Path
    seq_length: int
    tokenizer: Path | None
    tok: Any
    """The loaded --tokenizer (None: train one of `vocab_size`)."""
    vocab_size: int | None
    validation_fraction: float
    seed: int
    options: PrepareOptions
    progress: Progress
    notes: list[str]
    """What the input checks had to say, shown with the read stage's summary."""

    @property
    def dataset(self) -> Path:
        """Where the new dataset is built, to be moved into `out` when complete."""
        return self.work / "dataset"


def _install(new: Path, out: Path) -> None:
    """Move the finished dataset into `out`, replacing an old one's parts; its manifest goes first and comes
    back last, so an interrupted swap never looks like a complete dataset."""
    (out / MANIFEST).unlink(missing_ok=True)
    for name in (TOKENIZER, *SPLITS):
        old = out / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        elif old.exists() or old.is_symlink():
            old.unlink()
        (new / name).rename(old)
    (new / MANIFEST).rename(out / MANIFEST)


def _read_stage(job: _Job, spill: Path) -> tuple[Survivors, Deduplicator]:
    """Stages 1-2, with the checks that need their counts; the stage's summary once they pass."""
    total = sum(f.stat().st_size for f in job.files)
    stage = job.progress.stage("read", total, "B")
    kept, dedup = filter_documents(
        job.files, job.options, spill, validation_fraction=job.validation_fraction, stage=stage
    )
    report = kept.bad_input
    if not kept.domain_ids:
        raise UserError(nothing_kept(report, kept.read, len(job.files), drops(kept)))
    names = list(kept.domains)
    ids = np.array(kept.domain_ids, dtype=np.int32)
    check_mix(job.options.mix, {d: int((ids == k).sum()) for k, d in enumerate(names)})
    if job.validation_fraction > 0 and not kept.validation:  # fail before the tokenizer is trained
        raise UserError(_no_validation(job, kept, 0, 0))
    mb = report.bytes_read / 1e6
    summary = (
        f"read: {count(kept.read, 'document')} from {count(len(job.files), 'file')} ({mb:,.1f} MB) "
        f"in {stage.seconds:.1f} s ({rate(kept.read, stage.seconds, 'docs')}, "
        f"{rate(report.bytes_read, stage.seconds, 'B')}); {len(ids):,} kept after cleaning, filters and dedup"
    )
    bad = [f"--input: {name}: {f.describe()}" for name, f in report.bad_files().items()]
    more = [f"--input: and {len(bad) - 10} more files with bad input (manifest.json bad_input_files)"]
    job.progress.done(stage, summary, [*job.notes, *bad[:10], *(more if len(bad) > 10 else [])])
    return kept, dedup


def _tokenizer_stage(job: _Job, spill: Path, kept: Survivors) -> tuple[Any, dict[str, Any] | None]:
    """Stage 3: the given tokenizer, or a BPE trained on a sample of the kept text, saved in the dataset."""
    tok_dir = job.dataset / TOKENIZER
    if job.tok is not None:
        stage = job.progress.stage("tokenizer")
        job.tok.save_pretrained(tok_dir)
        job.progress.done(stage, f"tokenizer: {job.tokenizer}, vocabulary {len(job.tok):,}")
        return job.tok, None
    sample = _Sample(spill, job.options.tokenizer_sample_mb)
    stage = sample.stage = job.progress.stage("tokenizer", -(-len(kept.domain_ids) // sample.stride), "doc")
    tok = train_tokenizer(sample, job.vocab_size, tok_dir)
    training = {
        "documents": sample.documents,
        "every_kth_document": sample.stride,
        "vocab_size_asked": job.vocab_size,
    }
    notes = []
    if len(tok) < job.vocab_size:
        more = "more text" if sample.stride == 1 else "a larger --tokenizer-sample-mb or more text"
        notes.append(
            f"--train-tokenizer {job.vocab_size}: the kept text gives only {len(tok):,} tokens (BPE ran out of "
            f"pairs to merge), so the vocabulary is {len(tok):,}; {more} would give more"
        )
    every = "every kept document" if sample.stride == 1 else f"1 in {sample.stride} kept documents"
    job.progress.done(
        stage,
        f"tokenizer: byte-level BPE trained on {count(sample.documents, 'document')} ({every}) in {stage.seconds:.1f} s, "
        f"vocabulary {len(tok):,}",
        notes,
    )
    return tok, training


def _run(job: _Job, inputs: list[str]) -> dict[str, Any]:
    spill = job.work / "kept.jsonl"
    kept, dedup = _read_stage(job, spill)
    domain_ids = np.array(kept.domain_ids, dtype=np.int32)
    names = list(kept.domains)
    docs_kept = {d: int((domain_ids == k).sum()) for k, d in enumerate(names)}
    tok, tokenizer_training = _tokenizer_stage(job, spill, kept)
    eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    store = TokenStore(job.work / "tokens.bin")
    stage = job.progress.stage("tokenize", len(domain_ids), "doc")
    validation = tokenize(tok, spill, store, job.validation_fraction, stage)
    spill.unlink()
    lengths = store.lengths.astype(np.int64) + 1  # + the end-of-text separator
    job.progress.done(
        stage,
        f"tokenize: {count(len(lengths), 'document')}, {count(int(lengths.sum()), 'token')} in {stage.seconds:.1f} s "
        f"({rate(len(lengths), stage.seconds, 'docs')})",
    )
    options = job.options
    available = {d: int(lengths[domain_ids == k].sum()) for k, d in enumerate(names)}
    weights = mixture_weights(available, options.mix, options.temperature)
    selected = select(domain_ids, lengths, names, token_budgets(available, weights), job.seed)
    kept.dropped["mixing"] = int((~selected).sum())
    chosen = {d: int(lengths[selected & (domain_ids == k)].sum()) for k, d in enumerate(names)}

    documents, rows, tokens, cut = {}, {}, {}, {}
    stage = job.progress.stage("pack", int(selected.sum()), "doc")
    for split in SPLITS:
        idx = np.flatnonzero(selected & (validation == (split == "validation")))
        order = split_order(idx, job.seed, split)
        rows[split] = write_split(
            store,
            _counted(order, stage),
            job.dataset / split,
            job.work / f"{split}.arrow",
            job.seq_length,
            eos,
            pad,
            options.max_shard_mb,
            options.packing,
        )
        documents[split], tokens[split] = len(idx), int(lengths[idx].sum())
        cut[split] = int((lengths[idx] > job.seq_length).sum())
    if job.validation_fraction > 0 and not rows["validation"]:  # dstk train --eval-every would find nothing
        raise UserError(_no_validation(job, kept, documents["validation"], tokens["validation"]))
    job.progress.done(
        stage,
        f"pack: {rows['train']:,} training and {count(rows['validation'], 'validation row')} in {stage.seconds:.1f} s",
    )
    manifest = {
        "seq_length": job.seq_length,
        "packing": options.packing,
        "vocab_size": len(tok),
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tokenizer_hash": tokenizer_hash(job.dataset / TOKENIZER),
        "tokenizer_training": tokenizer_training,
        "seed": job.seed,
        "inputs": inputs,
        "input_files": len(job.files),
        "notes": job.notes,
        "validation_fraction": job.validation_fraction,
        "documents": documents,
        "rows": rows,
        "tokens": tokens,
        **({"documents_cut_into_pieces": cut} if options.packing == "none" else {}),
        "bad_input": {k: kept.bad_input.bad.get(k, 0) for k in BAD_INPUT},
        "bad_input_files": kept.bad_input.manifest(),
        "stages": stage_counts(kept),
        "dropped": drops(kept),
        "cleaning": {
            "documents_changed": kept.cleaning_changed,
            "boilerplate_rules": len(options.boilerplate),
            "boilerplate_lines_removed": kept.boilerplate_lines,
        },
        "languages": {"allowed": options.languages, "untagged": kept.untagged},
        "dedup": _dedup_report(dedup),
        "mixture": {
            "mix": options.mix,
            "temperature": None if options.mix else options.temperature,
            "weights": weights,
            "documents_before": docs_kept,
            "documents_after": {d: int((selected & (domain_ids == k)).sum()) for k, d in enumerate(names)},
            "tokens_before": available,
            "tokens_after": chosen,
            "realised_shares": shares(chosen),
        },
        "options": options.model_dump(mode="json"),
        # shard sizes and tokenizer hashes: what the pre-flight checks (toolkit.data.integrity)
        **file_record(job.dataset),
    }
    (job.dataset / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _no_validation(job: _Job, kept: Survivors, documents: int, tokens: int) -> str:
    n = len(kept.domain_ids)
    fraction = job.validation_fraction
    return no_validation(kept.bad_input, kept.read, fraction, n, job.seq_length, documents, tokens)


def _counted(order: np.ndarray, stage: Stage) -> Iterator[int]:
    """`order`, advancing `stage` every 1024 documents."""
    for start in range(0, len(order), 1024):
        chunk = order[start : start + 1024]
        yield from chunk.tolist()
        stage.advance(len(chunk), documents=len(chunk))


def _dedup_report(dedup: Deduplicator) -> dict[str, Any]:
    opts = dedup.options
    report = {
        "mode": opts.dedup,
        "documents_checked": dedup.documents,
        "index_bytes": dedup.index_bytes,
        "index_bytes_per_document": dedup.index_bytes / dedup.documents if dedup.documents else 0.0,
    }
    if opts.dedup == "near":
        report.update(
            shingle_size=opts.shingle_size,
            threshold=opts.near_threshold,
            num_perm=opts.num_perm,
            bands=dedup.bands,
            rows_per_band=dedup.rows,
        )
    return report
