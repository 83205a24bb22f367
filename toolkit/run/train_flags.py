"""`dstk train`'s flags, defined once for the two parsers that read them: `dstk train` on every rank, and
`dstk launch`, which judges the arguments after `--` before any rank starts (toolkit.run.launching). They live
in the run half beside the pre-flight that checks them (toolkit.run.preflight), so neither verb imports the
other; with them, what the spike-guard and dynamic-batching flags make (`guard_options`, `batching_options`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.commands import add_model_args
from toolkit.errors import UserError
from toolkit.run.stability import GuardOptions
from toolkit.run.stragglers import MIN_EXCESS_S, WINDOW_STEPS
from toolkit.run.stragglers import RATIO as STRAGGLER_RATIO
from toolkit.run.stragglers import WINDOWS as STRAGGLER_WINDOWS


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    parser.add_argument(
        "--config", type=Path, required=True, metavar="FILE", help="DeepSpeed JSON (dstk config writes one)"
    )
    _add_run_arguments(parser)
    _add_checkpoint_arguments(parser)
    _add_eval_arguments(parser)
    _add_guard_arguments(parser)
    _add_batching_arguments(parser)
    _add_test_faults(parser)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What is trained, for how long, from what, and where its records go."""
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
        "--init-from", type=Path, metavar="DIR", help="start from a local save_pretrained directory"
    )
    parser.add_argument("--log-every", type=int, default=10, metavar="N", help="log metrics every N steps")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights, data order and dropout")
    parser.add_argument(
        "--straggler-ratio",
        type=float,
        default=STRAGGLER_RATIO,
        metavar="R",
        help="name a rank that works R times as long as the others' median each step (and at least "
        f"{MIN_EXCESS_S * 1000:g} ms longer), in {STRAGGLER_WINDOWS} windows of {WINDOW_STEPS}+ steps in a row, in the "
        f"log and summary.json (default {STRAGGLER_RATIO:g})",
    )
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


def _add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Where checkpoints go, how often, in which tier, and how a run resumes from them."""
    group = parser.add_argument_group("checkpoints and resume")
    group.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="save (and resume) checkpoints here"
    )
    group.add_argument(
        "--save-every",
        type=int,
        metavar="K",
        help="checkpoint every K steps and at the end; 0: only at the end (default: the plan's Young/Daly "
        "interval)",
    )
    group.add_argument(
        "--keep-last",
        type=int,
        default=3,
        metavar="K",
        help="complete checkpoints to keep, the newest; 0: keep every one (default: 3)",
    )
    group.add_argument(
        "--async-save",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="copy each checkpoint to host memory and persist it in a background thread while training goes "
        "on (default: the config's plan; synchronous for a config without one)",
    )
    group.add_argument(
        "--snapshot-every",
        type=int,
        default=None,
        metavar="K",
        help="also snapshot the state into shared memory (/dev/shm, this node) every K steps; a restart "
        "takes the newest of snapshots and checkpoints (default: the config's plan, else 0 = none)",
    )
    group.add_argument(
        "--on-save-error",
        choices=("stop", "continue"),
        default="stop",
        help="a checkpoint that cannot be written (full disk, quota, permissions; the previous complete one "
        "stays loadable): stop the run cleanly there, or keep training and try again at the next save",
    )
    _add_resume_arguments(group)


def _add_resume_arguments(group: Any) -> None:
    """How a run continues from the checkpoints in --checkpoint-dir."""
    group.add_argument(
        "--resume",
        default="never",
        metavar="auto|never|TAG",
        help="auto: continue from the newest complete checkpoint (none there: start at step 0); TAG: that "
        "checkpoint; never: start at step 0, refused where --checkpoint-dir already holds checkpoints "
        "(default: never)",
    )
    group.add_argument(
        "--overwrite-checkpoints",
        action="store_true",
        help="start over at step 0 where --checkpoint-dir holds an earlier run's checkpoints: they are removed "
        "before the first step (without it such a folder is refused unless resumed)",
    )
    group.add_argument(
        "--new-data",
        action="store_true",
        help="resume onto other data than the checkpoint was trained on (another --data): the model and "
        "optimizer continue, the data starts at its first row (without it such a resume is refused)",
    )


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--eval-every", type=int, default=0, metavar="N", help="held-out loss and perplexity every N steps"
    )
    group.add_argument(
        "--eval-rows", type=int, default=64, metavar="N", help="validation sequences per evaluation"
    )
    group.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate the (resumed or --init-from) model once on the validation split and stop",
    )


def _add_test_faults(parser: argparse.ArgumentParser) -> None:
    """Faults the test suite injects into real runs (hidden from --help)."""
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
        "--inject-fault",
        action="append",
        metavar="STEP[+]:nan|spike|slow[=S][@RANK][,first-run]",
        help=argparse.SUPPRESS,
    )


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


PREFLIGHT_DONE = "DSTK_PREFLIGHT_DONE"
"""Set by dstk launch for the ranks once it has run the pre-flight and said its notes."""


# what the spike-guard and dynamic-batching flags make, checked (toolkit.run.preflight calls these)
GUARD_FLAGS = {
    "spike_window": "window",
    "spike_mads": "mads",
    "spike_steps": "patience",
    "spike_lr_factor": "lr_factor",
    "max_rollbacks": "max_rollbacks",
}
"""argparse destination → GuardOptions field."""


BATCHING_FLAGS = ("token_budget", "lr_scaling", "curriculum_steps", "curriculum_start")


def batching_options(args: Any, config: dict) -> Any:
    from toolkit.data.dynamic import dynamic_options

    given = {flag: getattr(args, flag) for flag in BATCHING_FLAGS if getattr(args, flag) is not None}
    if args.curriculum_start is not None and not args.curriculum_steps:
        raise UserError("--curriculum-start: only applies with --curriculum-steps K")
    options = dynamic_options(config, given)
    if options is None and args.lr_scaling is not None:
        raise UserError("--lr-scaling: only applies with --token-budget or --curriculum-steps")
    return options


def guard_options(args: Any) -> Any:
    from toolkit.run.stability import GuardOptions

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
