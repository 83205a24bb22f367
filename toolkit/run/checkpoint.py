"""Crash-safe checkpoints around `engine.save_checkpoint` / `engine.load_checkpoint`.

A checkpoint is `CKPT_DIR/stepNNNNNNNN/`: DeepSpeed's own files, one `dstk_rank{r}.pt` per rank (RNG states,
data position), and `dstk_manifest.json`, written last by rank 0, after every rank finished, atomically
(write to a temporary file, fsync, rename). The manifest lists every file with its size and SHA-256. A
directory without a manifest, or whose files no longer match it, is never loaded: loading walks back to the
newest complete checkpoint and says what it skipped. DeepSpeed's own `latest` file is not written (it would
point at a half-written checkpoint after a crash). The directory must be on storage every rank sees.
Loading a checkpoint unpickles it (`torch.load`): only load checkpoints you wrote or trust.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.run.save_errors import (
    Guarded,
    SaveError,
    SaveFailed,
    attempt,
    free_bytes,
    outcome,
    save_checkpoint,
    say,
    state_bytes,
)

MANIFEST = "dstk_manifest.json"
POINTER = "latest_complete"


@dataclass(frozen=True)
class Resume:
    """Where a resumed run picks up: the checkpoint and the state dstk saved with it."""

    tag: str
    step: int
    position: int
    client_state: dict[str, Any]


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_manifest(tag_dir: Path, info: dict[str, Any], hashes: bool = True) -> None:
    """Without `hashes` the manifest records sizes only (null SHA-256s): for the shared-memory tier, where a
    file is whole once written (a killed writer leaves no manifest) and hashing would take CPU from training."""
    files = {
        str(p.relative_to(tag_dir)): {"bytes": p.stat().st_size, "sha256": _sha256(p) if hashes else None}
        for p in sorted(tag_dir.rglob("*"))
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")
    }
    manifest = {**info, "files": files, "written_at": time.time()}
    _atomic_write(tag_dir / MANIFEST, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())


def check(tag_dir: Path, verify_hashes: bool = True) -> str | None:
    """Why `tag_dir` is not a complete checkpoint, or None when it is."""
    path = tag_dir / MANIFEST
    if not path.is_file():
        return "no manifest (the save did not finish)"
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"unreadable manifest ({exc.__class__.__name__})"
    for name, meta in files.items():
        f = tag_dir / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta['bytes']}"
        if verify_hashes and meta["sha256"] is not None and _sha256(f) != meta["sha256"]:
            return f"{name} does not match its SHA-256"
    return None


def complete_tags(ckpt_dir: Path, log: Any = None, verify_hashes: bool = True) -> list[str]:
    """Complete checkpoint tags, newest first; incomplete ones are reported through `log`. Without
    `verify_hashes` only sizes are compared (a pre-flight look, not the check before loading)."""
    if not ckpt_dir.is_dir():
        return []
    out = []
    for tag_dir in sorted(
        (p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("step")), reverse=True
    ):
        problem = check(tag_dir, verify_hashes)
        if problem is None:
            out.append(tag_dir.name)
        elif log is not None:
            log(f"checkpoint {tag_dir}: skipped, {problem}")
    return out


def memory_tier(ckpt_dir: Path) -> Path:
    """Where the shared-memory snapshots of checkpoint directory `ckpt_dir` live on this node: /dev/shm, named
    after the directory, so a restarted job finds them. They survive a rank's crash, not the node's."""
    import hashlib as _h

    key = _h.sha1(str(Path(ckpt_dir).resolve()).encode()).hexdigest()[:12]
    return Path("/dev/shm") / f"dstk-{os.getuid()}-{key}"


def newest_complete(ckpt_dir: Path, log: Any = None, verify_hashes: bool = True) -> list[tuple[Path, str]]:
    """Complete checkpoints of both tiers, newest first, as (directory, tag); at the same step the persisted
    one comes first."""
    found = [(Path(ckpt_dir), t) for t in complete_tags(Path(ckpt_dir), log, verify_hashes)]
    found += [(memory_tier(ckpt_dir), t) for t in complete_tags(memory_tier(ckpt_dir), log, verify_hashes)]
    return sorted(found, key=lambda d_t: (d_t[1], d_t[0] == Path(ckpt_dir)), reverse=True)


def prune(ckpt_dir: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop older ones and incomplete leftovers older than them."""
    tags = complete_tags(ckpt_dir)
    if keep <= 0 or not tags:
        return
    keep_set = set(tags[:keep])
    oldest_kept = min(keep_set)
    for tag_dir in ckpt_dir.iterdir():
        old = tag_dir.name not in keep_set and (tag_dir.name < oldest_kept or tag_dir.name in tags)
        if tag_dir.is_dir() and tag_dir.name.startswith("step") and old:
            shutil.rmtree(tag_dir, ignore_errors=True)


class Checkpointer:
    """Save and restore a DeepSpeed engine together with dstk's training position.

    `asynchronous`: `save` returns once the state is copied to host memory; a writer thread persists it and
    rank 0's writer commits the manifest when every rank's files are durable (toolkit.run.async_ckpt).
    `pipelined` (asynchronous only): `save` copies nothing; the writer reads the live tensors before the next
    optimizer step, which waits for it if it must. `stalls` records the seconds each save held the training
    thread (a pipelined save's wait at the next optimizer step included), `waits` those spent waiting for
    the previous save to persist first, `held` the seconds from each pipelined save's hand-over to the next
    optimizer update it let through — never less than the writer took to read the live state, whatever the
    timing of the forward and backward between them, which is why tests check it rather than the stall."""

    def __init__(
        self,
        ckpt_dir: Path,
        rank: int,
        keep: int = 3,
        log: Any = print,
        asynchronous: bool = False,
        pipelined: bool = False,
        hashes: bool = True,
    ) -> None:
        self.dir, self.rank, self.keep, self.log = Path(ckpt_dir), rank, keep, log
        self.asynchronous, self.pipelined, self.hashes = asynchronous, pipelined, hashes
        self._released: Any = None
        self._handed = 0.0
        self._hooked: tuple[Any, Any] | None = None
        self.stalls: list[float] = []
        self.pipelined_saves = 0
        self.held: list[float] = []
        self.waits: list[float] = []
        self.persisted_s: list[float] = []
        """Seconds from hand-over to durable of each asynchronous save (of closed writers)."""
        self._persister: Any = None
        self._engine: Any = None
        self.die_persisting_at: int | None = None
        """Test-only: SIGKILL this rank inside the persist of this step's checkpoint."""
        self.slow_s = 0.0
        """Test-only: each pipelined save's writer waits this long before it reads the live state."""
        self.on_error = "stop"
        """`--on-save-error`: after a save that could not be written, "stop" raises SaveFailed on every rank,
        "continue" goes on (toolkit.run.save_errors)."""
        self.errors: list[Any] = []
        """Every save that could not be written (SaveError), agreed by all ranks."""
        self._job: Any = None
        """The asynchronous save handed to the writer and not yet judged (`wait`)."""
        self._closing = False

    def wait(self, stop: bool = True) -> None:
        """Until every save handed to the writer is durable (and committed, on rank 0), and the ranks agree
        whether it was (collective: every rank calls it at the same point)."""
        job, self._job = self._job, None
        if job is None:
            return
        job.written.wait()  # this rank's files are durable, or failed
        failure, needed = outcome(job.failure, job.bytes)
        if failure is not None and self.rank == 0:
            job.abort.set()  # a marker that will never come
        self._persister.wait()
        if failure is None:
            failure, _ = outcome(job.failure, 0)  # rank 0's manifest
        if failure is not None:
            self._judge(job.step, failure, needed, job.free, job.tag_dir, stop)

    def _judge(
        self, step: int, failure: Any, needed: int, free: int | None, tag_dir: Path, stop: bool
    ) -> None:
        """A save every rank agrees could not be written: recorded, said in one line (rank 0), its partial
        files removed (they would hold the space the next save needs), SaveFailed under `stop` (the policy)."""
        error = SaveError(step, *failure, needed, free, "snapshot" if self.pipelined else "checkpoint")
        self.errors.append(error)
        if self.rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)
            newest = complete_tags(self.dir, verify_hashes=False)
            policy = "end" if self._closing else self.on_error
            print(say(error, str(self.dir / newest[0]) if newest else None, policy), flush=True)
        if stop and self.on_error == "stop":
            raise SaveFailed(f"step {step}: {failure[1]}")

    def close(self) -> None:
        self._closing = True
        self.wait(stop=False)  # the last save's outcome is recorded; the run is over either way
        if self._persister is not None:
            self._persister.close()
            self.persisted_s += self._persister.persist_s
            self._persister = None
        if self._hooked is not None:
            self._hooked[1].remove()
            self._hooked = None

    def _before_update(self, *_: Any) -> None:
        """The optimizer's step pre-hook: a pipelined save still reading the live state holds the update."""
        released, self._released = self._released, None
        if released is None:
            return
        if not released.is_set():
            start = time.perf_counter()
            released.wait()
            self.stalls[-1] += time.perf_counter() - start
        self.held.append(time.perf_counter() - self._handed)

    def _gate(self, engine: Any) -> bool:
        """Hook the optimizer's step for pipelined saves; False where a save must copy instead."""
        from toolkit.run.async_ckpt import base_optimizer

        opt = base_optimizer(engine)
        if opt is None:
            return False
        if self._hooked is None or self._hooked[0] is not opt:
            if self._hooked is not None:
                self._hooked[1].remove()
            self._hooked = (opt, opt.register_step_pre_hook(self._before_update))
        return True

    def _commit(self, tag_dir: Path, info: dict[str, Any]) -> None:
        write_manifest(tag_dir, info, self.hashes)
        _atomic_write(self.dir / POINTER, (tag_dir.name + "\n").encode())
        prune(self.dir, self.keep)

    def save(
        self,
        engine: Any,
        step: int,
        position: int,
        extra: dict[str, Any],
        rank_state: dict[str, Any],
        fault_after_first_shard: bool = False,
    ) -> Path:
        import torch
        import torch.distributed as dist

        start = time.perf_counter()
        if self._job is not None:
            busy = self._persister.busy
            self.wait()  # at most one save in flight; the previous one judged before this one starts
            if busy:
                self.waits.append(time.perf_counter() - start)
                self.log(
                    f"checkpoint step {step}: waited {self.waits[-1]:.2f} s for the previous save to persist"
                )
        tag = tag_for(step)
        tag_dir = self.dir / tag
        if self.rank == 0 and tag_dir.exists():
            shutil.rmtree(tag_dir)  # a leftover from a crashed attempt at this very step
        free = free_bytes(self.dir) if self.rank == 0 else None
        dist.barrier()
        client_state = {"dstk": {"step": step, "position": position, **extra}}
        info = {"tag": tag, "step": step, "position": position, "world_size": dist.get_world_size(), **extra}
        if self.asynchronous:
            if fault_after_first_shard:  # test-only: the asynchronous save dies inside its persist instead
                self.die_persisting_at = step
            self._save_async(engine, tag_dir, client_state, rank_state, info)
            self._job.free = free
            self.stalls.append(time.perf_counter() - start)
            return tag_dir
        guarded = Guarded(engine.checkpoint_engine)  # every file's write fails without raising
        escaped = save_checkpoint(engine, self.dir, tag, client_state, guarded)
        if fault_after_first_shard:  # test-only: die as if the node failed mid-save
            os._exit(17)
        rank_file = tag_dir / f"dstk_rank{self.rank}.pt"
        tmp = rank_file.with_name(f".{rank_file.name}.tmp")
        mine = (guarded.failure or escaped) or attempt(
            lambda: (torch.save(rank_state, tmp), tmp.replace(rank_file)), rank_file
        )  # not into a folder that may not exist
        failure, needed = outcome(mine, guarded.bytes + state_bytes(rank_state))
        if failure is None:  # the manifest last, once every rank's files are written
            committed = (
                attempt(lambda: self._commit(tag_dir, info), tag_dir / MANIFEST) if self.rank == 0 else None
            )
            failure, _ = outcome(committed, 0)
        self.stalls.append(time.perf_counter() - start)
        if failure is not None:
            self._judge(step, failure, needed, free, tag_dir, stop=True)
        return tag_dir

    def _save_async(
        self,
        engine: Any,
        tag_dir: Path,
        client_state: dict[str, Any],
        rank_state: dict[str, Any],
        info: dict[str, Any],
    ) -> None:
        import torch.distributed as dist

        from toolkit.run.async_ckpt import (
            Persister,
            PersistJob,
            hold,
            snapshot,
            snapshot_engine,
            stream_marker,
            to_host,
        )

        if self._persister is None:
            self._persister = Persister(self.log)
        if self._engine is None:
            self._engine = snapshot_engine()
        pipelined = self.pipelined and self._gate(engine)
        self.pipelined_saves += pipelined
        self._engine.pipelined = pipelined
        self._engine.pool.start()
        # DeepSpeed writes through engine.checkpoint_engine: this save only, into host memory
        failed = save_checkpoint(engine, self.dir, tag_dir.name, client_state, self._engine)
        files = self._engine.take()
        own = hold(rank_state) if pipelined else snapshot(rank_state, self._engine.pool)
        files.append((tag_dir / f"dstk_rank{self.rank}.pt", own))
        stage, after = None, stream_marker() if pipelined else None
        if after is not None:
            pool = self._engine.pool
            stage = lambda held: to_host(held, pool, after)  # noqa: E731
        self._released = threading.Event() if pipelined else None
        job = PersistJob(
            tag_dir,
            files,
            self.rank,
            dist.get_world_size(),
            complete=(lambda: self._commit(tag_dir, info)) if self.rank == 0 else None,
            die_inside=self.die_persisting_at == info["step"],
            released=self._released,
            slow_s=self.slow_s if pipelined else 0.0,
            stage=stage,
            step=info["step"],
            failure=failed,  # known now: the job writes nothing, the ranks agree on it before the next save
        )
        job.bytes = sum(state_bytes(obj) for _, obj in files)
        self._handed = time.perf_counter()  # before the writer can start: `held` never undercounts
        self._persister.submit(job)
        self._job = job

    def load(self, engine: Any, tag: str, load_optimizer_states: bool = True) -> Resume:
        import torch

        self.wait(stop=False)  # a rollback may return to a checkpoint still persisting

        path, client_state = engine.load_checkpoint(
            str(self.dir), tag=tag, load_optimizer_states=load_optimizer_states, load_lr_scheduler_states=True
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {self.dir / tag}")
        state = (client_state or {}).get("dstk", {})
        if "step" not in state:  # a universal checkpoint keeps no client state: the manifest has it
            state = {**json.loads((self.dir / tag / MANIFEST).read_text()), **state}
        rank_file = self.dir / tag / f"dstk_rank{self.rank}.pt"
        rank_state = torch.load(rank_file, weights_only=False) if rank_file.is_file() else {}
        return Resume(
            tag=tag,
            step=int(state.get("step", 0)),
            position=int(state.get("position", 0)),
            client_state={**state, "rank_state": rank_state},
        )
