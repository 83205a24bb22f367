"""`dstk data prepare`: raw text files → cleaned, deduplicated, filtered, mixed, tokenized and packed training
sequences on disk (HF `datasets` Arrow), with a manifest that accounts for every document.

Stages, streaming (memory stays flat as the corpus grows, apart from a few bytes per document: the dedup
index and the per-document length, domain and split flag):

1. read (toolkit.data.read): JSONL/text files, domain per document, bad lines counted;
2. clean (toolkit.data.clean), language and quality filters (toolkit.data.quality), exact/near dedup
   (toolkit.data.dedup); the survivors are spilled to a work file;
3. tokenizer: a local one, or a byte-level BPE trained on the survivors;
4. tokenize into a flat token file (toolkit.data.store);
5. mix (toolkit.data.mix): per-domain token budgets, documents downsampled in seeded random order;
6. split ~2 % to validation by a hash of the text, shuffle each split with the seed, and pack: documents
   joined by an end-of-text token, cut into rows of exactly `seq_length` tokens; the last row of each split
   is padded (its real length is kept in `n_tokens`, padding gets label -100), so every kept token is
   trained on exactly once per epoch. With `--no-pack`, a row per document instead (pieces of `seq_length`
   when longer), for token-budget batching.

The same inputs, options and seed give byte-identical Arrow files.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.data.clean import Cleaner
from toolkit.data.dedup import EXACT, KEEP, NEAR, Deduplicator
from toolkit.data.mix import check_mix, mixture_weights, select, shares, token_budgets
from toolkit.data.options import PrepareOptions
from toolkit.data.pack import pack, pack_chunks, write_split
from toolkit.data.quality import REASONS, language_allowed, quality_reason, word_hashes, words_of
from toolkit.data.read import BAD_INPUT, expand_inputs, iter_records
from toolkit.data.store import TokenStore
from toolkit.data.tokenizer import load_tokenizer, tokenizer_hash, train_tokenizer
from toolkit.errors import UserError

__all__ = [  # pack and pack_chunks live in toolkit.data.pack; callers have always imported pack from here
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
MANIFEST = "manifest.json"
WORK = ".dstk-work"
SPLITS = ("train", "validation")
BATCH = 2048  # documents per filter/dedup batch: large enough for vectorised index lookups, small in memory
# (stage, drop reasons counted at it), in pipeline order
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("clean", ("empty_after_cleaning",)),
    ("language", ("language",)),
    ("quality", REASONS),
    ("exact_dedup", ("exact_duplicate",)),
    ("near_dedup", ("near_duplicate",)),
    ("mix", ("mixing",)),
)


@dataclass
class _Survivors:
    """What the filtering pass leaves: per-document domain ids (the texts are in the spill file) and counts."""

    domains: dict[str, int] = field(default_factory=dict)
    """Domain name → id, in order of first appearance."""
    domain_ids: array = field(default_factory=lambda: array("i"))
    read: int = 0
    dropped: Counter = field(default_factory=Counter)
    bad_input: dict[str, int] = field(default_factory=dict)
    cleaning_changed: int = 0
    boilerplate_lines: int = 0
    untagged: int = 0

    def domain_id(self, name: str) -> int:
        return self.domains.setdefault(name, len(self.domains))


def iter_documents(paths: list[Path], stats: dict[str, int]) -> Iterator[str]:
    """Texts of every document; unreadable or malformed lines are counted in `stats`, never fatal."""
    for record in iter_records(paths, stats):
        yield record.text


def is_validation(text: str, fraction: float) -> bool:
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return digest % 10_000 < fraction * 10_000


def split_order(documents: np.ndarray, seed: int, split: str) -> np.ndarray:
    """The order in which a split's documents (indices in kept order) are packed: a seeded shuffle, so the
    domains interleave and a different seed gives different rows."""
    return np.random.default_rng([seed, SPLITS.index(split)]).permutation(documents)


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def _read_spill(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


class _Sample:
    """Every k-th spilled document, k = ceil(spill size / limit): a uniform sample of about `limit_mb` MB
    across domains (the spill is in input order), to train the tokenizer in bounded memory."""

    def __init__(self, spill: Path, limit_mb: float) -> None:
        self.spill, self.documents = spill, 0
        self.stride = max(1, math.ceil(spill.stat().st_size / (limit_mb * 1e6)))

    def __iter__(self) -> Iterator[str]:
        for i, text in enumerate(_read_spill(self.spill)):
            if i % self.stride == 0:
                self.documents += 1
                yield text


def filter_documents(
    inputs: list[Path], options: PrepareOptions, spill: Path
) -> tuple[_Survivors, Deduplicator]:
    """Stage 2: clean, filter and deduplicate; survivors' texts go to `spill` (one JSON string per line)."""
    cleaner, dedup, kept = Cleaner(options.boilerplate), Deduplicator(options.dedup), _Survivors()
    with spill.open("w", encoding="utf-8") as out:
        for batch in _batched(iter_records(inputs, kept.bad_input), BATCH):
            texts, shingles, domains = [], [], []
            for record in batch:
                kept.read += 1
                text, removed = cleaner(record.text)
                kept.boilerplate_lines += removed
                kept.cleaning_changed += text != record.text
                if not text:
                    kept.dropped["empty_after_cleaning"] += 1
                    continue
                if options.languages is not None:
                    allowed = language_allowed(record.lang, options.languages)
                    kept.untagged += allowed is None
                    if allowed is False:
                        kept.dropped["language"] += 1
                        continue
                doc_words = words_of(text)
                hashes = word_hashes(doc_words)
                reason = quality_reason(options.quality, text, doc_words, hashes)
                if reason is not None:
                    kept.dropped[reason] += 1
                    continue
                texts.append(text)
                shingles.append(dedup.shingles(hashes))  # a few bytes per word, not the words themselves
                domains.append(record.domain)
            codes = dedup.check(texts, shingles)
            kept.dropped["exact_duplicate"] += int((codes == EXACT).sum())
            kept.dropped["near_duplicate"] += int((codes == NEAR).sum())
            for i in np.flatnonzero(codes == KEEP):
                out.write(json.dumps(texts[i]) + "\n")
                kept.domain_ids.append(kept.domain_id(domains[i]))
    return kept, dedup


def tokenize(tok: Any, spill: Path, store: TokenStore, validation_fraction: float) -> np.ndarray:
    """Stage 4: every spilled document into `store`; returns the validation flag of each."""
    backend = tok.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    validation = bytearray()
    # token ids are Python ints until stored (~36 bytes each): keep batches small
    for batch in _batched(_read_spill(spill), 256):
        store.append([e.ids for e in encode(batch, add_special_tokens=False)])
        validation.extend(is_validation(text, validation_fraction) for text in batch)
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
) -> dict[str, Any]:
    """Run the pipeline on `inputs` into `out/{train,validation}`, `out/tokenizer` and `out/manifest.json`."""
    import datasets

    datasets.disable_progress_bars()
    options = options or PrepareOptions()
    if (tokenizer is None) == (vocab_size is None):
        raise UserError(
            "--tokenizer/--train-tokenizer: give exactly one (a local tokenizer dir, or a vocab size)"
        )
    if not 0 <= validation_fraction < 1:
        raise UserError(f"--validation-fraction: {validation_fraction} must be in [0, 1)")
    expand_inputs(inputs)  # a missing input fails before anything is written
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    work = out / WORK
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        return _run(inputs, out, work, seq_length, tokenizer, vocab_size, validation_fraction, seed, options)
    except BaseException:
        if created:  # leave no half-written output behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(
    inputs: list[Path],
    out: Path,
    work: Path,
    seq_length: int,
    tokenizer: Path | None,
    vocab_size: int | None,
    validation_fraction: float,
    seed: int,
    options: PrepareOptions,
) -> dict[str, Any]:
    spill = work / "kept.jsonl"
    kept, dedup = filter_documents(inputs, options, spill)
    if not kept.domain_ids:
        raise UserError(f"--input: no document survived filtering (read {kept.read}; dropped {_drops(kept)})")
    domain_ids = np.array(kept.domain_ids, dtype=np.int32)
    names = list(kept.domains)
    docs_kept = {d: int((domain_ids == k).sum()) for k, d in enumerate(names)}
    check_mix(options.mix, docs_kept)  # fail before the tokenizer is trained

    tok_dir = out / "tokenizer"
    tokenizer_training = None
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok.save_pretrained(tok_dir)
    else:
        sample = _Sample(spill, options.tokenizer_sample_mb)
        tok = train_tokenizer(sample, vocab_size, tok_dir)
        tokenizer_training = {"documents": sample.documents, "every_kth_document": sample.stride}
    if tok.eos_token_id is None:
        raise UserError(f"--tokenizer: {tokenizer} has no eos_token to separate documents")
    eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    store = TokenStore(work / "tokens.bin")
    validation = tokenize(tok, spill, store, validation_fraction)
    spill.unlink()
    lengths = store.lengths.astype(np.int64) + 1  # + the end-of-text separator
    available = {d: int(lengths[domain_ids == k].sum()) for k, d in enumerate(names)}
    weights = mixture_weights(available, options.mix, options.temperature)
    selected = select(domain_ids, lengths, names, token_budgets(available, weights), seed)
    kept.dropped["mixing"] = int((~selected).sum())
    chosen = {d: int(lengths[selected & (domain_ids == k)].sum()) for k, d in enumerate(names)}

    documents, rows, tokens, cut = {}, {}, {}, {}
    for split in SPLITS:
        idx = np.flatnonzero(selected & (validation == (split == "validation")))
        order = split_order(idx, seed, split)
        rows[split] = write_split(
            store,
            order,
            out / split,
            work / f"{split}.arrow",
            seq_length,
            eos,
            pad,
            options.max_shard_mb,
            options.packing,
        )
        documents[split], tokens[split] = len(idx), int(lengths[idx].sum())
        cut[split] = int((lengths[idx] > seq_length).sum())
    if validation_fraction > 0 and not rows["validation"]:  # dstk train --eval-every would find nothing
        raise UserError(
            f"--validation-fraction: {validation_fraction:g} of {len(lengths)} documents leaves no validation "
            f"row of {seq_length} tokens ({documents['validation']} documents, {tokens['validation']} tokens); "
            "raise it, give more data, or use --validation-fraction 0"
        )
    manifest = {
        "seq_length": seq_length,
        "packing": options.packing,
        "vocab_size": len(tok),
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tokenizer_hash": tokenizer_hash(tok_dir),
        "tokenizer_training": tokenizer_training,
        "seed": seed,
        "inputs": [str(p) for p in inputs],
        "validation_fraction": validation_fraction,
        "documents": documents,
        "rows": rows,
        "tokens": tokens,
        **({"documents_cut_into_pieces": cut} if options.packing == "none" else {}),
        "bad_input": {k: kept.bad_input.get(k, 0) for k in BAD_INPUT},
        "stages": _stages(kept),
        "dropped": _drops(kept),
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
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def _drops(kept: _Survivors) -> dict[str, int]:
    return {reason: kept.dropped[reason] for _, reasons in STAGES for reason in reasons}


def _stages(kept: _Survivors) -> list[dict[str, Any]]:
    """Documents in and kept at each stage, in pipeline order."""
    report, n = [], kept.read
    for stage, reasons in STAGES:
        dropped = sum(kept.dropped[r] for r in reasons)
        report.append({"stage": stage, "in": n, "kept": n - dropped})
        n -= dropped
    return report


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
