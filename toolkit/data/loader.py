"""The training data loader: deterministic given the seed, sharded by data-parallel rank, resumable, prefetching.

Every optimizer step consumes the next `global_batch` rows of the epoch's permutation (seeded by seed + epoch);
data-parallel rank r takes its contiguous share of them, cut into micro-batches. The data a step sees is
therefore independent of how many ranks share it, so a run resumed on another world size (with the global
batch held constant) continues with exactly the same samples. The position is one integer — rows consumed —
saved in every checkpoint. A background thread prepares the next micro-batches while the model computes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


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

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(self.rows)

    def batch(self, rows: np.ndarray) -> Batch:
        import torch

        ids = torch.from_numpy(self.input_ids[rows])
        labels = ids.clone()
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        labels[positions >= torch.from_numpy(self.n_tokens[rows]).unsqueeze(1)] = -100  # padding
        return Batch(ids, labels, int(self.n_tokens[rows].sum()))


class TrainLoader:
    """Micro-batches for one data-parallel rank, from global position `position` (rows already consumed)."""

    def __init__(
        self,
        data: PackedData,
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
        q: queue.Queue = queue.Queue(maxsize=self._prefetch)
        stop = threading.Event()

        def fill() -> None:
            for item in self._generate(self.position):
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
                item = q.get()
                self.position += self.global_batch
                yield item
        finally:
            stop.set()


def eval_batches(
    data: PackedData, micro_batch: int, dp_rank: int, dp_size: int, max_rows: int
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
