"""`dstk estimate`: memory per GPU, step time, throughput and MFU of one layout (pure; no torch)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toolkit.commands import (
    add_cluster_args,
    add_layout_args,
    add_model_args,
    cluster_from_args,
    layout_request_from_args,
    model_from_args,
    print_json,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser)
    add_layout_args(parser)
    parser.add_argument(
        "--zero-buckets",
        choices=("dstk", "deepspeed"),
        default="dstk",
        help="ZeRO bucket/prefetch/live-parameter sizes: dstk's (sized from the model, as dstk config writes "
        "them) or DeepSpeed's defaults (a hand-written config without them); with --config, the config's",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="DS_JSON",
        help="estimate an existing DeepSpeed config: its ZeRO stage, offload, batch, precision and ZeRO sizes "
        "(layout flags given as well override it; --tp/--pp/--sp for what a Megatron launch sets)",
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def run(args: argparse.Namespace) -> int:
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.rules import resolve_layout
    from toolkit.plan.zero_knobs import deepspeed_default_knobs

    model, cluster = model_from_args(args), cluster_from_args(args)
    request = layout_request_from_args(args)
    if args.config is not None:
        from toolkit.integrations.ds_layout import estimate_config

        _judge(args, cluster)  # a config dstk validate refuses is not priced
        result, notes = estimate_config(args.config, model, cluster, request, (args.tp, args.pp, args.sp))
        for note in notes:  # what the config left open and the estimate assumed, said once
            print(f"note: {note}", file=sys.stderr)
    else:
        layout = resolve_layout(model, cluster, request)
        knobs = deepspeed_default_knobs(layout) if args.zero_buckets == "deepspeed" else None
        result = estimate(model, cluster, layout, knobs)
    if args.json:
        print_json(result.to_dict())
    else:
        from toolkit.report.render import print_estimate

        print_estimate(result)
    return 0


def _judge(args: argparse.Namespace, cluster: object) -> None:
    """The config's problems that dstk validate would name, the first as one line (no DeepSpeed import)."""
    from toolkit.errors import UserError
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.integrations.ds_layout import ModelParallel
    from toolkit.integrations.validate import problems_without_deepspeed

    cfg = read_ds_config(args.config)
    problems = problems_without_deepspeed(
        cfg, cluster.accelerator, ModelParallel.of(cfg, args.tp, args.pp, args.sp)
    )  # type: ignore[attr-defined]
    if problems:
        more = f" (and {len(problems) - 1} more: dstk validate {args.config})" if len(problems) > 1 else ""
        raise UserError(f"--config: {problems[0]}{more}")
