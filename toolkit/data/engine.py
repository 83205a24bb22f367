"""The stages of `dstk data prepare` on datatrove's executors: `LocalPipelineExecutor` (worker processes on
this machine) or `SlurmPipelineExecutor` (a job array per stage, chained by dependencies, waited for here).

datatrove owns the task scheduling, the worker pools and the SLURM scripts, and marks each task done
(`logs/completions/RRRRR`) once its pipeline returned: a rerun runs only the tasks not marked. dstk adds
three things around it:

- quiet logs: datatrove's per-task log goes to `logs/logs/task_RRRRR.log`; only errors reach stderr, where
  the stage bars and summary lines are;
- workers that die with the run: a worker (or datatrove's manager process) whose parent is killed gets
  SIGKILL (Linux `PR_SET_PDEATHSIG`), instead of writing on while the rerun starts;
- the progress of every task, from the heartbeat files the steps write (toolkit.data.progress.Heartbeat),
  summed into the stage's bar by a thread of this process, for local workers and SLURM tasks alike.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.utils.logging import logger

from toolkit.data.options import ExecutionOptions
from toolkit.data.progress import Stage, read_heartbeats
from toolkit.errors import UserError

_PR_SET_PDEATHSIG = 1
PRELOAD = ("toolkit.data.engine", "toolkit.data.task_filter", "toolkit.data.task_dedup", "toolkit.data.task_tokens",
           "tokenizers")  # fmt: skip
_hooked = False


def die_with_parent() -> None:
    """SIGKILL this process when its parent exits (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def quiet_logs() -> None:
    """datatrove's logger: errors only, on stderr (it re-adds a verbose sink after each task)."""
    logger.remove()
    logger.add(sys.stderr, level="ERROR")


class _Quiet:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.driver = os.getpid()
        """The process that made the executor (its tasks in other processes die with their parent)."""

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1) -> Any:
        if os.getpid() == self.driver:  # LocalRunner.run keeps datatrove's stderr sinks off the terminal
            return super()._run_for_rank(rank, 1, node_rank)  # type: ignore[misc]
        die_with_parent()
        try:  # local_rank 1: datatrove puts only errors on stderr, everything in the task's log file
            return super()._run_for_rank(rank, 1, node_rank)  # type: ignore[misc]
        finally:
            quiet_logs()


class LocalExecutor(_Quiet, LocalPipelineExecutor):
    pass


class SlurmExecutor(_Quiet, SlurmPipelineExecutor):
    def launch_merge_stats(self) -> None:
        """No extra job to merge datatrove's stats: dstk's stages write their own counts."""


@dataclass
class StageRun:
    """One stage: its steps, its number of tasks, its folder (logs, progress, outputs)."""

    name: str
    pipeline: list[Any]
    tasks: int
    folder: Path
    width: int
    """The most workers its tasks are worth (1: one global task; the shards' count for the bucket merge, so
    that a small input is done in this process)."""


def tasks_done(folder: Path, tasks: int) -> int:
    done = folder / "logs" / "completions"
    return sum((done / f"{r:05d}").is_file() for r in range(tasks)) if done.is_dir() else 0


def _forget_progress(stage: StageRun) -> None:
    """Heartbeats of tasks not done are from a run that was stopped: they start again from zero."""
    done = stage.folder / "logs" / "completions"
    for beat in (stage.folder / "progress").glob("[!.]*") if (stage.folder / "progress").is_dir() else ():
        if not (done / beat.name).is_file():
            beat.unlink(missing_ok=True)


class Monitor:
    """While a block runs, add the heartbeats of `folder` to `bar` every `every_s`."""

    def __init__(self, bar: Stage, folder: Path, every_s: float) -> None:
        self.bar, self.folder, self.every_s = bar, folder / "progress", max(every_s, 0.05)
        self.amount, self.documents = 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Monitor:
        self.update()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.update()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.update()

    def update(self) -> None:
        amount, documents, total = read_heartbeats(self.folder)
        if total:
            self.bar.retotal(total)
        if amount != self.amount or documents != self.documents:
            self.bar.advance(amount - self.amount, documents=documents - self.documents)
            self.amount, self.documents = amount, documents


class LocalRunner:
    """Each stage when it is asked for, on worker processes of this machine (one task: in this process)."""

    def __init__(self, execution: ExecutionOptions) -> None:
        global _hooked
        self.workers = execution.workers or len(os.sched_getaffinity(0))
        if not _hooked:  # datatrove's manager process is forked from this one
            os.register_at_fork(after_in_child=die_with_parent)
            # workers are forked from datatrove's forkserver: with the steps' modules imported there once,
            # a stage's workers start in milliseconds instead of importing numpy and datatrove each
            multiprocess.set_forkserver_preload(list(PRELOAD))
            _hooked = True

    def start(self, stages: list[StageRun]) -> None:
        """Nothing to submit: each stage runs in `run`."""

    def run(self, stage: StageRun) -> None:
        workers = max(1, min(self.workers, stage.tasks, stage.width))
        executor = LocalExecutor(
            stage.pipeline, tasks=stage.tasks, workers=workers, logging_dir=str(stage.folder / "logs")
        )
        _forget_progress(stage)
        quiet_logs()
        (stage.folder / "logs").mkdir(parents=True, exist_ok=True)
        with open(stage.folder / "logs" / "driver.log", "a") as log, contextlib.redirect_stderr(log):
            executor.run()  # datatrove's own sinks on sys.stderr now write to the log
        quiet_logs()

    def cancel(self) -> None:
        """Worker processes go with KeyboardInterrupt (or with this process)."""


class SlurmRunner:
    """Every stage submitted at the start (`sbatch`, chained with afterok), then waited for stage by stage."""

    def __init__(self, execution: ExecutionOptions, poll_s: float = 1.0) -> None:
        self.execution, self.poll_s = execution, poll_s
        self.executors: dict[str, SlurmExecutor] = {}

    def _env(self) -> str:
        """What each job runs first: this interpreter's scripts and this dstk, the tokenizer's threads."""
        import toolkit

        cpus = self.execution.slurm_cpus_per_task
        root = Path(toolkit.__file__).resolve().parents[1]
        return "; ".join([
            f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"',
            f'export PYTHONPATH={shlex.quote(str(root))}:"${{PYTHONPATH:-}}"',
            f"export RAYON_NUM_THREADS={cpus} TOKENIZERS_PARALLELISM={'true' if cpus > 1 else 'false'}",
        ])  # fmt: skip

    def start(self, stages: list[StageRun]) -> None:
        opts, previous = self.execution, None
        for stage in stages:
            _forget_progress(stage)
            previous = self.executors[stage.name] = SlurmExecutor(
                stage.pipeline, tasks=stage.tasks, time=opts.slurm_time, partition=opts.slurm_partition,
                cpus_per_task=opts.slurm_cpus_per_task, workers=opts.workers or -1,
                job_name=f"dstk-data-{stage.name}", qos=opts.slurm_qos or "", env_command=self._env(),
                sbatch_args={"mem-per-cpu": opts.slurm_mem_per_cpu}, depends=previous,
                logging_dir=str(stage.folder / "logs"), slurm_logs_folder=str(stage.folder / "slurm"),
            )  # fmt: skip
        quiet_logs()
        try:
            previous.run()  # the last stage submits its dependencies first
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            self.cancel()
            raise UserError(f"--executor slurm: sbatch refused the jobs ({exc})") from None

    def run(self, stage: StageRun) -> None:
        job = self.executors[stage.name].job_id
        while tasks_done(stage.folder, stage.tasks) < stage.tasks:
            if job in (None, -1) or not self._queued(job):
                time.sleep(self.poll_s)  # a completion written as the job left the queue
                if tasks_done(stage.folder, stage.tasks) == stage.tasks:
                    break
                missing = stage.tasks - tasks_done(stage.folder, stage.tasks)
                self.cancel()
                raise UserError(
                    f"--executor slurm: {missing} of {stage.tasks} {stage.name} tasks failed (job {job}); "
                    f"their logs: {stage.folder / 'slurm'}"
                )
            time.sleep(self.poll_s)

    @staticmethod
    def _queued(job: str) -> bool:
        proc = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True)
        return proc.returncode == 0 and bool(proc.stdout.strip())

    def cancel(self) -> None:
        """Cancel the jobs this run submitted that may still be queued."""
        jobs = [str(e.job_id) for e in self.executors.values() if e.job_id not in (None, -1)]
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True)


SAFE_PATH = re.compile(r"[A-Za-z0-9._/+=@,:-]+")
"""What datatrove can put unquoted into the #SBATCH lines and the srun command of its job scripts."""
MEMORY = re.compile(r"\d+[KMGT]?")


def check_slurm(out: Path, execution: ExecutionOptions) -> None:
    """Everything --executor slurm needs, before any work: sbatch, a partition, values sbatch can carry."""
    from toolkit.launcher.slurm import SLURM_LIST, SLURM_TIME

    if shutil.which("sbatch") is None:
        raise UserError("--executor slurm: sbatch not found on PATH (run on a SLURM login node)")
    if execution.slurm_partition is None:
        raise UserError("--slurm-partition: required with --executor slurm")
    for flag, value, pattern in (
        ("--slurm-partition", execution.slurm_partition, SLURM_LIST),
        ("--slurm-time", execution.slurm_time, SLURM_TIME),
        ("--slurm-mem-per-cpu", execution.slurm_mem_per_cpu, MEMORY),
        ("--slurm-qos", execution.slurm_qos or "normal", SLURM_LIST),
    ):
        if not pattern.fullmatch(value):
            raise UserError(f"{flag}: {value!r} cannot go into an #SBATCH line")
    where = str(out.resolve())
    if not SAFE_PATH.fullmatch(where):
        raise UserError(
            f"--out: {where} cannot go into a SLURM job script unquoted (datatrove writes it so); with "
            "--executor slurm use a path of letters, digits and ._/+=@,:-"
        )


def runner(execution: ExecutionOptions) -> LocalRunner | SlurmRunner:
    return SlurmRunner(execution) if execution.executor == "slurm" else LocalRunner(execution)


def run_stages(
    engine: LocalRunner | SlurmRunner, stages: list[StageRun], bar: Stage, beats: Path, every_s: float
) -> None:
    """Run (or wait for) `stages` with the heartbeats of `beats` shown on `bar`."""
    with Monitor(bar, beats, every_s):
        for stage in stages:
            engine.run(stage)
