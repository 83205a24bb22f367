"""Running the launcher command on this host: the job's process group and its signals, the shared memory and
JIT caches DeepSpeed leaves behind. Standard library only (no torch): `dstk launch` runs it, not the ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def remove_shm_buffers(port: int) -> int:
    """Delete the shared-memory all-reduce buffers the job on `port` left in /dev/shm; how many.

    DeepSpeed's CPU communication op (`shm_comm`, loaded by every torch backend) creates one 66 MB
    `/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>` per rank and never unlinks it
    (`shared_close` is never called). /dev/shm is RAM: jobs on fresh ports fill it until ranks are killed.
    Called once the job's ranks have exited, so nothing maps them any more."""

    removed = 0
    for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed += 1
    return removed


def built_op(op: str, env: dict[str, str]) -> bool:
    """Whether torch's JIT cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) holds `op` already."""
    root = Path(env.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return any(root.glob(f"{op}/{op}.so")) or any(root.glob(f"*/{op}/{op}.so"))


def stale_build_locks(env: dict[str, str], min_age_s: float = 600.0) -> list[Path]:
    """JIT-build lock files of DeepSpeed ops older than `min_age_s`, under TORCH_EXTENSIONS_DIR (or torch's
    default ~/.cache/torch_extensions).

    torch's `FileBaton` makes every process that needs an op wait for its `lock` file to disappear. A build
    that was killed (Ctrl-C, a timeout) leaves the file behind, and every later job that needs the op hangs
    with idle ranks and no message (seen with `cpu_adam` for ZeRO-Offload). No op builds for ten minutes, so
    an older lock is almost surely stale; it is reported, not deleted, since a build may still be running."""
    root = env.get("TORCH_EXTENSIONS_DIR")
    roots = [Path(root)] if root else [Path.home() / ".cache" / "torch_extensions"]
    now = time.time()
    found = []
    for base in roots:
        for lock in (*base.glob("*/lock"), *base.glob("*/*/lock")):
            with contextlib.suppress(OSError):
                if now - lock.stat().st_mtime >= min_age_s:
                    found.append(lock)
    return sorted(found)


STOP_GRACE_S = 90.0
"""How long a stopped job may take to finish its step and write its checkpoint before it is killed (DeepSpeed's
launcher itself SIGKILLs ranks 30 s after it forwards SIGTERM to them)."""


def run_job(
    argv: list[str], env: dict[str, str], watch: Callable[[], str | None] | None = None
) -> tuple[int, int, str | None]:
    """(exit status, signal that stopped it or 0, the watchdog's report or None). The runner and its ranks
    run in their own process group; SIGTERM or SIGINT to `dstk launch` goes to the whole group as SIGTERM
    (the ranks save at the next step boundary, see toolkit/run/stop.py), and whatever is left after STOP_GRACE_S is killed: no
    rank outlives the launch. `watch` is asked once a second; when it reports (a hang, see
    toolkit/launcher/heartbeat.py), the whole group is killed at once: a stopped or stuck rank answers no
    signal but SIGKILL, and the others wait for it."""

    _become_subreaper()  # ranks orphaned by the runner's exit are reparented to us, and reaped below
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    received: list[tuple[int, float]] = []
    report: str | None = None

    def forward(signum: int, frame: object) -> None:
        received.append((signum, time.time()))
        # SIGTERM for both: the ranks stop the same way on either, and DeepSpeed's runner has no SIGINT
        # handler on one node, so Ctrl-C would print its 15-line KeyboardInterrupt traceback
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if received and time.time() - received[0][1] > STOP_GRACE_S:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                if watch is not None and report is None and not received:
                    report = watch()
                    if report is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
        # DeepSpeed's runner exits at once on SIGTERM; its launch.py and the ranks it parents are still saving
        while received and time.time() - received[0][1] < STOP_GRACE_S and _group_alive(proc.pid):
            _reap()
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # a rank the runner left behind
    return code, (received[0][0] if received else 0), report


def _become_subreaper() -> None:
    """Linux's PR_SET_CHILD_SUBREAPER: descendants whose parent dies are reparented to this process instead of
    PID 1 (which, in a container, may never reap them: they would stay zombies and count as alive)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER = 36


def _reap() -> None:

    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _group_alive(pgid: int) -> bool:

    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
