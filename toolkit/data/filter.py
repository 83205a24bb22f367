"""Stage 2 of `dstk data prepare`, one streaming pass: clean, filter by language and quality, deduplicate.

The survivors' texts are spilled to a work file (one JSON string per line), so memory holds only a few bytes
per document: its domain id, the dedup index, and the counts every drop and bad line is accounted in.
"""

from __future__ import annotations

import hashlib
import json
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
from toolkit.data.options import PrepareOptions
from toolkit.data.progress import Stage
from toolkit.data.quality import REASONS, language_allowed, quality_reason, word_hashes, words_of
from toolkit.data.read import InputReport, iter_records

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
class Survivors:
    """What the filtering pass leaves: per-document domain ids (the texts are in the spill file) and counts."""

    domains: dict[str, int] = field(default_factory=dict)
    """Domain name → id, in order of first appearance."""
    domain_ids: array = field(default_factory=lambda: array("i"))
    read: int = 0
    validation: int = 0
    """Kept documents whose hash puts them in the validation split."""
    dropped: Counter = field(default_factory=Counter)
    bad_input: InputReport = field(default_factory=InputReport)
    cleaning_changed: int = 0
    boilerplate_lines: int = 0
    untagged: int = 0

    def domain_id(self, name: str) -> int:
        return self.domains.setdefault(name, len(self.domains))


def is_validation(text: str, fraction: float) -> bool:
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return digest % 10_000 < fraction * 10_000


def batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def filter_documents(
    inputs: list[Path],
    options: PrepareOptions,
    spill: Path,
    *,
    validation_fraction: float = 0.0,
    stage: Stage | None = None,
) -> tuple[Survivors, Deduplicator]:
    """Stage 2: clean, filter and deduplicate; survivors' texts go to `spill` (one JSON string per line).
    Survivors that `validation_fraction` puts in the validation split are counted, so that an input too small
    to give one fails here, before the tokenizer is trained."""
    cleaner, dedup, kept = Cleaner(options.boilerplate), Deduplicator(options.dedup), Survivors()
    stage, seen = stage or Stage(), 0
    with spill.open("w", encoding="utf-8") as out:
        for batch in batched(iter_records(inputs, kept.bad_input), BATCH):
            stage.advance(kept.bad_input.bytes_read - seen, documents=len(batch))
            seen = kept.bad_input.bytes_read
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
                kept.validation += is_validation(texts[i], validation_fraction)
    stage.advance(kept.bad_input.bytes_read - seen)
    return kept, dedup


def drops(kept: Survivors) -> dict[str, int]:
    return {reason: kept.dropped[reason] for _, reasons in STAGES for reason in reasons}


def stage_counts(kept: Survivors) -> list[dict[str, Any]]:
    """Documents in and kept at each stage, in pipeline order."""
    report, n = [], kept.read
    for stage, reasons in STAGES:
        dropped = sum(kept.dropped[r] for r in reasons)
        report.append({"stage": stage, "in": n, "kept": n - dropped})
        n -= dropped
    return report
