"""`dstk plan`: the best layout for a model on a cluster, its DeepSpeed config and the reasons (pure)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from toolkit.commands import (
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_target_arg,
    cluster_from_args,
    layout_request_from_args,
    model_from_args,
    print_json,
    scopes_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_cluster_args(parser)
    add_layout_args(parser)
    add_target_arg(parser)
    parser.add_argument(
        "--memory-margin",
        type=float,
        default=None,
        metavar="F",
        help="fraction of GPU memory kept free (default 0.10)",
    )
    parser.add_argument(
        "--tokens", type=float, metavar="N", help="training tokens, for time-to-train (e.g. 300e9)"
    )
    parser.add_argument("--report", type=Path, metavar="F", help="also write a Markdown report to F")
    parser.add_argument(
        "--elastic",
        metavar="MIN..MAX",
        help="also list the world sizes in MIN..MAX that keep the global batch exact",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def plan_to_dict(plan: Any, ds_config: dict[str, Any], tokens: float | None) -> dict[str, Any]:
    best = plan.best
    out = {
        "layout": best.layout.model_dump(),
        "estimate": best.estimate.to_dict(),
        "ds_config": ds_config,
        "explanation": plan.explanation,
        "alternatives": [
            {
                "layout": a.layout.model_dump(),
                "estimate": a.estimate.to_dict() if a.estimate else None,
                "rejected_because": a.rejected_because,
            }
            for a in plan.alternatives
        ],
        "estimate_flags": best.layout.flags(),
        "searched": plan.searched,
        "checkpoint": plan.checkpoint.to_dict(),
    }
    if tokens:
        seconds = tokens / best.estimate.tokens_per_s
        out["training"] = {
            "tokens": tokens,
            "days": seconds / 86400,
            "gpu_hours": seconds / 3600 * best.layout.world_size,
        }
    return out


def run(args: argparse.Namespace) -> int:
    from toolkit.ds_config import build_ds_config
    from toolkit.errors import UserError
    from toolkit.planner import DEFAULT_MARGIN, nothing_fits_message, plan

    model, cluster = model_from_args(args), cluster_from_args(args)
    request = layout_request_from_args(args)
    fixed = request.model_dump(exclude_unset=True)
    margin = DEFAULT_MARGIN if args.memory_margin is None else args.memory_margin
    if not 0 <= margin < 1:
        raise UserError(f"--memory-margin: {margin} must be in [0, 1)")
    if args.tokens is not None and not args.tokens > 0:
        raise UserError(f"--tokens: {args.tokens:g} must be positive")
    scopes = scopes_from_args(args)
    global_batch = fixed.pop("global_batch_size", None)
    result = plan(model, cluster, fixed, global_batch=global_batch, margin=margin, scopes=scopes)
    if result is None:
        raise nothing_fits_message(model, cluster, fixed, global_batch, margin, scopes)
    data = plan_to_dict(result, build_ds_config(model, cluster, result.best.layout), args.tokens)
    if args.elastic:
        from toolkit.elastic import elastic_sizes, parse_range

        lo, hi = parse_range(args.elastic)
        sizes = elastic_sizes(model, cluster, result.best.layout, lo, hi, scopes)
        data["elastic"] = [
            {
                "world_size": s.world_size,
                "nodes": s.nodes,
                "gpus_per_node": s.gpus_per_node,
                "micro_batch_size": s.layout.micro_batch_size if s.layout else None,
                "gradient_accumulation_steps": s.layout.gradient_accumulation_steps if s.layout else None,
                "fits": s.fits,
                "tokens_per_s": s.tokens_per_s,
                "refused_because": s.reason,
            }
            for s in sizes
        ]
    if args.report:
        from toolkit.report import write_plan_report

        write_plan_report(args.report, model, cluster, result, data)
    if args.json:
        print_json(data)
        return 0
    from toolkit.report import print_estimate

    print_estimate(result.best.estimate, title=f"Plan for {model.name}")
    print("\nWhy:")
    for line in result.explanation:
        print(f"  - {line}")
    print(
        f"\nReproduce: dstk estimate --model {args.model or model.name} --cluster {args.cluster} "
        f"--nodes {cluster.nodes} {' '.join(result.best.layout.flags())}"
    )
    for s in data.get("elastic", []):
        if s["refused_because"] is None:
            print(
                f"  elastic world size {s['world_size']:>5}: {s['nodes']} × {s['gpus_per_node']}, micro "
                f"{s['micro_batch_size']}, accumulation {s['gradient_accumulation_steps']}, {s['tokens_per_s']:,.0f} tokens/s"
            )
        else:
            print(f"  elastic world size {s['world_size']:>5}: refused, {s['refused_because']}")
    if "training" in data:
        t = data["training"]
        print(f"Training {t['tokens']:.3g} tokens: {t['days']:.1f} days, {t['gpu_hours']:,.0f} GPU-hours")
    return 0
