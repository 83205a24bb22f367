"""The `filter` stage as datatrove PipelineSteps, one task per shard (toolkit.data.shards):

`ShardReader` (the shard's pieces as documents; bad input counted per piece) → `FilterStep` (dstk's clean,
language and quality filters: toolkit.data.filter.DocumentFilter) → `SurvivorWriter` (the survivors' texts,
domains and validation flags, and their dedup keys).

The dedup keys go out in the file format of datatrove's MinHash stage 1 (`bucket_BBB/RRRRR.minhash.sig`:
records of `hashes_per_bucket` uint64 values and the uint32 index of the document in the task, sorted), so
that datatrove's stage 2 (`MinhashDedupBuckets`) finds the pairs across all tasks and its stage 4
(`MinhashDedupFilter`) drops documents by index. Bucket 0 holds the exact key (BLAKE2b of the cleaned text),
buckets 1..g the near-duplicate band keys (toolkit.data.signatures), one value each; band j goes to bucket
1 + j mod g. Band keys are salted by band, so bands can share a bucket: a shared key is a shared band. g is
the number of bucket tasks worth running at once (all b bands on a cluster, fewer on a small machine: each
bucket task costs a process start and a log). datatrove reads values below 2⁶¹-1 only, so keys are taken
modulo that prime.
"""

from __future__ import annotations

import json
import os
import socket
from array import array
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from toolkit.data.filter import BATCH, DocumentFilter, FilterCounts, batched, is_validation
from toolkit.data.formats import PieceReport, Record, read_piece
from toolkit.data.options import PrepareOptions
from toolkit.data.progress import Heartbeat
from toolkit.data.shards import from_json
from toolkit.data.signatures import Signer, exact_keys
from toolkit.data.workdir import atomic, rank_file, read_json, write_json

HASH_RANGE = np.uint64((1 << 61) - 1)
"""datatrove's MinHash stage 2 stops at the first value >= 2⁶¹-1 of a 64-bit bucket file."""
SIG = np.dtype([("key", "<u8"), ("doc", "<u4")])  # packed: 12 bytes, datatrove's "<QI"


def band_groups(bands: tuple[int, int] | None, executor: str, workers: int, tasks: int) -> int:
    """Bucket files of band keys: one per band on a cluster, one per worker that has shards to work on here."""
    if bands is None:
        return 1
    return bands[0] if executor == "slurm" else max(1, min(bands[0], workers, tasks))


def buckets(options: PrepareOptions, groups: int) -> int:
    """Bucket files per task: none without dedup, the exact key, and `groups` of bands for near dedup."""
    mode = options.dedup.dedup
    return 0 if mode == "none" else 1 if mode == "exact" else 1 + groups


class ShardReader(PipelineStep):
    """The documents of shard `rank` (plan.json), in input order."""

    name, type = "dstk shard reader", "📖 - READER"

    def __init__(self, stage: str, fields: tuple[str, str]) -> None:
        super().__init__()
        self.stage, self.fields = stage, fields

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        stage = Path(self.stage)
        pieces = from_json(read_json(stage / "plan.json")[rank])
        beat = Heartbeat(rank_file(stage / "progress", rank, ""))
        reports, done, documents = [], 0.0, 0
        for piece in pieces:
            report = PieceReport()
            if piece.start == 0 and os.stat(piece.source.path).st_size == 0:
                report.add("empty_files", 0)
            else:
                for record in read_piece(piece, self.fields, report):
                    documents += 1
                    beat(done + report.bytes, documents)
                    yield Document(
                        text=record.text,
                        id=f"{rank}/{documents}",
                        metadata={"domain": record.domain, "lang": record.lang},
                    )
            done += report.bytes
            entry = {"path": piece.source.path, "start": piece.start}
            reports.append(
                entry | {k: getattr(report, k) for k in ("lines", "bytes", "records", "bad", "reason")}
            )
        write_json(rank_file(stage / "reports", rank, ".read.json"), reports)
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        write_json(rank_file(stage / "reports", rank, ".node.json"), {"node": node})
        beat(done, documents, force=True)


class FilterStep(PipelineStep):
    """Clean, then drop by language and quality; the word hashes travel on for the dedup keys."""

    name, type = "dstk clean + filters", "🔻 - FILTER"

    def __init__(self, stage: str, options: PrepareOptions) -> None:
        super().__init__()
        self.stage, self.options = stage, options

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        counts = FilterCounts()
        check = DocumentFilter(self.options, counts)
        for doc in data:
            with self.track_time():
                passed = check(Record(doc.text, doc.metadata["domain"], doc.metadata["lang"]))
            if passed is not None:
                doc.text, doc.metadata["word_hashes"] = passed
                yield doc
        write_json(rank_file(Path(self.stage) / "reports", rank, ".filter.json"), counts.to_json())


class SurvivorWriter(PipelineStep):
    """The shard's survivors (`docs/RRRRR.jsonl`: one JSON string per line, with their domain, validation flag
    and line length beside them) and their dedup keys (`sigs/`, datatrove's stage-1 format)."""

    name, type = "dstk survivors + dedup keys", "🫂 - DEDUP"

    def __init__(
        self, stage: str, options: PrepareOptions, validation_fraction: float, bands: tuple[int, int] | None,
        groups: int,
    ) -> None:  # fmt: skip
        super().__init__()
        self.stage, self.options, self.validation_fraction = stage, options, validation_fraction
        self.bands, self.groups = bands, groups
        """(bands, rows per band) of near dedup (toolkit.data.signatures.lsh_bands), None without it; the
        bucket files the bands are spread over."""

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        docs = Path(self.stage) / "docs"
        near = self.options.dedup.dedup == "near"
        signer = Signer(self.options.dedup, self.bands) if near else None
        domains: dict[str, int] = {}
        ids, sizes, validation, keys = array("i"), array("q"), bytearray(), []
        with atomic(rank_file(docs, rank, ".jsonl")) as out:
            for batch in batched(data, BATCH):
                with self.track_time(unit="batch"):
                    texts = [d.text for d in batch]
                    keys.append(self._keys(texts, [d.metadata["word_hashes"] for d in batch], signer))
                    for doc in batch:
                        line = (json.dumps(doc.text) + "\n").encode()
                        out.write(line)
                        sizes.append(len(line))
                        ids.append(domains.setdefault(doc.metadata["domain"], len(domains)))
                        validation.append(is_validation(doc.text, self.validation_fraction))
        for name, values in (("domain", np.frombuffer(ids, np.int32)), ("bytes", np.frombuffer(sizes, np.int64)),
                             ("validation", np.frombuffer(bytes(validation), np.bool_))):  # fmt: skip
            with atomic(rank_file(docs, rank, f".{name}.npy")) as f:
                np.save(f, values)
        write_json(rank_file(docs, rank, ".json"), {"domains": list(domains), "documents": len(ids)})
        self._write_sigs(rank, np.concatenate(keys) if keys else None)
        return
        yield

    def _keys(self, texts: list[str], hashes: list[np.ndarray], signer: Signer | None) -> np.ndarray | None:
        if self.options.dedup.dedup == "none":
            return None
        exact = exact_keys(texts)[:, None]
        if signer is None:
            return exact
        return np.hstack([exact, signer.band_keys([signer.shingles(h) for h in hashes])])

    def _write_sigs(self, rank: int, keys: Any) -> None:
        if self.options.dedup.dedup == "none":
            return
        n_buckets = buckets(self.options, self.groups)
        width = 1 + (self.bands[0] if self.bands and n_buckets > 1 else 0)
        keys = np.zeros((0, width), np.uint64) if keys is None else keys % HASH_RANGE
        docs = np.arange(len(keys), dtype=np.uint32)
        bucket_of = np.array([0, *(1 + j % self.groups for j in range(width - 1))])
        for b in range(n_buckets):
            part = keys[:, bucket_of == b]
            key, doc = part.ravel(), np.repeat(docs, part.shape[1])
            order = np.lexsort((doc, key))
            records = np.empty(len(key), dtype=SIG)
            records["key"], records["doc"] = key[order], doc[order]
            with atomic(Path(self.stage) / "sigs" / f"bucket_{b:03d}" / f"{rank:05d}.minhash.sig") as f:
                f.write(records.tobytes())
