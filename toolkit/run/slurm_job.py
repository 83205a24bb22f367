"""The run half of `dstk launch --slurm FILE`: the train command judged as for any launch, then what only a
batch job needs — a checkpoint folder to stop into and resume from, data for a real model, paths that mean
the same from wherever the job starts, the time-limit warning's lead from the plan's step and save times, and
a word when the plan runs past `--time` — and the sbatch script written (toolkit.launcher.slurm). Nothing
is started.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from toolkit.errors import UserError

PATH_FLAGS = ("--data", "--checkpoint-dir", "--run-dir", "--init-from", "--config", "--cluster", "--model")
"""dstk train flags whose value may be a path: made absolute in the script (`--model`/`--cluster` only when the
value is an existing file, not a preset name)."""
REAL_MODEL_PARAMS = 1e9
"""From this size on, a job without --data is taken for a mistake: the generated demo corpus is a few MB."""


def absolute_paths(program: list[str]) -> list[str]:
    """dstk train's arguments with every relative path made absolute, as they mean it here (PATH_FLAGS)."""
    out = list(program)
    for i, word in enumerate(out):
        flag, eq, value = word.partition("=")
        if flag not in PATH_FLAGS:
            continue
        at = i if eq else i + 1
        value = value if eq else (out[at] if at < len(out) else "")
        path = Path(value)
        if not value or path.is_absolute() or (flag in ("--model", "--cluster") and not path.exists()):
            continue
        out[at] = f"{flag}={path.resolve()}" if eq else str(path.resolve())
    return out


def resumed(program: list[str]) -> list[str]:
    """The program a requeued or restarted job runs: from the newest complete checkpoint (never starting the
    checkpoint folder over again)."""
    out = [w for w in program if w != "--overwrite-checkpoints"]
    return out if "--resume" in out else [*out, "--resume", "auto"]


def check_train(train: Any) -> None:
    """What a batch job of dstk train needs beyond a launch: a checkpoint folder, data for a real model."""
    from toolkit.plan.params import count_params
    from toolkit.plan.units import format_count

    if train.checkpoint_dir is None:
        raise UserError(
            "--checkpoint-dir: a SLURM job of dstk train saves there when the time limit nears and resumes there "
            "after its requeue; give one (after --)"
        )
    params = count_params(train.model).total
    if train.data is None and params >= REAL_MODEL_PARAMS:
        raise UserError(
            f"--data: none given, so every run of the job would train {train.model.name} ({format_count(params)} "
            "parameters) on the generated demo corpus; give the data dstk data prepare wrote (after --)"
        )


def timing(train: Any, cluster: Any) -> tuple[float, float] | None:
    """(step, save) seconds the plan predicts for this job, or None where the cost model cannot price it."""
    from toolkit.integrations.ds_layout import layout_from_config
    from toolkit.plan.checkpoint_interval import checkpoint_plan
    from toolkit.plan.cost.estimate import estimate
    from toolkit.run.data_fit import at_seq_length
    from toolkit.run.preflight import data_fingerprint

    data = data_fingerprint(train.data) or {}
    model = at_seq_length(train.model, data.get("seq_length") or train.model.seq_length)  # what trains
    try:
        layout = layout_from_config(train.config, cluster.world_size)
        step_s = estimate(model, train.cluster or cluster, layout).time.total_s
        return step_s, checkpoint_plan(model, cluster, layout, step_s).write_s
    except Exception:  # a layout the cost model does not price: the default lead, not a refused script
        return None


DEFAULT_LEAD_S = 300
"""The lead when the plan has no step time to go by."""


def lead_and_warning(train: Any, cluster: Any, limit: str | None) -> tuple[int, str | None]:
    """The `--signal` lead, and a sentence when the plan's time exceeds `--time` (or cannot be known)."""
    from toolkit.launcher.slurm import signal_lead_s, slurm_seconds

    times = timing(train, cluster)
    if times is None:
        return (
            DEFAULT_LEAD_S,
            "the cost model cannot price this layout: SLURM warns the job 300 s before its limit",
        )
    step_s, save_s = times
    lead = signal_lead_s(step_s, save_s)
    if limit is None:
        return lead, None
    planned, usable = train.loop.steps * step_s, slurm_seconds(limit) - lead
    if planned <= usable:
        return lead, None
    runs = "" if usable <= 0 else f", about {int(planned // usable) + 1} runs in all"
    return lead, (
        f"the plan's {_duration(planned)} ({train.loop.steps} steps × {step_s:.3g} s) exceed --time "
        f"{limit}: each run checkpoints {lead} s before its limit and requeues itself{runs}"
    )


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def write_slurm(args: argparse.Namespace, cluster: Any) -> int:
    """Write the sbatch script (and the run folder's cluster.yaml the job reads); start nothing."""
    import yaml

    from toolkit.launcher.slurm import SlurmOptions, sbatch_script
    from toolkit.paths import output_dir, output_file
    from toolkit.run.launching import DEFAULT_PORT, default_job_name, program_of

    if args.elastic:
        raise UserError("--elastic: not with --slurm: the allocation is SLURM's (a lost node ends the job)")
    output_dir(args.run_dir, "--run-dir")
    output_file(args.slurm, "--slurm")
    if args.include or args.exclude:
        raise UserError(
            f"{'--include' if args.include else '--exclude'}: not with --slurm: SLURM chooses the nodes (give "
            "sbatch --nodelist or --exclude when you submit)"
        )
    run_dir = args.run_dir.resolve()
    if args.config is not None:
        args.config = args.config.resolve()
    program, train = program_of(args, run_dir / "cluster.yaml", cluster)
    lead, warning, resume = None, None, None
    if train is not None:
        check_train(train)
        program = absolute_paths(program)
        lead, warning = lead_and_warning(train, cluster, args.time)
        resume = resumed(program)
    options = SlurmOptions(
        job_name=args.job_name or default_job_name(program),
        time=args.time,
        partition=args.partition,
        account=args.account,
        cpus_per_task=args.cpus_per_task,
        gres=args.gres,
    )
    script = sbatch_script(
        cluster, program, run_dir=run_dir, workdir=Path.cwd(), options=options, python=sys.executable,
        master_port=args.master_port or DEFAULT_PORT, max_restarts=args.max_restarts, lead_s=lead, resume=resume,
    )  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)  # sbatch opens --output there before the script starts
    (run_dir / "cluster.yaml").write_text(
        yaml.safe_dump(cluster.model_dump(exclude_none=True), sort_keys=False)
    )
    args.slurm.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.slurm.with_name(args.slurm.name + ".tmp")
    tmp.write_text(script, encoding="utf-8")
    tmp.chmod(0o755)
    tmp.replace(args.slurm)
    if warning:
        print(f"dstk launch: warning: {warning}", file=sys.stderr)
    print(f"wrote {args.slurm}; submit it with: sbatch {shlex.quote(str(args.slurm))}")
    return 0
