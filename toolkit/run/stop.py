"""Stopping a run on request: SIGTERM or SIGINT ends it at the next step boundary, with a checkpoint.

SIGTERM is what `kill`, `timeout`, systemd, CI cancellation and SLURM (preemption, `--signal` before the time
limit) send; SIGINT is Ctrl-C. A rank that gets one only records it; the training loop shares the request
with every rank inside the per-step all-reduce it does anyway (so all ranks stop after the same step and
the collective save cannot deadlock), saves a checkpoint there, and the process exits 128 + the signal's
number. DeepSpeed's own launcher SIGTERMs the ranks as well and kills them 30 s later
(`deepspeed/launcher/launch.py: terminate_process_tree`): a step plus a save must fit in that.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopRequest:
    """The first SIGTERM/SIGINT this process receives (0: none)."""

    def __init__(self) -> None:
        self.signum = 0

    @classmethod
    def install(cls) -> StopRequest | None:
        """Listen for SIGTERM and SIGINT (main thread only, as Python requires); None elsewhere."""
        if threading.current_thread() is not threading.main_thread():
            return None
        request = cls()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, request._record)
        return request

    def _record(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
