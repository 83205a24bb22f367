"""Stragglers: the rank that the others keep waiting for, named with how much slower it is.

In synchronous data parallelism every rank leaves a step at the same time (the step ends in collectives), so
each rank's own step time is the job's, the slow rank's included: it cannot show which rank is slow. What
differs is where the time goes. From the end of the previous step, each rank works alone — takes its batch,
does host work, runs its forward — until its first collective of the step, where the early ranks wait for
the last one (toolkit.run.step_sync: `StepRecord.alone`). So a rank's busy time for a step is

    busy_r = period_r − (max_q alone_q − alone_r)

its step period less the wait it had for the slowest rank to arrive; the slow rank's busy time is the whole
period, the others' is shorter by what they waited. `ratio_r = busy_r / median(busy of the other ranks)`
says how much slower rank r works than the others (the median, so one slow rank does not hide behind
another). Per rank the medians of `period` and `alone` over a window of at least WINDOW_STEPS steps (log
windows shorter than that are merged) are what is compared, and the rank must work at least MIN_EXCESS_S a
step longer than the others: one hiccup, or a process descheduled on a busy host, does not make a straggler.

Cost: nothing per step beyond one clock mark (host time on CPU, a device event on CUDA; no wait); at a log
step that closes a window, one all-gather of two numbers per rank. A rank above `ratio` in `windows` windows
in a row is named
once in the log and in `events.jsonl`, and `summary.json` lists every rank named (`stragglers`). The job goes
on at that rank's pace: the report says who to look at (thermal throttling, a noisy neighbour, a slow data
mount), it does not act.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

RATIO = 1.2
"""Default `--straggler-ratio`: a rank whose busy time is 1.2× the others' median is a straggler."""
WINDOWS = 2
"""Windows in a row above the ratio before a rank is named (persistently slower, not a hiccup)."""
WINDOW_STEPS = 5
"""A window holds at least this many timed steps: its medians ignore a few slow steps."""
MIN_EXCESS_S = 0.05
"""...and a straggler works at least this many seconds a step longer than the others' median. Below it is
scheduling noise: the suite's tiny model (50-140 ms steps) on 2 cores shared by 6 ranks showed ratios of 1.2 to
2.6 on healthy ranks in 3 one-step windows in a row. The price: a rank slower by less than 50 ms a step (20 %
of a 250 ms step) goes unnamed."""


def busy_vs_others(periods: list[float], alone: list[float]) -> list[tuple[float, float]]:
    """Per rank, (busy time, the median busy time of the other ranks) (module docstring); pure."""
    latest = max(alone)
    busy = [p - (latest - a) for p, a in zip(periods, alone, strict=True)]
    return [
        (b, statistics.median(busy[:r] + busy[r + 1 :]) if len(busy) > 1 else b) for r, b in enumerate(busy)
    ]


def busy_ratios(periods: list[float], alone: list[float]) -> list[float]:
    """Per rank, busy time over the median busy time of the other ranks; pure."""
    return [b / base if base > 0 else 1.0 for b, base in busy_vs_others(periods, alone)]


@dataclass
class Straggler:
    rank: int
    node: int
    host: str
    ratio: float
    """The newest window's ratio."""
    max_ratio: float
    first_step: int
    """The first step of the first window of its streak."""
    named_at_step: int
    windows: int
    """Windows above the ratio so far."""


@dataclass
class StragglerWatch:
    """Per-step numbers in, a verdict at every log step (`check`, a collective all ranks call together)."""

    ratio: float = RATIO
    windows: int = WINDOWS
    periods: list[float] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    window_start: int = 1
    streak: dict[int, tuple[int, int]] = field(default_factory=dict)
    """rank -> (windows above the ratio in a row, the first step of the streak)."""
    named: dict[int, Straggler] = field(default_factory=dict)
    _places: list[tuple[int, str]] | None = None

    def add(self, step: int, period: float | None, alone: float | None) -> None:
        """A step's record (host numbers)."""
        if not self.periods:
            self.window_start = step
        if period is not None and alone is not None:
            self.periods.append(period)
            self.alone.append(alone)

    def judge(self, step: int, periods: list[float], alone: list[float]) -> list[Straggler]:
        """The verdict on one window's per-rank medians (pure); returns the ranks named by this window."""
        new = []
        for rank, (busy, base) in enumerate(busy_vs_others(periods, alone)):
            ratio = busy / base if base > 0 else 1.0
            if ratio < self.ratio or busy - base < MIN_EXCESS_S:
                self.streak.pop(rank, None)
                continue
            count, since = self.streak.get(rank, (0, self.window_start))
            self.streak[rank] = (count + 1, since)
            known = self.named.get(rank)
            if known is not None:
                known.ratio, known.windows = ratio, known.windows + 1
                known.max_ratio = max(known.max_ratio, ratio)
            elif count + 1 >= self.windows:
                node, host = self._places[rank] if self._places else (0, "")
                self.named[rank] = Straggler(rank, node, host, ratio, ratio, since, step, count + 1)
                new.append(self.named[rank])
        return new

    def check(self, step: int, rt: Any) -> list[Straggler]:
        """At a log step, on every rank: once the window holds WINDOW_STEPS timed steps (the same count on
        every rank: records are read at the same steps), gather each rank's window medians and judge them."""
        import math

        import torch
        import torch.distributed as dist

        if rt.world_size == 1 or len(self.periods) < WINDOW_STEPS:
            return []
        if self._places is None:  # once
            places: list[Any] = [None] * rt.world_size
            dist.all_gather_object(places, (rt.node, rt.host))
            self._places = [tuple(p) for p in places]
        mine = (
            [statistics.median(self.periods), statistics.median(self.alone)]
            if self.periods
            else [math.nan] * 2
        )
        self.periods, self.alone = [], []
        # on the accelerator: NCCL gathers device tensors only; a log step may wait for the device
        local = torch.tensor(mine, dtype=torch.float64, device=rt.device)
        parts = [torch.empty_like(local) for _ in range(rt.world_size)]
        dist.all_gather(parts, local)
        rows = torch.stack(parts).tolist()
        if any(math.isnan(v) for row in rows for v in row):
            return []  # a window with no timed step on some rank (the first after a start or a rollback)
        return self.judge(step, [r[0] for r in rows], [r[1] for r in rows])

    def message(self, s: Straggler) -> str:
        where = f"{s.host}, node {s.node}" if s.host else f"node {s.node}"
        return (
            f"straggler: rank {s.rank} ({where}) works {s.ratio:.2f}x as long as the other ranks each step, "
            f"{self.windows} windows of {WINDOW_STEPS}+ steps in a row since step {s.first_step} (--straggler-ratio {self.ratio:g}); "
            "the job runs at its pace"
        )

    def report(self) -> list[dict[str, Any]]:
        """For summary.json: every rank named, with its newest and largest ratio."""
        return [
            {
                "rank": s.rank,
                "node": s.node,
                "host": s.host,
                "ratio": round(s.ratio, 3),
                "max_ratio": round(s.max_ratio, 3),
                "since_step": s.first_step,
                "named_at_step": s.named_at_step,
                "windows": s.windows,
            }
            for s in sorted(self.named.values(), key=lambda s: s.rank)
        ]
