"""`dstk train`: train a model description with a DeepSpeed config on the ranks a launcher started.

Run it through `dstk launch` (or the `deepspeed` launcher directly); alone it is a one-rank job.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.commands import add_model_args
from toolkit.run.stability import GuardOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--config", type=Path, required=True, metavar="FILE", help="DeepSpeed JSON (dstk config writes one)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        metavar="DIR",
        help="output of dstk data prepare (default: the generated demo corpus, prepared in the run dir)",
    )
    parser.add_argument(
        "--steps", type=int, metavar="N", help="optimizer steps (default: the schedule's total_num_steps)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/train"),
        metavar="DIR",
        help="metrics.jsonl, summary.json and the default data go here",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="save (and resume) checkpoints here"
    )
    parser.add_argument(
        "--save-every",
        type=int,
        metavar="K",
        help="checkpoint every K steps and at the end (default: the plan's Young/Daly interval)",
    )
    parser.add_argument("--keep-last", type=int, default=3, metavar="K", help="complete checkpoints to keep")
    parser.add_argument(
        "--async-save",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="copy each checkpoint to host memory and persist it in a background thread while training goes "
        "on (default: the config's plan; synchronous for a config without one)",
    )
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=None,
        metavar="K",
        help="also snapshot the state into shared memory (/dev/shm, this node) every K steps; a restart "
        "takes the newest of snapshots and checkpoints (default: the config's plan, else 0 = none)",
    )
    parser.add_argument(
        "--resume",
        default="never",
        metavar="auto|never|TAG",
        help="auto: continue from the newest complete checkpoint",
    )
    parser.add_argument(
        "--init-from", type=Path, metavar="DIR", help="start from a local save_pretrained directory"
    )
    parser.add_argument(
        "--eval-every", type=int, default=0, metavar="N", help="held-out loss and perplexity every N steps"
    )
    parser.add_argument(
        "--eval-rows", type=int, default=64, metavar="N", help="validation sequences per evaluation"
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate the (resumed or --init-from) model once on the validation split and stop",
    )
    parser.add_argument("--log-every", type=int, default=10, metavar="N", help="log metrics every N steps")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, data order and dropout")
    parser.add_argument(
        "--cluster",
        metavar="C",
        help="cluster to predict against (default: `local`, this machine as detected, calibrated if "
        "`dstk calibrate` ran here)",
    )
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument(
        "--lora",
        metavar="SPEC",
        help="LoRA fine-tuning with peft, e.g. r=16,alpha=32 (usually with --init-from); the adapters are "
        "saved to RUN_DIR/adapter",
    )
    _add_guard_arguments(parser)
    _add_batching_arguments(parser)
    parser.add_argument("--fault-after-save-shards", type=int, metavar="STEP", help=argparse.SUPPRESS)
    parser.add_argument("--crash-at-step", type=int, metavar="STEP", help=argparse.SUPPRESS)
    parser.add_argument("--crash-rank", type=int, default=0, metavar="RANK", help=argparse.SUPPRESS)
    parser.add_argument(
        "--crash-during",
        choices=("step", "persist", "after-snapshot"),
        default="step",
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--slow-snapshot", type=float, default=0.0, metavar="S", help=argparse.SUPPRESS)
    parser.add_argument(
        "--inject-fault", action="append", metavar="STEP[+]:nan|spike", help=argparse.SUPPRESS
    )


GUARD_FLAGS = {
    "spike_window": "window",
    "spike_mads": "mads",
    "spike_steps": "patience",
    "spike_lr_factor": "lr_factor",
    "max_rollbacks": "max_rollbacks",
}
"""argparse destination → GuardOptions field."""


def _add_guard_arguments(parser: argparse.ArgumentParser) -> None:
    """The spike guard's flags (toolkit.run.stability); their defaults are GuardOptions'."""
    g = parser.add_argument_group("spike guard")
    g.add_argument(
        "--spike-guard",
        action="store_true",
        help="on a loss or gradient-norm spike, roll back to the last checkpoint and skip the data read since "
        "(needs --checkpoint-dir)",
    )
    g.add_argument(
        "--spike-window",
        type=int,
        metavar="N",
        help=f"steps in the median/MAD baseline (default {GuardOptions.window})",
    )
    g.add_argument(
        "--spike-mads",
        type=float,
        metavar="K",
        help=f"anomalous above median + K·MAD (default {GuardOptions.mads:g})",
    )
    g.add_argument(
        "--spike-steps",
        type=int,
        metavar="N",
        help=f"consecutive anomalous steps that make a spike (default {GuardOptions.patience})",
    )
    g.add_argument(
        "--spike-lr-factor",
        type=float,
        metavar="F",
        help=f"multiply the learning rate by F after each rollback (default {GuardOptions.lr_factor:g})",
    )
    g.add_argument(
        "--max-rollbacks",
        type=int,
        metavar="N",
        help=f"stop the run at the spike after N rollbacks (default {GuardOptions.max_rollbacks})",
    )


BATCHING_FLAGS = ("token_budget", "lr_scaling", "curriculum_steps", "curriculum_start")


def _add_batching_arguments(parser: argparse.ArgumentParser) -> None:
    """Dynamic batching and the sequence-length curriculum (toolkit.data.dynamic); the config's
    data_efficiency.data_sampling.dynamic_batching block sets the same, and these flags override it."""
    from toolkit.data.dynamic import DynamicOptions

    defaults = {name: f.default for name, f in DynamicOptions.model_fields.items()}
    g = parser.add_argument_group("dynamic batching")
    g.add_argument(
        "--token-budget",
        type=int,
        metavar="N",
        help="micro-batches of as many sequences as fit N tokens padded (sequences × the longest), "
        "bucketed by length; best with dstk data prepare --no-pack",
    )
    g.add_argument(
        "--lr-scaling",
        choices=("linear", "sqrt", "none"),
        help="learning rate × (step tokens / config batch tokens) or its square root "
        f"(default: {defaults['lr_scaling']})",
    )
    g.add_argument(
        "--curriculum-steps",
        type=int,
        metavar="K",
        help="sequence-length warmup: truncate sequences to a length growing linearly to the full one over K steps",
    )
    g.add_argument(
        "--curriculum-start",
        type=int,
        metavar="L",
        help=f"the curriculum's first length, rounded up to a multiple of 8 (default: {defaults['curriculum_start']})",
    )


def _batching_options(args: argparse.Namespace, config: dict) -> Any:
    from toolkit.data.dynamic import dynamic_options
    from toolkit.errors import UserError

    given = {flag: getattr(args, flag) for flag in BATCHING_FLAGS if getattr(args, flag) is not None}
    if args.curriculum_start is not None and not args.curriculum_steps:
        raise UserError("--curriculum-start: only applies with --curriculum-steps K")
    options = dynamic_options(config, given)
    if options is None and args.lr_scaling is not None:
        raise UserError("--lr-scaling: only applies with --token-budget or --curriculum-steps")
    return options


def _guard_options(args: argparse.Namespace) -> GuardOptions | None:
    from toolkit.errors import UserError

    given = {
        field: getattr(args, flag) for flag, field in GUARD_FLAGS.items() if getattr(args, flag) is not None
    }
    if not args.spike_guard:
        if given:
            flag = next(f for f, field in GUARD_FLAGS.items() if field in given)
            raise UserError(f"--{flag.replace('_', '-')}: only applies with --spike-guard")
        return None
    if args.checkpoint_dir is None:
        raise UserError(
            "--spike-guard: needs --checkpoint-dir (it rolls back to the last complete checkpoint)"
        )
    if not args.save_every:
        raise UserError("--spike-guard: needs periodic checkpoints; give --save-every K > 0")
    return GuardOptions(**given)


def run(args: argparse.Namespace) -> int:
    import os

    from toolkit.run.runtime import keep_large_blocks_in_mmap

    keep_large_blocks_in_mmap()  # before torch is imported: see its docstring

    from toolkit.commands import model_from_args
    from toolkit.errors import UserError
    from toolkit.integrations.ds_input import read_ds_config, scheduled_steps
    from toolkit.integrations.ds_layout import request_from_config
    from toolkit.integrations.dstk_block import read_dstk_block
    from toolkit.plan.load import load_cluster
    from toolkit.run.loop_state import LoopOptions
    from toolkit.run.session import TrainRun, main
    from toolkit.run.stability import Fault

    model = model_from_args(args)
    config = read_ds_config(args.config)
    block = read_dstk_block(config)
    steps = args.steps or scheduled_steps(config)
    if not isinstance(steps, int) or steps <= 0:
        raise UserError("--steps: give a positive number of steps (the config's scheduler has none)")
    if args.save_every is None:
        planned = block.checkpoint_interval_steps
        args.save_every = min(planned, steps) if args.checkpoint_dir else 0
    async_save, snapshot_every = _checkpoint_tiers(args, block, model)
    for flag in ("save_every", "keep_last", "eval_every", "eval_rows", "log_every"):
        if getattr(args, flag) < 0:
            raise UserError(f"--{flag.replace('_', '-')}: must not be negative")
    if args.init_from is not None and not args.init_from.is_dir():
        raise UserError(f"--init-from: {args.init_from} is not a directory")
    if args.init_from is not None and (args.init_from / "config.json").is_file():
        from toolkit.run.models import check_init_from

        check_init_from(model, args.init_from)
    if args.data is not None and not args.data.is_dir():
        raise UserError(f"--data: {args.data} is not a directory")
    if args.resume not in ("auto", "never") and args.checkpoint_dir is None:
        raise UserError("--resume: needs --checkpoint-dir")
    lora = _lora(args.lora, block.layout.lora if block.layout else None)
    guard = _guard_options(args)
    faults = tuple(Fault.parse(f) for f in args.inject_fault or ())
    from toolkit.run.runtime import adopt_slurm_task

    adopt_slurm_task()  # a rank srun started (DeepSpeed's slurm backend) knows its place from SLURM's variables
    world = int(os.environ.get("WORLD_SIZE", "1"))
    request = request_from_config(config, world)  # DeepSpeed's batch arithmetic for this world, before torch
    from toolkit.run.preflight import check_resume

    # --eval-only trains nothing, so a checkpoint at --steps is what it wants, not "nothing to do"
    steps_left = None if args.eval_only else steps
    check_resume(
        args.checkpoint_dir, args.resume, steps_left, world, request.model_dump(), model.model_dump()
    )
    cluster = None
    if args.cluster:
        cluster = load_cluster(args.cluster)
    elif block.layout is None or block.layout.world_size == world:
        cluster = load_cluster("local", {"gpus_per_node": world})
    os.environ.setdefault("WANDB_MODE", "offline")  # offline unless the user configured wandb
    loop = LoopOptions(
        steps=steps,
        log_every=max(args.log_every, 1),
        eval_every=args.eval_every,
        eval_rows=args.eval_rows,
        eval_only=args.eval_only,
        save_every=args.save_every,
        seed=args.seed,
        progress=args.progress,
        fault_after_first_shard_at=args.fault_after_save_shards,
        crash_at_step=args.crash_at_step,
        crash_rank=args.crash_rank,
        crash_during=args.crash_during,
        slow_snapshot_s=args.slow_snapshot,
        async_save=async_save,
        snapshot_every=snapshot_every,
        guard=guard,
        faults=faults,
        batching=_batching_options(args, config),
    )
    summary = main(
        TrainRun(
            model=model,
            config=config,
            data=args.data,
            run_dir=args.run_dir,
            checkpoint_dir=args.checkpoint_dir,
            resume=args.resume,
            init_from=args.init_from,
            cluster=cluster,
            keep_last=args.keep_last,
            loop=loop,
            lora=lora,
        )
    )
    # stopped by SIGTERM/SIGINT (at a step boundary, checkpoint written): 128 + the signal, the shell convention
    code = 128 + summary["stopped_by"] if summary.get("stopped_by") else 0
    if "LOCAL_RANK" in os.environ:
        from toolkit.run.runtime import exit_without_teardown

        exit_without_teardown(code)
    return code


def _lora(flag: str | None, planned: str | None) -> str | None:
    """The LoRA spec from --lora or from the plan in the config (`dstk config --lora`); they must agree."""
    from toolkit.errors import UserError
    from toolkit.plan.lora import parse_lora

    given = parse_lora(flag).text() if flag else None
    planned = parse_lora(planned).text() if planned else None
    if given and planned and given != planned:
        raise UserError(f"--lora: {given} disagrees with the config's plan ({planned}); drop one")
    return given or planned


def _checkpoint_tiers(args: argparse.Namespace, block: Any, model: Any = None) -> tuple[bool, int]:
    """(asynchronous saves, shared-memory snapshot interval) from the flags, else the config's plan; with the
    model, /dev/shm must hold the two snapshots the tier keeps while it writes the next."""
    import os

    from toolkit.errors import UserError

    planned = block.checkpoint
    async_save = args.async_save if args.async_save is not None else planned.asynchronous
    every = args.snapshot_every if args.snapshot_every is not None else planned.snapshot_interval_steps
    if every < 0:
        raise UserError("--snapshot-every: must not be negative")
    if every and args.checkpoint_dir is None:
        raise UserError("--snapshot-every: needs --checkpoint-dir (the snapshots are named after it)")
    nodes = int(os.environ.get("CROSS_SIZE", "1"))  # set by DeepSpeed's launch.py on every rank
    if every and nodes > 1:
        raise UserError(
            f"--snapshot-every: shared-memory snapshots are node-local and this job spans {nodes} nodes; "
            "use --save-every (and --async-save) for multi-node jobs"
        )
    if every and not os.path.isdir("/dev/shm"):
        raise UserError("--snapshot-every: this host has no /dev/shm")
    if every and model is not None:
        _check_shm_room(model, block.layout)
    return bool(async_save), every


def _check_shm_room(model: Any, layout: Any) -> None:
    """Two snapshots must fit in /dev/shm: a container's default tmpfs (docker: 64 MB) would fail mid-run."""
    import shutil

    from toolkit.errors import UserError
    from toolkit.plan.checkpoint_interval import checkpoint_bytes
    from toolkit.plan.params import count_params
    from toolkit.plan.units import format_bytes

    need = 2 * (checkpoint_bytes(model, layout) if layout is not None else 16 * count_params(model).total)
    free = shutil.disk_usage("/dev/shm").free
    if need > free:
        raise UserError(
            f"--snapshot-every: the shared-memory tier needs {format_bytes(need)} in /dev/shm (two snapshots "
            f"while the next is written), {format_bytes(free)} free; enlarge it (docker run --shm-size) or "
            "leave --snapshot-every off"
        )
