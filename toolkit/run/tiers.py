"""Two checkpoint tiers behind the Checkpointer interface the training loop uses.

The disk tier is the checkpoint directory (synchronous or asynchronous saves); the memory tier, when asked
for (`dstk train --snapshot-every K`), keeps frequent asynchronous snapshots in /dev/shm on the node
(`checkpoint.memory_tier`), which survive a rank's crash but not the node's (Gemini, SOSP '23, keeps them in
peers' CPU memory for that; dstk's memory tier is node-local, so it is for single-node jobs). A resume takes
the newest complete checkpoint of either tier and says which.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from toolkit.run.checkpoint import (
    MANIFEST,
    Checkpointer,
    Resume,
    complete_tags,
    memory_tier,
    newest_complete,
)


class Tiers:
    """The disk tier, optionally the memory tier; what `Trainer` calls `ckpt`."""

    def __init__(
        self,
        ckpt_dir: Path,
        rank: int,
        keep: int = 3,
        asynchronous: bool = False,
        snapshot_every: int = 0,
        log: Any = print,
    ) -> None:
        self.disk = Checkpointer(ckpt_dir, rank, keep, log, asynchronous)
        # always there to load from (an earlier attempt's snapshots are the newest state even if this one
        # takes none); written only with snapshot_every
        # pipelined: the snapshot is written straight from the live state before the next optimizer step;
        # one kept (two in /dev/shm while the next is written); sizes suffice to tell a whole one in RAM
        self.memory = Checkpointer(
            memory_tier(ckpt_dir), rank, 1, log, asynchronous=True, pipelined=True, hashes=False
        )
        self.snapshot_every, self.rank, self.log = snapshot_every, rank, log
        self._disk_steps: set[int] = set()
        self.dir = self.disk.dir
        self.crash: tuple[int, str] | None = None
        """Test-only: (step, "persist" | "after-snapshot"): SIGKILL this rank inside the disk persist of that
        step's checkpoint, or right after that step's memory snapshot is complete."""

    def snapshot_due(self, step: int, last: int) -> bool:
        """Whether `step` takes a shared-memory snapshot: not the last one, which goes to disk anyway."""
        return bool(self.snapshot_every and step % self.snapshot_every == 0 and step < last)

    def save(
        self,
        engine: Any,
        step: int,
        position: int,
        extra: dict[str, Any],
        rank_state: dict[str, Any],
        fault_after_first_shard: bool = False,
        tier: str = "disk",
    ) -> Path:
        crash_step, crash_kind = self.crash or (None, None)
        if tier == "memory":
            path = self.memory.save(engine, step, position, extra, rank_state)
            if crash_step == step and crash_kind == "after-snapshot":
                _die_once_complete(path)
            return path
        self.disk.die_persisting_at = step if crash_step == step and crash_kind == "persist" else None
        path = self.disk.save(engine, step, position, extra, rank_state, fault_after_first_shard)
        self._disk_steps.add(step)
        return path

    def on_disk(self, step: int) -> bool:
        """Whether this run saved (or resumed from) `step` in the disk tier: a snapshot in memory alone does
        not survive the node, so a stop or the end still writes one."""
        return step in self._disk_steps

    def latest(self) -> str | None:
        """The newest complete tag of either tier, agreed by all ranks (rank 0 decides)."""
        import torch.distributed as dist

        box = [None]
        if self.rank == 0:
            found = newest_complete(self.dir, self.log)
            box = [found[0][1] if found else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def where(self, tag: str) -> Path:
        """The directory holding complete checkpoint `tag`: the disk tier's unless only the memory tier has it."""
        memory_only = tag not in complete_tags(self.dir, verify_hashes=False)
        if memory_only and tag in complete_tags(self.memory.dir, verify_hashes=False):
            return self.memory.dir
        return self.dir

    def load(self, engine: Any, tag: str, load_optimizer_states: bool = True) -> Resume:
        self.wait()
        source = self.disk if self.where(tag) == self.dir else self.memory
        resumed = source.load(engine, tag, load_optimizer_states)
        if source is self.disk:
            self._disk_steps.add(resumed.step)
        return resumed

    def describe(self, tag: str) -> str:
        """Where a resume came from, for its one line."""
        where = self.where(tag)
        if where == self.dir:
            return str(where / tag)
        disk = complete_tags(self.dir, verify_hashes=False)
        since = f"; newest disk checkpoint: {disk[0]}" if disk else "; no disk checkpoint yet"
        return f"the shared-memory snapshot {where / tag}{since}"

    def wait(self) -> None:
        self.disk.wait()
        self.memory.wait()

    def on_save_error(self, policy: str) -> None:
        """`--on-save-error` for both tiers (toolkit.run.save_errors)."""
        self.disk.on_error = self.memory.on_error = policy

    @property
    def errors(self) -> list[Any]:
        """Every save of either tier that could not be written, in step order."""
        return sorted(self.disk.errors + self.memory.errors, key=lambda e: e.step)

    def report(self) -> dict[str, Any]:
        """What the saves cost this rank: seconds each held training (stall), waited for the previous save
        to persist, and took to become durable in the background; how many were pipelined and how long each
        of those held the next update — per tier."""

        def tier(c: Checkpointer) -> dict[str, Any]:
            return {
                "stall_s": c.stalls,
                "wait_s": c.waits,
                "persist_s": c.persisted_s,
                "pipelined_saves": c.pipelined_saves,
                "held_s": c.held,
            }

        return {
            "asynchronous": self.disk.asynchronous,
            "snapshot_every": self.snapshot_every,
            "disk": tier(self.disk),
            "memory": tier(self.memory),
        }

    def close(self, finished: bool) -> None:
        """Persist everything handed over; after a finished run (its final state durable on disk), drop the
        memory tier, which holds nothing newer and would keep its RAM."""
        import torch.distributed as dist

        self.disk.close()
        self.memory.close()
        if finished and not self.disk.errors:  # a save that failed: the snapshots may be the newest state
            dist.barrier()  # every rank's snapshot writes are over
            if self.rank == 0:
                shutil.rmtree(self.memory.dir, ignore_errors=True)


def _die_once_complete(tag_dir: Path) -> None:
    """Test-only: wait until the snapshot is complete (rank 0 wrote its manifest after every rank's files were
    durable), then SIGKILL this rank, before any later save."""
    import signal
    import time

    while not (tag_dir / MANIFEST).exists():
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)
