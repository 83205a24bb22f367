"""Global dedup across every task, then the checks that need every shard's counts (the `buckets` and
`resolve` stages).

`buckets`: datatrove's `MinhashDedupBuckets`, one task per bucket, merges that bucket's sorted key files of
all the filter tasks and writes each pair of consecutive equal keys: (earlier document, later document) in
(task, index) order, which is input order (toolkit.data.shards).

`resolve` (one task) drops the *later* document of every pair: an exact pair (bucket 0) makes it an exact
duplicate, a band pair a near duplicate unless it is an exact one. A document is thus dropped exactly when an
earlier document shares a key with it — the rule of dstk's one-process dedup (toolkit.data.dedup), so the
same documents survive however the input was cut. (datatrove's own stage 3, a union-find that keeps one root
per cluster, would keep different documents depending on the cut.) The removals go to `remove/RRRRRR.remove`
(sorted uint32 indices), which datatrove's `MinhashDedupFilter` reads in the tokenize stage. Memory: 8 bytes
per removed document, the pairs of one bucket file at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets
from datatrove.utils.hashing import HashConfig

from toolkit.data.explain import no_validation, nothing_kept
from toolkit.data.filter import FilterCounts, drops
from toolkit.data.mix import check_mix
from toolkit.data.read import InputReport
from toolkit.data.workdir import VERDICT, atomic, rank_file, read_json, write_json
from toolkit.errors import UserError


def bucket_step(filter_stage: Path, stage: Path, n_buckets: int) -> MinhashDedupBuckets:
    config = MinhashConfig(
        num_buckets=n_buckets,
        hashes_per_bucket=1,
        seed=1,
        hash_config=HashConfig(precision=64, hash_fc="sha1"),
    )
    return MinhashDedupBuckets(
        str(filter_stage / "sigs"), str(stage / "dups"), config=config, lines_to_buffer=4096
    )


def removals(dups: Path, tasks: int) -> tuple[list[np.ndarray], int, int]:
    """(sorted indices to drop per task, exact duplicates, near duplicates) from the .dups pair files."""
    later: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for path in sorted(dups.glob("*.dups")):
        pairs = np.fromfile(path, dtype="<u4").reshape(-1, 4)
        pairs = pairs[
            (pairs[:, 0] != pairs[:, 2]) | (pairs[:, 1] != pairs[:, 3])
        ]  # two bands of one document
        later[path.name.startswith("00000_")].append(
            (pairs[:, 2].astype(np.uint64) << np.uint64(32)) | pairs[:, 3]
        )
    exact = np.unique(np.concatenate(later[True] or [np.zeros(0, np.uint64)]))
    near = np.setdiff1d(np.concatenate(later[False] or [np.zeros(0, np.uint64)]), exact)  # sorted, unique
    both = np.union1d(exact, near)
    rank, index = (both >> np.uint64(32)).astype(np.int64), (both & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    bounds = np.searchsorted(rank, np.arange(tasks + 1))
    return [index[bounds[r] : bounds[r + 1]] for r in range(tasks)], len(exact), len(near)


class Resolve(PipelineStep):
    """Drop the later document of each pair; count every shard's input, drops and survivors; and say (in
    verdict.json) when the data cannot give a dataset, with the flag to change."""

    name, type = "dstk dedup resolve", "🫂 - DEDUP"

    def __init__(self, filter_stage: str, bucket_stage: str, stage: str, checks: dict[str, Any]) -> None:
        super().__init__()
        self.filter_stage, self.bucket_stage, self.stage, self.checks = (
            filter_stage,
            bucket_stage,
            stage,
            checks,
        )

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        source, stage = Path(self.filter_stage), Path(self.stage)
        tasks = len(read_json(source / "plan.json"))
        removed, exact, near = removals(Path(self.bucket_stage) / "dups", tasks)
        domains: dict[str, int] = {}
        validation = checked = survivor_bytes = 0
        for r in range(tasks):
            with atomic(stage / "remove" / f"{r:06d}.remove") as f:
                f.write(removed[r].astype("<u4").tobytes())
            meta = read_json(rank_file(source / "docs", r, ".json"))
            checked += meta["documents"]
            keep = np.ones(meta["documents"], dtype=bool)
            keep[removed[r]] = False
            ids = np.load(rank_file(source / "docs", r, ".domain.npy"))[keep]
            validation += int(np.load(rank_file(source / "docs", r, ".validation.npy"))[keep].sum())
            survivor_bytes += int(np.load(rank_file(source / "docs", r, ".bytes.npy"))[keep].sum())
            present, first, n = np.unique(ids, return_index=True, return_counts=True)
            for k in np.argsort(first):  # in order of first appearance: the domains' order in input order
                name = meta["domains"][present[k]]
                domains[name] = domains.get(name, 0) + int(n[k])
        report, counts = _merged_reports(source, tasks, self.checks["text_field"])
        counts.dropped.update(exact_duplicate=exact, near_duplicate=near)
        sig_bytes = sum(p.stat().st_size for p in (source / "sigs").rglob("*.minhash.sig"))
        summary = {
            "input": report.to_json(),
            "counts": counts.to_json(),
            "domains": list(domains.items()),
            "validation": validation,
            "bytes": survivor_bytes,
            "dedup": {
                "documents_checked": checked,
                "signature_bytes": sig_bytes,
                "removed_bytes": 8 * (exact + near),
            },
        }
        write_json(stage / "summary.json", summary)
        try:
            self._check(report, counts, domains, validation)
            write_json(stage / VERDICT, {})
        except UserError as exc:
            write_json(stage / VERDICT, {"error": str(exc)})
        return
        yield

    def _check(
        self, report: InputReport, counts: FilterCounts, domains: dict[str, int], validation: int
    ) -> None:
        """The checks of the data as a whole, before the tokenizer is trained: something is left, the mix names
        domains that are, and the validation split gets a document."""
        if not domains:
            raise UserError(nothing_kept(report, counts.read, self.checks["files"], drops(counts)))
        check_mix(self.checks["mix"], domains)
        fraction = self.checks["validation_fraction"]
        if fraction > 0 and not validation:
            kept, seq = sum(domains.values()), self.checks["seq_length"]
            raise UserError(no_validation(report, counts.read, fraction, kept, seq, 0, 0))


def _merged_reports(source: Path, tasks: int, text_field: str) -> tuple[InputReport, FilterCounts]:
    """Every task's read and filter reports summed, line numbers counted from each file's start."""
    from toolkit.data.formats import PieceReport

    report, lines_before = InputReport(text_field=text_field), {}
    parts = []
    for r in range(tasks):
        for piece in read_json(rank_file(source / "reports", r, ".read.json")):
            offset = lines_before.get(piece["path"], 0)
            fields = {k: piece[k] for k in ("lines", "bytes", "records", "bad", "reason")}
            report.add_piece(piece["path"], PieceReport(**fields), first_line=offset)
            lines_before[piece["path"]] = offset + piece["lines"]
        parts.append(read_json(rank_file(source / "reports", r, ".filter.json")))
    return report, FilterCounts.merge(parts)
