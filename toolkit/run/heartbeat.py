"""This rank's heartbeat: a daemon thread writes its step and phase to `RUN_DIR/heartbeat/rank{R}.json` once a
second (format and the launcher's reading: toolkit/launcher/heartbeat.py).

The training thread only assigns two attributes per phase (`enter`): no device value is read, no collective
runs, nothing waits, so a step costs what it cost before (tests/test_step_sync.py). The writer thread does the
file I/O; torch releases the GIL inside collectives and kernels, so it keeps beating while the training thread
waits for a peer, and stops only when the process does.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from toolkit.launcher.heartbeat import BEAT_S, heartbeat_dir, rank_file


class Heartbeat:
    def __init__(self, run_dir: Path, rank: int, node: int, host: str) -> None:
        self.path = rank_file(heartbeat_dir(run_dir), rank)
        self.identity = {"rank": rank, "node": node, "host": host, "pid": os.getpid()}
        self.step = 0
        self.phase = "setup"
        self.progress = 0
        self._beat = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dstk-heartbeat", daemon=True)

    @classmethod
    def start(cls, run_dir: Path, rt: Any) -> Heartbeat:
        beat = cls(run_dir, rt.rank, rt.node, rt.host)
        beat.path.parent.mkdir(parents=True, exist_ok=True)
        beat._write()
        beat._thread.start()
        return beat

    def enter(self, phase: str, step: int | None = None) -> None:
        """The training thread moves on (host attributes only)."""
        if step is not None:
            self.step = step
        self.phase = phase
        self.progress += 1

    def _write(self) -> None:
        self._beat += 1
        record = {
            **self.identity,
            "step": self.step,
            "phase": self.phase,
            "progress": self.progress,
            "beat": self._beat,
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with contextlib.suppress(OSError):  # a full or lost run folder must not stop training
            tmp.write_text(json.dumps(record) + "\n")
            tmp.replace(self.path)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self._write()

    def close(self) -> None:
        """The rank's work is over: say so (a finished rank is not a stopped one) and stop writing."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.enter("done")
        self._write()


class _NoBeat:
    """Where no heartbeat runs (a Trainer built outside `dstk train`): phases go nowhere."""

    def enter(self, phase: str, step: int | None = None) -> None:
        pass


NO_BEAT = _NoBeat()
