"""DeepSpeed's communication logger at a constant cost per step, when a run asks for it (`--comms-logger`).

DeepSpeed 0.19.8's logger keeps every latency it ever measured (`comms_dict[op][size][1..3]` grow per call) and
times each collective with a timer whose `elapsed(reset=False)` re-reads every event pair since the start
(`deepspeed/utils/timer.py`): the n-th step pays for all n-1 before it. After each step dstk adds the step's
bytes and calls per collective to its own totals, then empties the logger's records and resets its timers, so
every step costs what the first did. The logger still synchronizes the device after every collective (that is
how it times them): ask for it to measure volumes, not for speed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any


class CommsTally:
    """Bytes and calls per collective, drained from DeepSpeed's logger after every step."""

    def __init__(self) -> None:
        from deepspeed.comm import comm

        self._comm = comm
        self.enabled = bool(getattr(comm.comms_logger, "enabled", False))
        self.bytes: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def drain(self) -> None:
        """Move what the logger recorded since the last drain into the totals; empty it and its timers."""
        if not self.enabled:
            return
        logger = self._comm.comms_logger
        for name, by_size in logger.comms_dict.items():
            for size, record in by_size.items():
                self.bytes[name] += size * record[0]
                self.calls[name] += record[0]
        logger.comms_dict.clear()
        for timer in self._comm.timers.get_timers().values():
            if not timer.started_:
                timer.reset()

    def recorded(self) -> int:
        """Calls the logger holds undrained plus those drained: 0 in a run that did not ask for it."""
        pending = sum(r[0] for by in self._comm.comms_logger.comms_dict.values() for r in by.values())
        return pending + sum(self.calls.values())

    def per_step(self, steps: int) -> dict[str, float]:
        """Bytes this rank passed to each collective per step (evaluation's included)."""
        self.drain()
        return {name: b / steps for name, b in self.bytes.items()} if steps else {}

    def summary(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "calls_recorded": self.recorded()}
