"""What happens to each document before dedup: clean, then filter by language and quality (`DocumentFilter`),
every drop counted (`FilterCounts`); and `filter_documents`, the whole pass with dedup in this process.

The same `DocumentFilter` runs inside each task of `dstk data prepare` (toolkit.data.task_filter); the tasks'
counts are summed (`FilterCounts.merge`) into the numbers manifest.json reports.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.data.clean import Cleaner
from toolkit.data.dedup import EXACT, KEEP, NEAR, Deduplicator
from toolkit.data.formats import Record
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
class FilterCounts:
    """What cleaning and the filters did to the documents read."""

    read: int = 0
    dropped: Counter = field(default_factory=Counter)
    cleaning_changed: int = 0
    boilerplate_lines: int = 0
    untagged: int = 0

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(FilterCounts)} | {"dropped": dict(self.dropped)}

    @classmethod
    def merge(cls, parts: Iterable[dict[str, Any]]) -> FilterCounts:
        total = cls()
        for part in parts:
            for name, value in part.items():
                if name == "dropped":
                    total.dropped.update(value)
                else:
                    setattr(total, name, getattr(total, name) + value)
        return total


class DocumentFilter:
    """clean → language → quality for one record: (cleaned text, word hashes) to keep, or None (counted)."""

    def __init__(self, options: PrepareOptions, counts: FilterCounts | None = None) -> None:
        self.options, self.cleaner = options, Cleaner(options.boilerplate)
        self.counts = counts if counts is not None else FilterCounts()

    def __call__(self, record: Record) -> tuple[str, np.ndarray] | None:
        counts = self.counts
        counts.read += 1
        text, removed = self.cleaner(record.text)
        counts.boilerplate_lines += removed
        counts.cleaning_changed += text != record.text
        if not text:
            counts.dropped["empty_after_cleaning"] += 1
            return None
        if self.options.languages is not None:
            allowed = language_allowed(record.lang, self.options.languages)
            counts.untagged += allowed is None
            if allowed is False:
                counts.dropped["language"] += 1
                return None
        doc_words = words_of(text)
        hashes = word_hashes(doc_words)
        reason = quality_reason(self.options.quality, text, doc_words, hashes)
        if reason is not None:
            counts.dropped[reason] += 1
            return None
        return text, hashes


@dataclass
class Survivors(FilterCounts):
    """What the one-process pass leaves: per-document domain ids (the texts are in the spill file) and counts."""

    domains: dict[str, int] = field(default_factory=dict)
    """Domain name → id, in order of first appearance."""
    domain_ids: array = field(default_factory=lambda: array("i"))
    validation: int = 0
    """Kept documents whose hash puts them in the validation split."""
    bad_input: InputReport = field(default_factory=InputReport)

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
    """Clean, filter and deduplicate in this process; survivors' texts go to `spill` (one JSON string per line),
    in input order, as the tasks of `dstk data prepare` would keep them."""
    dedup, kept = Deduplicator(options.dedup), Survivors()
    check, stage, seen = DocumentFilter(options, kept), stage or Stage(), 0
    kept.bad_input.text_field = options.text_field
    fields = (options.text_field, options.domain_field)
    with spill.open("w", encoding="utf-8") as out:
        for batch in batched(iter_records(inputs, kept.bad_input, fields), BATCH):
            stage.advance(kept.bad_input.bytes_read - seen, documents=len(batch))
            seen = kept.bad_input.bytes_read
            texts, shingles, domains = [], [], []
            for record in batch:
                if (passed := check(record)) is None:
                    continue
                texts.append(passed[0])
                shingles.append(dedup.shingles(passed[1]))  # a few bytes per word, not the words themselves
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


def drops(counts: FilterCounts) -> dict[str, int]:
    return {reason: counts.dropped[reason] for _, reasons in STAGES for reason in reasons}


def stage_counts(counts: FilterCounts) -> list[dict[str, Any]]:
    """Documents in and kept at each stage, in pipeline order."""
    report, n = [], counts.read
    for stage, reasons in STAGES:
        dropped = sum(counts.dropped[r] for r in reasons)
        report.append({"stage": stage, "in": n, "kept": n - dropped})
        n -= dropped
    return report
