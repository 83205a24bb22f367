"""The training data loader: deterministic given the seed, sharded by data-parallel rank, resumable, prefetching.

Every optimizer step consumes the next `global_batch` rows of the epoch's permutation (seeded by seed + epoch);
data-parallel rank r takes its contiguous share of them, cut into micro-batches. The data a step sees is
therefore independent of how many ranks share it, so a run resumed on another world size (with the global
batch held constant) continues with exactly the same samples. The position is one integer — rows consumed —
saved in every checkpoint. A background thread prepares the next micro-batches while the model computes.

Two row formats (see `dstk data prepare`): packed rows of exactly `seq_length` tokens (:class:`PackedData`),
and one document (or a `seq_length` piece of a longer one) per row (:class:`VariableData`), padded within each
micro-batch. :class:`DynamicLoader` adds token-budget batching and the sequence-length curriculum
(:mod:`toolkit.data.dynamic`).

Padding is on the right, with label -100, and no attention mask is passed: in a causal decoder a real position
attends only to earlier positions, which are all real, so right padding cannot change its output, and the
loss skips label -100 (tests/test_dynamic_batching.py checks the loss of a padded micro-batch against the
sequences one by one). A mask would only move attention off the fused causal kernel. Absolute positions start
at 0 in every row either way.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.data.dynamic import Batching, StepPlan, Stream, plan_step


@dataclass(frozen=True)
class Batch:
    input_ids: Any
    labels: Any
    n_tokens: int


class PackedData:
    """Rows of a `dstk data prepare` split, with the epoch-permuted global order."""

    def __init__(self, path: Path, seed: int) -> None:
        import datasets

        ds = datasets.load_from_disk(str(path)).with_format("numpy")
        self.input_ids = np.asarray(ds["input_ids"], dtype=np.int64)
        self.n_tokens = np.asarray(ds["n_tokens"], dtype=np.int64)
        self.rows = len(self.n_tokens)
        self.seed = seed

    @property
    def seq_length(self) -> int:
        return int(self.input_ids.shape[1])

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(self.rows)

    def batch(self, rows: np.ndarray, length: int | None = None) -> Batch:
        """Rows `rows`, truncated to their first `length` tokens (the curriculum) when given."""
        import torch

        ids = torch.from_numpy(self.input_ids[rows][:, :length])
        labels = ids.clone()
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        labels[positions >= torch.from_numpy(self.n_tokens[rows]).unsqueeze(1)] = -100  # padding
        return Batch(ids, labels, int(np.minimum(self.n_tokens[rows], ids.shape[1]).sum()))


class VariableData:
    """Rows of a split prepared with `--no-pack`: one document (piece) each, of `n_tokens` tokens, kept as one
    flat token array and offsets (4 bytes a token, 8 a row) rather than padded to `seq_length`."""

    def __init__(self, path: Path, seed: int) -> None:
        import datasets

        table = datasets.load_from_disk(str(path)).data.table
        chunks = table.column("input_ids").chunks
        self.tokens = np.concatenate([c.flatten().to_numpy() for c in chunks] or [np.zeros(0, np.int32)])
        self.n_tokens = np.asarray(table.column("n_tokens").to_numpy(), dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.n_tokens)])
        if self.offsets[-1] != len(self.tokens):
            raise ValueError(f"{path}: n_tokens sum to {self.offsets[-1]}, the rows hold {len(self.tokens)}")
        self.rows = len(self.n_tokens)
        self.seed = seed
        manifest = path.parent / "manifest.json"
        meta = json.loads(manifest.read_text()) if manifest.is_file() else {}
        self.pad = int(meta.get("pad_token_id") or 0)
        self._seq_length = int(meta.get("seq_length") or self.n_tokens.max(initial=1))

    @property
    def seq_length(self) -> int:
        return self._seq_length

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(self.rows)

    def batch(self, rows: np.ndarray, length: int | None = None) -> Batch:
        """Rows `rows`, each truncated to `length` tokens when given, right-padded to the longest of them."""
        import torch

        lens = self.n_tokens[rows] if length is None else np.minimum(self.n_tokens[rows], length)
        width = int(lens.max())
        ids = np.full((len(rows), width), self.pad, dtype=np.int64)
        labels = np.full((len(rows), width), -100, dtype=np.int64)
        for i, (row, n) in enumerate(zip(rows.tolist(), lens.tolist(), strict=True)):
            start = self.offsets[row]
            ids[i, :n] = labels[i, :n] = self.tokens[start : start + n]
        return Batch(torch.from_numpy(ids), torch.from_numpy(labels), int(lens.sum()))


TokenRows = PackedData | VariableData


def load_split(path: Path, seed: int) -> TokenRows:
    """The split at `path` in whichever format `dstk data prepare` wrote it (fixed-size rows: packed)."""
    import datasets
    import pyarrow as pa

    kind = datasets.load_from_disk(str(path)).data.table.schema.field("input_ids").type
    return PackedData(path, seed) if pa.types.is_fixed_size_list(kind) else VariableData(path, seed)


def _prefetch(items: Iterator[Any], size: int) -> Iterator[Any]:
    """`items`, produced by a background thread up to `size` ahead. Closing the generator stops the thread and
    waits for it (it notices within 0.1 s, or once the item it is building is done), so no loader thread is
    still inside torch when the process tears down."""
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def fill() -> None:
        for item in items:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return

    thread = threading.Thread(target=fill, daemon=True, name="dstk-prefetch")
    thread.start()
    try:
        while True:
            yield q.get()
    finally:
        stop.set()
        thread.join(timeout=10)


class TrainLoader:
    """Micro-batches for one data-parallel rank, from global position `position` (rows already consumed)."""

    def __init__(
        self,
        data: TokenRows,
        global_batch: int,
        micro_batch: int,
        dp_rank: int,
        dp_size: int,
        position: int = 0,
        prefetch: int = 4,
    ) -> None:
        if global_batch % (micro_batch * dp_size):
            raise ValueError(
                f"global batch {global_batch} is not a multiple of micro {micro_batch} × dp {dp_size}"
            )
        if data.rows < global_batch:
            raise ValueError(f"the data has {data.rows} rows, fewer than one global batch ({global_batch})")
        self.data, self.global_batch, self.micro_batch = data, global_batch, micro_batch
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.position = position
        self._prefetch = prefetch

    @property
    def steps_per_epoch(self) -> int:
        return self.data.rows // self.global_batch

    def _rows_for_step(self, start: int) -> np.ndarray:
        epoch, offset = divmod(start // self.global_batch, self.steps_per_epoch)
        rows = self.data.order(epoch)[offset * self.global_batch : (offset + 1) * self.global_batch]
        share = self.global_batch // self.dp_size
        return rows[self.dp_rank * share : (self.dp_rank + 1) * share]

    def _generate(self, start: int) -> Iterator[list[Batch]]:
        pos = start
        while True:
            mine = self._rows_for_step(pos)
            yield [
                self.data.batch(mine[i : i + self.micro_batch]) for i in range(0, len(mine), self.micro_batch)
            ]
            pos += self.global_batch

    def steps(self) -> Iterator[list[Batch]]:
        """The micro-batches of each successive optimizer step; `position` advances as steps are taken."""
        with contextlib.closing(_prefetch(self._generate(self.position), self._prefetch)) as items:
            for item in items:
                self.position += self.global_batch
                yield item


@dataclass(frozen=True)
class Step:
    """One optimizer step as one rank sees it: its micro-batches, and the global plan's figures."""

    micro_batches: list[Batch]
    plan: StepPlan


class DynamicLoader:
    """Token-budget micro-batches and/or the sequence-length curriculum (:mod:`toolkit.data.dynamic`) for one
    data-parallel rank. The state is two integers, both in every checkpoint: `position` (stream rows consumed)
    and `step` (optimizer steps taken, for the curriculum); the plan of the next step depends on nothing else,
    so a resumed run reads exactly the batches an uninterrupted one would have."""

    def __init__(
        self,
        data: TokenRows,
        batching: Batching,
        dp_rank: int,
        dp_size: int,
        position: int = 0,
        step: int = 0,
        prefetch: int = 4,
    ) -> None:
        if batching.micro_batches % dp_size:
            raise ValueError(
                f"{batching.micro_batches} micro-batches per step do not divide over dp {dp_size}"
            )
        self.data, self.batching = data, batching
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.position, self.step = position, step
        self._stream = Stream(data.rows, data.order)
        self._prefetch = prefetch

    def plan(self, position: int, step: int) -> StepPlan:
        return plan_step(self._stream, self.data.n_tokens, position, step, self.batching)

    def _generate(self, position: int, step: int) -> Iterator[Step]:
        gas = self.batching.gradient_accumulation
        while True:
            plan = self.plan(position, step)
            mine = [self.data.batch(rows, plan.length) for rows in plan.share(self.dp_rank, gas)]
            yield Step(mine, plan)
            position, step = position + plan.rows, step + 1

    def steps(self) -> Iterator[Step]:
        """Each successive optimizer step; `position` and `step` advance as steps are taken."""
        with contextlib.closing(_prefetch(self._generate(self.position, self.step), self._prefetch)) as items:
            for item in items:
                self.position += item.plan.rows
                self.step += 1
                yield item


def eval_batches(
    data: TokenRows, micro_batch: int, dp_rank: int, dp_size: int, max_rows: int
) -> Iterator[Batch]:
    """About `max_rows` validation rows in fixed order, the same number of micro-batches on every rank (ZeRO-3
    gathers parameters in every forward, so every rank must run as many): rounded down to whole rounds of
    micro_batch × dp_size, wrapping around a split smaller than one round."""
    per_round = micro_batch * dp_size
    n = max(per_round, min(max_rows, data.rows) // per_round * per_round)
    rows = np.arange(n) % data.rows
    mine = rows[dp_rank::dp_size]
    for i in range(0, len(mine), micro_batch):
        yield data.batch(mine[i : i + micro_batch])
