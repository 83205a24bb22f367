"""Stopping a run on request: SIGTERM, SIGINT or SIGUSR1 ends it at the next step boundary, with a checkpoint.

SIGTERM is what `kill`, `timeout`, systemd, CI cancellation and SLURM preemption send; SIGINT is Ctrl-C;
SIGUSR1 is SLURM's warning before the time limit in the scripts `dstk launch --slurm` writes
(toolkit.launcher.slurm), after which the job requeues itself. A rank that gets one only records it; the training loop shares the request
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
    """The first SIGTERM/SIGINT/SIGUSR1 this process receives (0: none)."""

    def __init__(self) -> None:
        self.signum = 0

    @classmethod
    def install(cls) -> StopRequest | None:
        """Listen for SIGTERM, SIGINT and SIGUSR1 (main thread only, as Python requires); None elsewhere. One
        request per process: a signal that `listen_early` caught is kept."""
        global _REQUEST
        if threading.current_thread() is not threading.main_thread():
            return None
        _REQUEST = _REQUEST or cls()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, _REQUEST._record)
        return _REQUEST

    @classmethod
    def listen_early(cls) -> None:
        """SIGUSR1 from the first moment of a rank: SLURM's warning before the time limit may come while the
        rank still starts up, and its default action ends the process without a checkpoint (SIGTERM and
        Ctrl-C during start-up still end it at once, as before the first step there is nothing to save)."""
        global _REQUEST
        if threading.current_thread() is threading.main_thread():
            _REQUEST = _REQUEST or cls()
            signal.signal(signal.SIGUSR1, _REQUEST._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum


_REQUEST: StopRequest | None = None
