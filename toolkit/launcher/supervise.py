"""The attempts of one `dstk launch`: run the job, watch it for a hang, restart it from the newest complete
checkpoint, and before each attempt make sure every node still answers (pure: the standard library and the
launcher's own modules; the re-plan for fewer nodes is the caller's, toolkit/run/elastic.py).

A failed attempt is followed by another (with `--resume auto`) while `--max-restarts` allows. A node that no
longer answers ssh is named; with `--elastic` the caller re-plans the job for the nodes that remain, without
it the launch stops there instead of spending its restarts on a node that is gone. Every attempt, hang and
lost node is a line of `RUN_DIR/launch_events.jsonl`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.launcher.heartbeat import HangWatch, clear, read_beats
from toolkit.launcher.job import run_job

SSH_TIMEOUT_S = 10
"""How long a node may take to answer ssh before it counts as lost (ssh's ConnectTimeout)."""


@dataclass
class Attempt:
    """What one attempt runs, and what the supervisor needs to watch it."""

    argv: list[str]
    env: dict[str, str]
    world_size: int
    program: list[str] = field(default_factory=list)
    """What every rank runs (dstk train's arguments, or a script and its own)."""
    cluster: Any = None
    """The ClusterSpec it runs on."""
    shell: str = ""
    """The launcher command as shell source (--dry-run prints it)."""
    hostnames: list[str] | None = None
    """Node index -> name, for the hang report (the hostfile's order, which is DeepSpeed's node rank)."""
    heartbeats: Path | None = None
    """The train run directory's heartbeat folder; None for a script of the user's (nothing to watch)."""
    probe: list[str] = field(default_factory=list)
    """Hosts to reach over ssh before the attempt (a multi-node pdsh job's nodes)."""
    ssh_port: int | None = None


def probe_nodes(hosts: list[str], port: int | None, env: dict[str, str]) -> dict[str, str]:
    """The hosts that do not answer `ssh HOST true` (all at once), each with what ssh said."""

    def probe(host: str) -> str | None:
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
        cmd += (["-p", str(port)] if port else []) + [host, "true"]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SSH_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            return f"no answer in {SSH_TIMEOUT_S + 5} s"
        if proc.returncode == 0:
            return None
        said = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        return said[-1] if said else f"ssh exit {proc.returncode}"

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        answers = dict(zip(hosts, pool.map(probe, hosts), strict=True))
    return {h: why for h, why in answers.items() if why is not None}


def lost_line(lost: dict[str, str], port: int | None) -> str:
    via = f"ssh -p {port}" if port else "ssh"
    return "; ".join(f"node {host} does not answer ({via}: {why})" for host, why in lost.items())


@dataclass
class Supervisor:
    max_restarts: int
    hang_timeout_s: float
    """No progress for this long is a hang (toolkit/launcher/heartbeat.py); 0: not watched."""
    events: Path
    elastic: Callable[[Attempt, dict[str, str]], Attempt] | None = None
    """`--elastic`: the attempt re-planned for the nodes that remain (it says what it changed)."""
    after: Callable[[], None] = lambda: None
    """Run after every attempt (shared-memory buffers of the job's port)."""
    stopped: Callable[[int], None] = lambda signum: None
    """The last line of a job that a signal stopped."""

    def run(self, attempt: Attempt) -> int:
        n, code = 0, 0
        while True:
            lost = probe_nodes(attempt.probe, attempt.ssh_port, attempt.env)
            if lost:
                self._event({"attempt": n, "lost_nodes": lost})
                if self.elastic is None:
                    left = len(attempt.probe) - len(lost)
                    _say(
                        f"{lost_line(lost, attempt.ssh_port)}: the job needs its {len(attempt.probe)} nodes, "
                        f"stopping (--elastic restarts it on the {left} that answer)"
                    )
                    return code or 1
                attempt = self.elastic(attempt, lost)
            start = time.time()
            code, signum, hang = run_job(attempt.argv, attempt.env, self._watch(attempt, n))
            self.after()
            code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
            event = {"attempt": n, "exit_code": code, "seconds": round(time.time() - start, 1)}
            self._event({**event, **({"hang": hang} if hang else {})})
            if signum:
                self.stopped(signum)
                return 128 + signum
            if code == 0:
                return 0
            if n >= self.max_restarts:
                lost = probe_nodes(attempt.probe, attempt.ssh_port, attempt.env)
                if lost:
                    self._event({"attempt": n, "lost_nodes": lost})
                    _say(f"{lost_line(lost, attempt.ssh_port)}: the job stopped (exit {code})")
                return code
            n += 1
            _say(
                f"the job failed (exit {code}); restart {n}/{self.max_restarts} from the newest complete "
                "checkpoint"
            )
            if "--resume" not in attempt.argv:
                attempt.argv = [*attempt.argv, "--resume", "auto"]
                attempt.program = [*attempt.program, "--resume", "auto"]

    def _watch(self, attempt: Attempt, n: int) -> Callable[[], str | None] | None:
        """The hang watch of one attempt, asked once a second by run_job."""
        if not self.hang_timeout_s or attempt.heartbeats is None:
            return None
        clear(attempt.heartbeats)  # an earlier attempt's files (its ranks are gone)
        watch = HangWatch(self.hang_timeout_s, attempt.world_size, attempt.hostnames)
        folder = attempt.heartbeats

        def check() -> str | None:
            report = watch.observe(read_beats(folder), time.monotonic())
            if report is not None:
                self._event({"attempt": n, "hang_detected": report})
                _say(f"hang: {report}; stopping the job")
            return report

        return check

    def _event(self, record: dict[str, object]) -> None:
        with self.events.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), **record}) + "\n")


def _say(text: str) -> None:
    print(f"dstk launch: {text}", file=sys.stderr, flush=True)
