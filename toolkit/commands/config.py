"""`dstk config`: write the DeepSpeed config for a layout (given by flags, or chosen with --plan).

Imports DeepSpeed lazily, only to validate what it writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.commands import (
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_target_arg,
    cluster_from_args,
    layout_request_from_args,
    model_from_args,
    scopes_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from toolkit.ds_config import ConfigOptions

    add_model_args(parser)
    add_cluster_args(parser)
    add_layout_args(parser)
    add_target_arg(parser)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="where to write the DeepSpeed JSON ('-' for stdout)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="let the planner choose the layout; layout flags become constraints",
    )
    parser.add_argument(
        "--no-validate",
        dest="validate",
        action="store_false",
        help="skip the check with DeepSpeed's own config classes",
    )
    group = parser.add_argument_group("training options written into the config")
    for name, flag in OPTION_FLAGS.items():
        field = ConfigOptions.model_fields[name]
        if field.annotation is bool:
            group.add_argument(flag, dest=name, action="store_true", default=None, help=field.description)
        else:
            kind = float if name == "lr" else int if "steps" in name or name == "freeze_step" else str
            group.add_argument(flag, dest=name, type=kind, metavar="X", help=field.description)


OPTION_FLAGS = {
    "lr": "--lr",
    "train_steps": "--train-steps",
    "warmup_steps": "--warmup-steps",
    "log_dir": "--log-dir",
    "job_name": "--job-name",
    "wandb": "--wandb",
    "comms_logger": "--comms-logger",
    "flops_profiler": "--flops-profiler",
    "nvme_path": "--nvme-path",
    "freeze_step": "--freeze-step",
}


def run(args: argparse.Namespace) -> int:
    from toolkit import ds_config
    from toolkit.layout import resolve_layout
    from toolkit.load import build

    model, cluster = model_from_args(args), cluster_from_args(args)
    request = layout_request_from_args(args)
    scopes = scopes_from_args(args)
    if args.plan:
        from toolkit.planner import DEFAULT_MARGIN, nothing_fits_message, plan

        fixed = request.model_dump(exclude_unset=True)
        batch = fixed.pop("global_batch_size", None)
        result = plan(model, cluster, fixed, global_batch=batch, scopes=scopes)
        if result is None:
            raise nothing_fits_message(model, cluster, fixed, batch, DEFAULT_MARGIN, scopes)
        layout = result.best.layout
    else:
        layout = resolve_layout(model, cluster, request, scopes)
    options = build(
        ds_config.ConfigOptions,
        {k: getattr(args, k) for k in OPTION_FLAGS if getattr(args, k) is not None},
        "config options",
        labels=OPTION_FLAGS,
    )
    cfg = ds_config.build_ds_config(model, cluster, layout, options)
    from toolkit.estimate import estimate

    predicted = estimate(model, cluster, layout)
    if not predicted.fits:
        print(
            f"dstk config: warning: predicted {predicted.memory.total / 2**30:.1f} GiB per GPU exceeds "
            f"{cluster.gpu_memory_gib:g} GiB (or host/NVMe capacity); try dstk plan",
            file=sys.stderr,
        )
    if args.validate:
        from toolkit.validate import validate_config

        problems = validate_config(cfg, cluster.world_size, cluster.accelerator)
        if problems:  # dstk generated something DeepSpeed refuses: our bug, not the user's
            raise RuntimeError("generated config rejected by DeepSpeed: " + "; ".join(problems))
    if str(args.output) == "-":
        sys.stdout.write(ds_config.dumps(cfg))
    else:
        ds_config.write(cfg, args.output)
        print(f"wrote {args.output} ({' '.join(layout.flags())})", file=sys.stderr)
    return 0
