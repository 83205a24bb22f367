"""The input cut into the shards the tasks read: contiguous runs of pieces (toolkit.data.formats), in input
order, of about equal bytes.

Shard r holds the r-th slice of the input as one sequence (files in order, each in file order), so putting
the shards' survivors back in rank order gives the documents in input order whatever the number of shards.
Every global decision downstream (which copy of a duplicate is kept, the tokenizer's sample, the mixture, the
split and the shuffle) is taken in that order, which is why the output does not depend on how many tasks,
workers or nodes did the work.

Cut points: with total weight W and T shards, shard k starts at k·W/T. A plain file is cut at any byte (its
lines go to the shard where they start), an Arrow file at any row, a Parquet file between row groups, and a
compressed file not at all; a piece that cannot be cut belongs to the shard where it starts, so a shard may be
empty (one large .jsonl.gz is read by one task: cut such inputs into files).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

from toolkit.data.formats import Piece, Source, source_of, units

TASK_BYTES = 64e6
"""Largest shard on one machine by default: a killed run redoes at most this much per task."""
SLURM_TASK_BYTES = 256e6
"""Default shard of a SLURM array element (each one pays a job start)."""
MIN_TASK_BYTES = 1e6
"""Smallest shard the default cuts: a small input is one task in this process, with no workers to start."""
TASKS_PER_WORKER = 4
"""Default shards per worker beyond one: a worker that drew cheap shards takes another, so none idles long."""


def default_tasks(total_bytes: float, workers: int, executor: str) -> int:
    """How many shards to cut `total_bytes` into for `workers` (local) or SLURM array elements."""
    if executor == "slurm":
        return max(1, math.ceil(total_bytes / SLURM_TASK_BYTES))
    per_worker = max(1 if workers == 1 else TASKS_PER_WORKER, math.ceil(total_bytes / (workers * TASK_BYTES)))
    return max(1, min(workers * per_worker, math.ceil(total_bytes / MIN_TASK_BYTES)))


def whole_file(source: Source) -> Piece:
    n, _ = units(source)
    return Piece(source, 0, n, float(Path(source.path).stat().st_size))


def plan(files: list[Path], tasks: int) -> list[list[Piece]]:
    """The pieces of each of `tasks` shards (some may be empty), in input order."""
    layouts = [(source_of(f), *units(source_of(f))) for f in files]
    total = sum(_size(n, w) for _, n, w in layouts) or 1.0
    shards: list[list[Piece]] = [[] for _ in range(tasks)]

    def task_at(offset: float) -> int:
        return min(tasks - 1, max(0, int(offset * tasks // total)))

    offset = 0.0
    for source, n, weights in layouts:
        if n == 0:  # an empty file: one empty piece, so that a task reports it
            shards[task_at(offset)].append(Piece(source, 0, 0, 0.0))
            continue
        if len(weights) == 1:  # every position weighs the same: cut exactly at the shard starts
            w = weights[0]
            first, last = task_at(offset), task_at(offset + (n - 1) * w)
            cuts = [0, *(_cut(k * total / tasks, offset, w, n) for k in range(first + 1, last + 1)), n]
            for k, (a, b) in enumerate(itertools.pairwise(cuts)):
                if a < b:
                    shards[first + k].append(Piece(source, a, b, (b - a) * w))
        else:  # row groups: each whole, in the shard where it starts
            start, weight, task, before = 0, 0.0, task_at(offset), 0.0
            for i, w in enumerate(weights):
                here = task_at(offset + before)
                if here != task and i > start:
                    shards[task].append(Piece(source, start, i, weight))
                    start, weight = i, 0.0
                task, weight, before = here, weight + w, before + w
            shards[task].append(Piece(source, start, n, weight))
        offset += _size(n, weights)
    return shards


def _size(n: int, weights: list[float]) -> float:
    return n * weights[0] if len(weights) == 1 else sum(weights)


def _cut(boundary: float, offset: float, w: float, n: int) -> int:
    return min(n, max(0, math.ceil((boundary - offset) / w - 1e-9)))


def to_json(shards: list[list[Piece]]) -> list[list[dict[str, Any]]]:
    return [
        [
            {"path": p.source.path, "kind": p.source.kind, "json": p.source.json, "domain": p.source.domain,
             "start": p.start, "end": p.end, "weight": p.weight}
            for p in shard
        ]
        for shard in shards
    ]  # fmt: skip


def from_json(data: list[dict[str, Any]]) -> list[Piece]:
    """One shard's pieces back from `to_json`."""
    return [
        Piece(Source(d["path"], d["kind"], d["json"], d["domain"]), d["start"], d["end"], d["weight"])
        for d in data
    ]
