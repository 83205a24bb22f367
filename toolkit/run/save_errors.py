"""A checkpoint that cannot be written: a full disk (ENOSPC), a quota, a read-only or forbidden folder.

What must hold: the previous complete checkpoint stays loadable (a save writes into its own `stepNNNNNNNN/`
and the manifest comes last, toolkit/run/checkpoint.py; a failed one never gets a manifest, and its partial
files are removed so they do not hold the space), the user reads one line naming the path and the bytes the
save needed against those free, and the ranks stay in step. That last part is the hard one: a save is
collective (DeepSpeed's barriers, dstk's manifest after every rank's files), and a rank whose write raised
would leave the others waiting in a barrier it never reaches. So every file DeepSpeed writes goes through
`Guarded`, a checkpoint engine that records a storage error instead of raising it, the save runs its
collectives to the end on every rank, and then the ranks agree on the outcome in one all-gather (`outcome`)
where they met in a barrier before. The asynchronous tier's writer thread records its error the same way;
the ranks agree on it before the next save, or at the end.

Then `--on-save-error` decides, the same on every rank: `stop` ends the run cleanly at that point (exit 1,
the newest complete checkpoint intact), `continue` trains on and tries again at the next save.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG, errno.EIO}
"""What the storage, not the program, is to blame for."""
TORCH_WRITE_FAILURES = (
    "PytorchStreamWriter failed",
    "file write failed",
    "unexpected pos",
    "basic_ios::clear",
)
"""torch.save's zip writer reports a failed write as a RuntimeError without the errno. Which words depends on
where the disk filled: a record's write names the writer ("PytorchStreamWriter failed writing file …"), but
when the last bytes fit the buffer and only the closing flush fails, `write_end_of_file` raises the C++
stream's own exception ("basic_ios::clear: iostream error", seen on CI with a 3 MiB tmpfs)."""


class SaveFailed(Exception):
    """A save failed and `--on-save-error stop` ends the run (raised on every rank alike)."""


@dataclass(frozen=True)
class SaveError:
    step: int
    path: str
    reason: str
    needed_bytes: int
    """What the save writes over all ranks (its tensors' bytes)."""
    free_bytes: int | None
    """Free space on the checkpoint folder's filesystem when the save began."""
    tier: str = "checkpoint"


def is_storage_error(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc) for t in TORCH_WRITE_FAILURES)


def reason(exc: BaseException, folder: Path) -> str:
    """The storage error in words; torch's zip writer loses the errno, so a full filesystem is looked up."""
    import os
    import shutil

    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        if shutil.disk_usage(folder).free < 64 * 1024:
            return os.strerror(errno.ENOSPC)
    except OSError:
        pass
    return str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else type(exc).__name__


def state_bytes(item: Any) -> int:
    """Bytes of the tensors in a state (what torch.save writes, give or take its pickle)."""
    import torch

    if torch.is_tensor(item):
        return item.numel() * item.element_size()
    if isinstance(item, dict):
        return sum(state_bytes(v) for v in item.values())
    if isinstance(item, (list, tuple)):
        return sum(state_bytes(v) for v in item)
    return 0


class Guarded:
    """A checkpoint engine around DeepSpeed's (its documented interface: every file of a save passes through
    `save`) that records the first storage error instead of raising it, and counts the bytes it is asked to
    write. Anything else is delegated."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bytes = 0
        self.failure: tuple[str, str] | None = None
        """(path, reason) of the first write that failed on this rank."""

    def save(self, state_dict: Any, path: str) -> None:
        self.bytes += state_bytes(state_dict)
        if self.failure is not None:
            return  # the disk is full: the rest would fail too, and take time to
        try:
            self.inner.save(state_dict, path)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            self.fail(exc, Path(path))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """DeepSpeed swallows a failed makedirs (and then fails writing into the folder): seen here first."""
        try:
            self.inner.makedirs(path, exist_ok=exist_ok)
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            self.fail(exc, Path(path))

    def fail(self, exc: BaseException, path: Path) -> None:
        if self.failure is None:
            self.failure = (str(path), reason(exc, path.parent))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def save_checkpoint(
    engine: Any, folder: Path, tag: str, client_state: Any, writer: Any
) -> tuple[str, str] | None:
    """`engine.save_checkpoint` through `writer` (a checkpoint engine: `Guarded`, or the asynchronous tier's
    snapshot engine), in step with the other ranks whatever the storage says: DeepSpeed's one write outside
    the checkpoint engine — rank 0's copy of its recovery script — may fail too, and is then returned as
    (path, reason) after this rank joins the closing barrier it skipped."""
    import torch.distributed as dist

    original, engine.checkpoint_engine = engine.checkpoint_engine, writer
    try:
        engine.save_checkpoint(str(folder), tag=tag, client_state=client_state, save_latest=False)
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        dist.barrier()  # save_checkpoint's last, which the other ranks are in
        return str(folder / "zero_to_fp32.py"), reason(exc, folder)
    finally:
        engine.checkpoint_engine = original
    return None


def attempt(write: Callable[[], Any], path: Path) -> tuple[str, str] | None:
    """Run `write`: None when it worked, (path, reason) when the storage refused it; anything else raises."""
    try:
        write()
    except Exception as exc:
        if not is_storage_error(exc):
            raise
        return str(path), reason(exc, path.parent)
    return None


def outcome(failure: tuple[str, str] | None, written: int) -> tuple[tuple[str, str] | None, int]:
    """Every rank's (failure, bytes) → (the first rank's failure or None, the bytes of all ranks): one
    all-gather, on every rank, where the save met in a barrier before."""
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, (failure, written))
    first = next((f for f, _ in parts if f is not None), None)
    return first, sum(n for _, n in parts)


def free_bytes(folder: Path) -> int | None:
    import shutil

    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def say(error: SaveError, newest: str | None, on_error: str) -> str:
    """The one line for the user; `on_error`: the policy ("stop", "continue"), or "end" for the run's last
    save, judged once the run is over."""
    from toolkit.plan.units import format_bytes

    free = format_bytes(error.free_bytes) if error.free_bytes is not None else "unknown"
    kept = (
        f"{newest} is the newest complete checkpoint and loads as before"
        if newest
        else "no complete checkpoint exists yet"
    )
    then = {
        "stop": "stopping the run here (--on-save-error stop)",
        "continue": "training goes on and the next save tries again (--on-save-error continue)",
        "end": "the run is over: its final state is in no complete checkpoint",
    }[on_error]
    what = "snapshot" if error.tier == "snapshot" else "checkpoint"
    return (
        f"{what} step {error.step}: cannot write {error.path} ({error.reason}): the save needs "
        f"{format_bytes(error.needed_bytes)}, {free} was free; {kept}; {then}"
    )
