"""Heartbeats: every rank's progress in a small file the launcher reads, and the launcher's verdict on a hang
(pure: standard library only; the ranks' writer is toolkit/run/heartbeat.py).

Why: a rank that stops (a GPU that falls off the bus, a process frozen by the kernel or by SIGSTOP, a
collective that never completes) leaves every other rank waiting in its next collective. Nothing fails, so
DeepSpeed's launcher waits for ever, or until torch's collective timeout (30 min by default, after which
every rank's traceback names a collective, not the rank that stopped). So each rank writes
`RUN_DIR/heartbeat/rank{R}.json` (the train run directory, on storage every node sees, as checkpoints need)
from a thread, once a second: its step, the phase the training thread is in (a plain attribute it sets:
host work only) and two counters. `progress` changes with every phase the training thread enters; `beat`
changes with every write. A rank blocked in a collective keeps beating (torch releases the GIL while it
waits) but makes no progress; a frozen or dead process stops beating.

`HangWatch` is the launcher's side: fed the files once a second, it declares a hang when no rank has made
progress for the timeout (longer inside a checkpoint save or an evaluation; not before every rank has
finished its set-up), or when a rank has been silent for the timeout in any phase, and names the rank(s)
and node(s) that stopped and what they were doing.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = "heartbeat"
BEAT_S = 1.0
"""Seconds between two writes of a rank's file."""
SLOW_PHASE_FACTOR = 10
"""Inside a checkpoint save or a resume's load, no progress is a hang only after this many timeouts: one
large file write is one phase."""
HANG_STEPS = 10
"""Default hang timeout: this many predicted steps (`dstk launch --hang-timeout` overrides it)..."""
HANG_FLOOR_S = 300.0
"""...but never less: a first step pays JIT compilation and allocator warm-up, an evaluation or a slow
collective at scale takes minutes, and a false alarm kills a healthy job."""


def default_hang_timeout(step_s: float | None) -> float:
    """HANG_STEPS predicted steps, at least HANG_FLOOR_S (the floor when there is no prediction)."""
    return max(HANG_FLOOR_S, HANG_STEPS * step_s) if step_s else HANG_FLOOR_S


def hang_timeout(flag: float | None, cluster: Any, train: Any) -> float:
    """`--hang-timeout`, else the default for the step the cost model predicts for dstk train's layout
    (`train`: its checked TrainRun; None for a script: the floor)."""
    if flag is not None:
        return flag
    step_s = None
    if train is not None:
        from toolkit.integrations.ds_layout import layout_from_config
        from toolkit.plan.cost.estimate import estimate

        try:
            layout = layout_from_config(train.config, cluster.world_size)
            step_s = estimate(train.model, train.cluster or cluster, layout).time.total_s
        except Exception:  # a layout the cost model does not price: the floor, not a failed launch
            step_s = None
    return default_hang_timeout(step_s)


PHASES = (
    "setup", "load", "data", "forward", "backward", "optimizer", "record", "log", "eval", "save", "end", "done"
)  # fmt: skip
"""What the training thread can be doing, roughly in the order a run goes through them: `setup` until the
first step, `end` after the last (final save, summary), `done` once the rank's work is over."""
SLOW_PHASES = ("save", "load", "end")
"""Phases with SLOW_PHASE_FACTOR timeouts."""


def heartbeat_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR


def rank_file(directory: Path, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"


@dataclass(frozen=True)
class Beat:
    """One rank's file."""

    rank: int
    node: int
    host: str
    pid: int
    step: int
    phase: str
    progress: int
    """Phases entered since the rank started: changes whenever the training thread moves on."""
    beat: int
    """Writes since the rank started: changes every BEAT_S while the process runs."""


def read_beats(directory: Path) -> dict[int, Beat]:
    """Every rank file that parses (a file is replaced atomically; a missing or foreign one is skipped)."""
    out: dict[int, Beat] = {}
    if not Path(directory).is_dir():
        return out
    for path in Path(directory).glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(path.read_text())
            beat = Beat(**{k: data[k] for k in Beat.__dataclass_fields__})
            out[beat.rank] = beat
    return out


def clear(directory: Path) -> None:
    """Remove the rank files of an earlier attempt (its ranks are gone; a new attempt writes its own)."""
    for path in Path(directory).glob("rank*.json") if Path(directory).is_dir() else ():
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass
class _Seen:
    beat: Beat
    beat_at: float
    """When (launcher clock) this rank's `beat` last changed."""
    progress_at: float
    """When this rank's (step, progress) last changed."""


@dataclass
class HangWatch:
    """The launcher's verdict, fed every rank's file about once a second (`observe`)."""

    timeout_s: float
    world_size: int
    hostnames: list[str] | None = None
    """Node index -> name (the cluster's hostnames), for the report; else the host a rank reported."""
    seen: dict[int, _Seen] = field(default_factory=dict)
    last_progress: float | None = None

    def observe(self, beats: dict[int, Beat], now: float) -> str | None:
        """The report of a hang (one line), or None while the job is fine."""
        for rank, b in beats.items():
            old = self.seen.get(rank)
            if old is None:
                self.seen[rank] = _Seen(b, now, now)
                self.last_progress = now
                continue
            moved = (b.step, b.progress) != (old.beat.step, old.beat.progress)
            self.seen[rank] = _Seen(
                b, now if b.beat != old.beat.beat or moved else old.beat_at, now if moved else old.progress_at
            )
            if moved:
                self.last_progress = now
        live = {r: s for r, s in self.seen.items() if s.beat.phase != "done"}
        silent = {r: now - s.beat_at for r, s in live.items() if now - s.beat_at >= self.timeout_s}
        if silent:
            return self._report(now, silent)
        started = len(self.seen) >= self.world_size and all(
            s.beat.phase != "setup" for s in self.seen.values()
        )
        if not started or not live or self.last_progress is None:
            return None
        slow = any(s.beat.phase in SLOW_PHASES for s in live.values())
        allowed = self.timeout_s * (SLOW_PHASE_FACTOR if slow else 1)
        if now - self.last_progress >= allowed:
            return self._report(now, {})
        return None

    def _where(self, b: Beat) -> str:
        node = self.hostnames[b.node] if self.hostnames and b.node < len(self.hostnames) else b.host
        return f"rank {b.rank} on {node} (node {b.node}, pid {b.pid})"

    def _report(self, now: float, silent: dict[int, float]) -> str:
        idle = now - (self.last_progress or now)
        head = f"no rank advanced for {idle:.1f} s (hang timeout {self.timeout_s:g} s)"
        beats = sorted((s.beat for s in self.seen.values() if s.beat.phase != "done"), key=lambda b: b.rank)
        if silent:
            stopped = [
                f"{self._where(b)} went silent: no heartbeat for {silent[b.rank]:.1f} s, the last at step "
                f"{b.step} ({b.phase})"
                for b in beats
                if b.rank in silent
            ]
            waiting = [b for b in beats if b.rank not in silent]
        else:
            order = {p: i for i, p in enumerate(PHASES)}
            behind = min((b.step, order.get(b.phase, 0)) for b in beats)
            late = [b for b in beats if (b.step, order.get(b.phase, 0)) == behind]
            waiting = [b for b in beats if b not in late]
            what = (
                "alive but stuck"
                if waiting
                else "alive, all stuck in the same place (a collective that never completes?)"
            )
            stopped = [f"{self._where(b)} {what} at step {b.step} ({b.phase})" for b in late]
        tail = ""
        if waiting:
            places = sorted({f"step {b.step} ({b.phase})" for b in waiting})
            tail = f"; {_ranks(waiting)} wait at {', '.join(places)}"
        return f"{head}: {'; '.join(stopped)}{tail}"


def _ranks(beats: list[Beat]) -> str:
    ranks = [b.rank for b in beats]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
