"""The process that runs `dstk data prepare`: it lays out the work (shards, stage folders), hands the stages
to the engine (toolkit.data.engine), shows a bar per stage with the tasks' progress, reads each stage's
verdict, and says what each stage did in one summary line (toolkit.data.progress).

Four bars, as a user sees the work: `read` (the filter, buckets and resolve stages: input bytes), `tokenizer`
(sample documents), `tokenize` (survivor bytes) and `pack` (documents written).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.pipeline.dedup.minhash import MinhashDedupFilter

from toolkit.data.assemble import Assemble
from toolkit.data.engine import StageRun, run_stages, runner, tasks_done
from toolkit.data.options import ExecutionOptions, PrepareOptions
from toolkit.data.paths import MANIFEST
from toolkit.data.progress import Progress, count, rate
from toolkit.data.read import InputReport
from toolkit.data.shards import default_tasks, plan, to_json
from toolkit.data.task_dedup import Resolve, bucket_step
from toolkit.data.task_filter import FilterStep, ShardReader, SurvivorWriter, buckets
from toolkit.data.task_tokens import SurvivorReader, Tokenize, TrainTokenizer, sample_stride
from toolkit.data.workdir import WORK, rank_file, read_json, remove_stale, stage_dirs, verdict, write_json
from toolkit.errors import UserError

BAD_FILES_SHOWN = 10


class DataError(UserError):
    """The data cannot give a dataset with these flags (found after reading): nothing is left behind."""


@dataclass
class Job:
    """One prepare run: what was asked, where it goes, how it runs."""

    inputs: list[Path]
    files: list[Path]
    out: Path
    seq_length: int
    tokenizer: Path | None
    vocab_size: int | None
    validation_fraction: float
    seed: int
    options: PrepareOptions
    execution: ExecutionOptions
    progress: Progress
    notes: list[str]
    """What the input checks had to say, shown with the read stage's summary."""


def stage_settings(job: Job, tasks: int, shards: list[Any], groups: int) -> dict[str, Any]:
    """What decides each stage's output (toolkit.data.workdir fingerprints it)."""
    opts = job.options
    files = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in job.files]
    tokenizer = None
    if job.tokenizer is not None:
        from toolkit.data.tokenizer import tokenizer_hash

        tokenizer = [str(job.tokenizer), tokenizer_hash(job.tokenizer)]
    reading = opts.model_dump(
        mode="json", include={"boilerplate", "languages", "quality", "dedup", "text_field", "domain_field"}
    )
    return {
        "filter": {"files": files, "shards": to_json(shards), "options": reading, "groups": groups,
                   "validation_fraction": job.validation_fraction},
        "buckets": {},
        "resolve": {"mix": opts.mix, "validation_fraction": job.validation_fraction, "seq": job.seq_length},
        "tokenizer": {"tokenizer": tokenizer, "vocab": job.vocab_size, "sample_mb": opts.tokenizer_sample_mb},
        "tokenize": {},
        "assemble": {"options": opts.model_dump(mode="json"), "seq": job.seq_length, "seed": job.seed,
                     "inputs": [str(p) for p in job.inputs], "notes": job.notes, "tasks": tasks},
    }  # fmt: skip


def workers(execution: ExecutionOptions) -> int:
    """Worker processes on this machine: as asked, else the cores this process may use."""
    return execution.workers or len(os.sched_getaffinity(0))


def work_layout(job: Job) -> tuple[int, list[Any], dict[str, Path], tuple[int, int] | None, int]:
    """(tasks, shards, stage folders, near-dedup (bands, rows), bucket files of bands) of `job`; the folders
    of other settings are removed."""
    from toolkit.data.signatures import lsh_bands
    from toolkit.data.task_filter import band_groups

    execution = job.execution
    total = sum(f.stat().st_size for f in job.files)
    tasks = execution.tasks or default_tasks(total, workers(execution), execution.executor)
    shards = plan(job.files, tasks)
    bands = lsh_bands(job.options.dedup) if job.options.dedup.dedup == "near" else None
    groups = band_groups(bands, execution.executor, workers(execution), tasks)
    dirs = stage_dirs(job.out / WORK, stage_settings(job, tasks, shards, groups))
    remove_stale(job.out / WORK, list(dirs.values()))
    return tasks, shards, dirs, bands, groups


def manifest_of(dataset: Path) -> dict[str, Any]:
    return json.loads((dataset / MANIFEST).read_text())


class Driver:
    def __init__(self, job: Job) -> None:
        self.job = job
        layout = work_layout(job)
        self.tasks, shards, self.dirs, self.bands, self.groups = layout
        plan = self.dirs["filter"] / "plan.json"
        if not plan.is_file():
            write_json(plan, to_json(shards))
        self.engine = runner(job.execution)
        local = job.execution.executor == "local"
        self.threads = workers(job.execution) if local else job.execution.slurm_cpus_per_task
        self.every_s = getattr(job.progress, "refresh_s", 0.5)

    @property
    def dataset(self) -> Path:
        return self.dirs["assemble"] / "dataset"

    def _stages(self) -> dict[str, StageRun]:
        job, dirs, opts = self.job, {k: str(v) for k, v in self.dirs.items()}, self.job.options
        local = job.execution.executor == "local"
        bands = self.bands
        n_buckets = buckets(opts, self.groups)
        checks = {"mix": opts.mix, "validation_fraction": job.validation_fraction, "seq_length": job.seq_length,
                  "files": len(job.files), "text_field": opts.text_field}  # fmt: skip
        tokenizer = {"tokenizer": str(job.tokenizer) if job.tokenizer else None, "vocab_size": job.vocab_size,
                     "sample_mb": opts.tokenizer_sample_mb, "threads": self.threads}  # fmt: skip
        assemble = {
            "seq_length": job.seq_length, "seed": job.seed, "validation_fraction": job.validation_fraction,
            "format": opts.format, "options": opts.model_dump(mode="json"), "tasks": self.tasks,
            "inputs": [str(p) for p in job.inputs], "input_files": len(job.files), "notes": job.notes,
            "bands": {"bands": bands[0], "rows_per_band": bands[1]} if bands else {},
        }  # fmt: skip
        fields = (opts.text_field, opts.domain_field)
        runs = [
            StageRun("filter", [ShardReader(dirs["filter"], fields), FilterStep(dirs["filter"], opts),
                                SurvivorWriter(dirs["filter"], opts, job.validation_fraction, bands,
                                               self.groups)],
                     self.tasks, self.dirs["filter"], self.tasks),
            StageRun("buckets", [bucket_step(self.dirs["filter"], self.dirs["buckets"], n_buckets)],
                     n_buckets, self.dirs["buckets"], self.tasks),
            StageRun("resolve", [Resolve(dirs["filter"], dirs["buckets"], dirs["resolve"], checks)], 1,
                     self.dirs["resolve"], 1),
            StageRun("tokenizer", [TrainTokenizer(dirs["filter"], dirs["resolve"], dirs["tokenizer"], tokenizer)],
                     1, self.dirs["tokenizer"], 1),
            StageRun("tokenize", [SurvivorReader(dirs["filter"]), MinhashDedupFilter(str(self.dirs["resolve"] / "remove")),
                                  Tokenize(dirs["resolve"], dirs["tokenizer"], dirs["tokenize"], 1 if local else self.threads)],
                     self.tasks, self.dirs["tokenize"], self.tasks),
            StageRun("assemble", [Assemble(dirs, assemble)], 1, self.dirs["assemble"], 1),
        ]  # fmt: skip
        return {r.name: r for r in runs if r.name != "buckets" or n_buckets}

    def run(self) -> dict[str, Any]:
        stages = self._stages()
        self.engine.start(list(stages.values()))
        self._read([stages[s] for s in ("filter", "buckets", "resolve") if s in stages])
        self._tokenizer(stages["tokenizer"])
        self._tokenize(stages["tokenize"])
        self._pack(stages["assemble"])
        return manifest_of(self.dataset)

    def stopped(self) -> None:
        """Interrupted, killed or failed: the tasks done stay for the next run of the same command."""
        self.engine.cancel()
        done = sum(tasks_done(d, self.tasks) for n, d in self.dirs.items() if n in ("filter", "tokenize"))
        self.job.progress.note(
            f"stopped with {done} of {2 * self.tasks} read and tokenize tasks done; the same command continues "
            f"from there (their work is in {self.job.out / '.dstk-work'})"
        )

    def _resumed(self, stage: StageRun) -> None:
        done = tasks_done(stage.folder, stage.tasks)
        if 0 < done < stage.tasks:
            self.job.progress.note(
                f"resuming: {done} of {stage.tasks} {stage.name} tasks were done by an earlier run"
            )

    def _verdict(self, folder: Path) -> None:
        error = verdict(folder)
        if error is not None:
            self.engine.cancel()
            raise DataError(error)

    def _read(self, stages: list[StageRun]) -> None:
        job = self.job
        total = sum(f.stat().st_size for f in job.files)
        self._resumed(stages[0])
        bar = job.progress.stage("read", total, "B")
        run_stages(self.engine, stages, bar, self.dirs["filter"], self.every_s)
        self._verdict(self.dirs["resolve"])
        summary = read_json(self.dirs["resolve"] / "summary.json")
        report, read = InputReport.from_json(summary["input"]), summary["counts"]["read"]
        kept = sum(n for _, n in summary["domains"])
        mb, seconds = report.bytes_read / 1e6, bar.seconds
        line = (
            f"read: {count(read, 'document')} from {count(len(job.files), 'file')} ({mb:,.1f} MB) in {seconds:.1f} s "
            f"({rate(read, seconds, 'docs')}, {rate(report.bytes_read, seconds, 'B')}); {kept:,} kept after "
            "cleaning, filters and dedup"
        )
        if job.execution.executor == "slurm":
            where = sorted({read_json(rank_file(self.dirs["filter"] / "reports", r, ".node.json"))["node"]
                            for r in range(self.tasks)})  # fmt: skip
            line += f"; its {self.tasks} tasks ran on {', '.join(where)}"
        bad = [f"--input: {name}: {f.describe(report.text_field)}" for name, f in report.bad_files().items()]
        more = [
            f"--input: and {len(bad) - BAD_FILES_SHOWN} more files with bad input (manifest.json bad_input_files)"
        ]
        job.progress.done(
            bar, line, [*job.notes, *bad[:BAD_FILES_SHOWN], *(more if len(bad) > BAD_FILES_SHOWN else [])]
        )
        self.survivors, self.survivor_bytes = kept, summary["bytes"]

    def _tokenizer(self, stage: StageRun) -> None:
        job = self.job
        if job.tokenizer is not None:
            bar = job.progress.stage("tokenizer")
            run_stages(self.engine, [stage], bar, stage.folder, self.every_s)
            vocab = read_json(stage.folder / "summary.json")["vocab_size"]
            job.progress.done(bar, f"tokenizer: {job.tokenizer}, vocabulary {vocab:,}")
            return
        stride = sample_stride(self.survivor_bytes, job.options.tokenizer_sample_mb)
        bar = job.progress.stage("tokenizer", math.ceil(self.survivors / stride), "doc")
        run_stages(self.engine, [stage], bar, stage.folder, self.every_s)
        summary = read_json(stage.folder / "summary.json")
        vocab, training = summary["vocab_size"], summary["training"]
        notes = []
        if vocab < job.vocab_size:
            more = "more text" if stride == 1 else "a larger --tokenizer-sample-mb or more text"
            notes.append(
                f"--train-tokenizer {job.vocab_size}: the kept text gives only {vocab:,} tokens (BPE ran out of "
                f"pairs to merge), so the vocabulary is {vocab:,}; {more} would give more"
            )
        every = "every kept document" if stride == 1 else f"1 in {stride} kept documents"
        job.progress.done(
            bar,
            f"tokenizer: byte-level BPE trained on {count(training['documents'], 'document')} ({every}) in "
            f"{bar.seconds:.1f} s, vocabulary {vocab:,}",
            notes,
        )

    def _tokenize(self, stage: StageRun) -> None:
        self._resumed(stage)
        bar = self.job.progress.stage("tokenize", self.survivor_bytes, "B")
        run_stages(self.engine, [stage], bar, stage.folder, self.every_s)
        tokens = sum(
            int(np.load(rank_file(stage.folder, r, ".lengths.npy")).sum()) for r in range(self.tasks)
        )
        tokens += self.survivors  # each document's end-of-text token
        self.job.progress.done(
            bar,
            f"tokenize: {count(self.survivors, 'document')}, {count(tokens, 'token')} in {bar.seconds:.1f} s "
            f"({rate(self.survivors, bar.seconds, 'docs')}, {rate(self.survivor_bytes, bar.seconds, 'B')})",
        )

    def _pack(self, stage: StageRun) -> None:
        bar = self.job.progress.stage("pack", self.survivors, "doc")
        run_stages(self.engine, [stage], bar, stage.folder, self.every_s)
        self._verdict(stage.folder)
        manifest = manifest_of(self.dataset)
        parts = []
        if manifest["rows"]:
            rows = manifest["rows"]
            parts.append(f"{rows['train']:,} training and {count(rows['validation'], 'validation row')}")
        if "megatron" in manifest:
            docs = manifest["megatron"]["documents"]
            parts.append(
                f"Megatron files of {docs['train']:,} training and {docs['validation']:,} validation documents"
            )
        self.job.progress.done(bar, f"pack: {'; '.join(parts)} in {bar.seconds:.1f} s")
