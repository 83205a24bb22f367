"""A folder belongs to one job: an advisory lock file in it, naming its holder (pure: the standard library).

Two jobs writing one run or checkpoint folder interleave `metrics.jsonl` rows and write the same checkpoint
tags over each other, and nothing fails: so every verb that writes into a folder the user may own takes
`FOLDER/.dstk-lock` first. The lock is the kernel's (`flock`), so it ends with its holder however that ends
(SIGKILL, a lost node's process): a lock file whose lock nobody holds is stale, and the next job takes it over
and says whose it was. The file records the holder's host, pid, start time and command, which is what the
refusal names. On a shared filesystem flock reaches other hosts where the filesystem supports it (NFSv4,
Lustre with `flock` mounted); where it does not, only jobs on the same host see each other.

`dstk launch` holds the locks of the job's folders for the whole job and gives its ranks a token
(`DSTK_LOCK_TOKEN`); a rank that finds its folder held under that token is that job. A rank started without a
launcher that holds them (srun in a SLURM script, a bare `deepspeed` command) takes them itself.

The same mechanism reserves a rendezvous port between dstk launches on one host (`reserve_port`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError

LOCK_NAME = ".dstk-lock"
TOKEN_ENV = "DSTK_LOCK_TOKEN"
"""The launching job's token, which its ranks inherit: a folder held under it is this job's."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) a lock, as its file records."""

    host: str
    pid: int
    since: float
    command: str
    token: str = ""

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} since {when} ({self.command[:120]})"


def _read(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        data = json.loads(raw.decode("utf-8"))
        return Holder(str(data["host"]), int(data["pid"]), float(data["since"]), str(data["command"]),
                      str(data.get("token", "")))  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None


def _me(token: str) -> Holder:
    command = " ".join(["dstk", *sys.argv[1:]]) if sys.argv else "dstk"
    return Holder(socket.gethostname(), os.getpid(), time.time(), command, token)


@dataclass
class Lock:
    """A held lock file (`fd` open and flock'ed), or the launcher's (`fd` None: its job is ours)."""

    path: Path
    fd: int | None
    stale: Holder | None = None
    """The holder the file named when this lock was taken over (a job that ended without releasing it)."""

    def release(self) -> None:
        """Remove the file, then drop the lock: a job waiting on the old file finds it gone and retries."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = None
        _HELD.discard(self)

    def __hash__(self) -> int:
        return id(self)


_HELD: set[Lock] = set()


def release_all() -> None:
    """Every lock this process holds (at exit, and before `os._exit` ends a rank)."""
    for lock in list(_HELD):
        lock.release()


atexit.register(release_all)


def try_lock(path: Path, token: str = "") -> Lock | Holder:
    """The lock at `path` (created), or the live holder that has it. A holder under `token` (non-empty) is
    this job: a Lock without a file descriptor."""
    while True:
        # held through a read-only descriptor (flock needs no more): a file open for writing would keep its
        # filesystem from being remounted read-only, which is the job's business, not the lock's
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if holder is not None and token and holder.token == token:
                return Lock(path, None)
            return holder or Holder("?", 0, time.time(), "another dstk job")
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it as we opened it: take the new one
            os.close(fd)
            continue
        previous = _read(fd)
        out = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(out, json.dumps(_me(token).__dict__).encode("utf-8"))
            os.fsync(out)
        finally:
            os.close(out)
        lock = Lock(path, fd, previous)
        _HELD.add(lock)
        return lock


def held_by(path: Path) -> Holder | None:
    """The live holder of the lock file at `path`, or None (no file, or nobody holds it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read(fd) or Holder("?", 0, time.time(), "another dstk job")
    finally:
        os.close(fd)
    return None


def _refusal(flag: str, folder: Path, holder: Holder) -> UserError:
    return UserError(
        f"{flag}: {folder} is in use by another job: {holder.describe()}; wait for it to end or stop it, "
        f"or give another {flag} (a folder belongs to one job at a time)"
    )


def lock_folder(folder: Path, flag: str, token: str = "") -> Lock:
    """`folder` (created) for this job, or a UserError naming the job that has it, at once."""
    from toolkit.paths import output_dir

    output_dir(folder, flag)  # a file in the way, no permission: one line naming the flag
    folder.mkdir(parents=True, exist_ok=True)
    got = try_lock(folder / LOCK_NAME, token)
    if isinstance(got, Holder):
        raise _refusal(flag, folder, got)
    return got


def check_folder(folder: Path, flag: str, token: str = "") -> None:
    """Refuse, as `lock_folder` would, a folder another job holds now; take nothing (a dry run, a script that
    runs later)."""
    holder = held_by(folder / LOCK_NAME)
    if holder is not None and not (token and holder.token == token):
        raise _refusal(flag, folder, holder)


def stale_note(flag: str, lock: Lock) -> str | None:
    """A sentence when `lock` was taken over from a job that ended without releasing it."""
    if lock.stale is None or lock.stale.token == os.environ.get(TOKEN_ENV, "\0"):
        return None
    return (
        f"{flag}: took over {lock.path.parent}'s lock from a job that is gone ({lock.stale.describe()}); "
        "check that it did not leave half-written files"
    )


def ports_dir() -> Path:
    """Where dstk launches on this host reserve their rendezvous ports (one lock file per port, per user)."""
    path = Path(tempfile.gettempdir()) / f"dstk-ports-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def reserve_port(port: int, token: str = "") -> Lock | str:
    """`port` for this job: its lock file held (no other dstk launch on this host can take it until the job
    ends) and nothing bound to it now; else why not. The lock comes first, so two launches starting at the
    same moment cannot both see the port free before either rank binds it."""
    got = try_lock(ports_dir() / f"{port}.lock", token)
    if isinstance(got, Holder):
        return f"another dstk job holds it ({got.describe()})"
    if not _bindable(port):
        got.release()
        return "another program is bound to it"
    return got


def free_port_reserved(token: str = "", tries: int = 20) -> tuple[int, Lock]:
    """A port the OS says is free, reserved as `reserve_port` does."""
    for _ in range(tries):
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        got = reserve_port(port, token)
        if isinstance(got, Lock):
            return port, got
    raise OSError("no free port found for the rendezvous")


def claim_folder(folder: Path, flag: str, overwrite: bool, what: str, own: tuple[str, ...] = ()) -> Lock:
    """A folder a verb fills (data generate/prepare, export, grow, checkpoint convert): refused while another
    job holds it, and refused when it already holds anything (`own`: names this verb may find there, e.g. its
    own unfinished work) unless `overwrite` — then locked for this process. Nothing the user has is replaced
    without the flag that says so."""
    from toolkit.paths import output_dir

    output_dir(folder, flag)
    check_folder(folder, flag)
    found = (
        sorted(p.name for p in folder.iterdir() if p.name not in (LOCK_NAME, *own)) if folder.is_dir() else []
    )
    if found and not overwrite:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise UserError(
            f"{flag}: {folder} already holds files ({shown}); give an empty or new folder, or --overwrite to "
            f"write {what} over them"
        )
    return lock_folder(folder, flag)
