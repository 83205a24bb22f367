"""`dstk plan`: the best layout for a model on a cluster, its DeepSpeed config and the reasons (pure)."""

from __future__ import annotations

import argparse
import math
import shlex
from pathlib import Path
from typing import Any

from toolkit.commands import (
    add_allow_fp8_arg,
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_target_arg,
    cluster_from_args,
    job_flags,
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
    add_allow_fp8_arg(parser)
    parser.add_argument(
        "--config",
        type=Path,
        metavar="DS_JSON",
        help="compare the plan with an existing DeepSpeed config, planned at its global batch; layout flags then "
        'describe the config (filling its "auto" fields) instead of constraining the plan',
    )
    parser.add_argument(
        "--memory-margin",
        type=float,
        default=None,
        metavar="F",
        help="fraction of GPU memory kept free (default 0.10)",
    )
    cost = parser.add_argument_group("training cost (with --tokens)")
    cost.add_argument(
        "--tokens",
        metavar="N",
        help="training tokens (300e9, 3e11, 300B, 1.5T): adds time to train, GPU-hours, energy and cost",
    )
    cost.add_argument(
        "--price-per-gpu-hour",
        type=float,
        metavar="X",
        help="price of one GPU-hour, for the cost (any currency)",
    )
    cost.add_argument(
        "--mfu",
        metavar="M",
        help="take the time from this model FLOPs utilisation (0.45 or 45%%), in the convention of the plan's "
        "own MFU: (6·N + 12·L·H·Q·T)·D / (GPUs · peak · MFU), instead of from the plan's predicted tokens/s",
    )
    cost.add_argument(
        "--pue",
        type=float,
        metavar="P",
        help="datacenter power usage effectiveness for the energy (default 1.1, Patterson et al. 2021)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="F",
        help="also write a Markdown report to F, with memory and scaling charts (PNG) beside it",
    )
    parser.add_argument(
        "--scaling-nodes",
        metavar="LIST",
        help="node counts of the report's scaling table, e.g. 8,16,32 (default: N/4, N/2, N, 2N)",
    )
    parser.add_argument(
        "--elastic",
        metavar="MIN..MAX",
        help="also list the world sizes in MIN..MAX that keep the global batch exact",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


def plan_to_dict(plan: Any, ds_config: dict[str, Any], training: dict[str, Any] | None) -> dict[str, Any]:
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
    if training is not None:
        out["training"] = training
    return out


def _cost_inputs(args: argparse.Namespace) -> dict[str, Any] | None:
    """The validated cost flags (before any search, so a typo fails fast), or None without --tokens."""
    from toolkit.errors import UserError
    from toolkit.report.cost import DEFAULT_PUE, parse_mfu, parse_tokens

    if args.tokens is None:
        for flag in ("price_per_gpu_hour", "mfu", "pue"):
            if getattr(args, flag) is not None:
                raise UserError(
                    f"--{flag.replace('_', '-')}: needs --tokens (the cost is for a token budget)"
                )
        return None
    price = args.price_per_gpu_hour
    if price is not None and not (price >= 0 and math.isfinite(price)):
        raise UserError(f"--price-per-gpu-hour: {price:g} must be a non-negative number")
    pue = DEFAULT_PUE if args.pue is None else args.pue
    if not 1 <= pue < 10:
        raise UserError(f"--pue: {pue:g} must be in [1, 10): facility energy over IT energy, e.g. 1.1")
    return {
        "tokens": parse_tokens(args.tokens),
        "mfu": None if args.mfu is None else parse_mfu(args.mfu),
        "pue": pue,
        "price_per_gpu_hour": price,
    }


def _training(inputs: dict[str, Any], model: Any, cluster: Any, best: Any) -> dict[str, Any]:
    """The `training` block: time, GPU-hours, energy and cost of the token budget (toolkit.report.cost)."""
    from toolkit.plan.cost.flops import matmul_params
    from toolkit.report.cost import training_cost

    cost = training_cost(
        flops_per_token=best.estimate.model_flops_per_token,
        n_params=matmul_params(model),
        gpus=best.layout.world_size,
        peak_flops_per_gpu=best.estimate.peak_flops,
        plan_tokens_per_s=best.estimate.tokens_per_s,
        gpu_power_w=cluster.gpu_power_w,
        **inputs,
    )
    return cost.to_dict()


def run(args: argparse.Namespace) -> int:
    if args.report is not None:
        from toolkit.paths import output_file

        output_file(args.report, "--report")  # before the search and the charts written beside it
    from toolkit.errors import UserError
    from toolkit.integrations.ds_config import build_ds_config, recipe_line
    from toolkit.plan.planner import nothing_fits_message, plan
    from toolkit.plan.query import DEFAULT_MARGIN, PlanQuery

    model, cluster = model_from_args(args), cluster_from_args(args)
    margin = DEFAULT_MARGIN if args.memory_margin is None else args.memory_margin
    if not 0 <= margin < 1:
        raise UserError(f"--memory-margin: {margin} must be in [0, 1)")
    scopes = scopes_from_args(args)
    request = layout_request_from_args(args)
    query = PlanQuery.pinning(request, margin=margin, scopes=scopes, allow_fp8=args.allow_fp8)
    theirs = None
    if args.config is not None:
        from toolkit.commands.estimate import estimate_config

        # the layout flags describe the config (they fill its "auto" fields); the plan searches freely for the
        # same job: the config's global batch
        theirs = estimate_config(args.config, model, cluster, request, (args.tp, args.pp, args.sp))
        query = PlanQuery(
            global_batch_size=theirs.layout.global_batch_size,
            margin=margin,
            scopes=scopes,
            allow_fp8=args.allow_fp8,
        )
    cost_inputs = _cost_inputs(args)
    if args.scaling_nodes:
        from toolkit.report.cost import parse_node_counts

        parse_node_counts(args.scaling_nodes)
    result = plan(model, cluster, query)
    if result is None:
        raise nothing_fits_message(model, cluster, query)
    training = None if cost_inputs is None else _training(cost_inputs, model, cluster, result.best)
    opts = None
    if cost_inputs is not None:
        from toolkit.integrations.ds_config import ConfigOptions

        # the schedule spans the token budget: warm-up and cosine decay are laid out over the whole run
        tokens_per_step = result.best.layout.global_batch_size * model.seq_length
        opts = ConfigOptions(train_steps=max(1, math.ceil(cost_inputs["tokens"] / tokens_per_step)))
    ds_config = build_ds_config(model, cluster, result.best.layout, opts)
    data = plan_to_dict(result, ds_config, training)
    data["recipe"] = recipe_line(ds_config)
    # every input that changed the numbers: model (or --params) and sequence length, cluster and overrides
    data["estimate_command"] = ["dstk", "estimate", *job_flags(args), *result.best.layout.flags()]
    if theirs is not None:
        data["your_config"] = {"path": str(args.config), **theirs.to_dict()}
    if args.elastic:
        from toolkit.plan.elastic import elastic_sizes, parse_range

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
    if args.report or args.scaling_nodes:
        from dataclasses import asdict

        from toolkit.report.cost import default_node_counts, parse_node_counts, scaling_rows

        counts = (
            parse_node_counts(args.scaling_nodes)
            if args.scaling_nodes
            else default_node_counts(cluster.nodes)
        )
        same_batch = query.model_copy(update={"global_batch_size": result.best.layout.global_batch_size})
        rows = scaling_rows(model, cluster, same_batch, node_counts=counts)
        data["scaling"] = [asdict(r) for r in rows]
    if args.report:
        from toolkit.report.render import write_plan_report

        write_plan_report(args.report, model, cluster, result, data)
    if args.json:
        print_json(data)
        return 0
    from toolkit.report.render import print_estimate

    print_estimate(result.best.estimate, title=f"Plan for {model.name}")
    print("\nWhy:")
    for line in result.explanation:
        print(f"  - {line}")
    if theirs is not None:
        print(f"\n{_comparison(args.config, theirs, result.best.estimate)}")
    print(f"\nOptimisation recipe: {data['recipe']}")
    print(f"\nReproduce: {shlex.join(data['estimate_command'])}")
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
        how = "at --mfu" if t["time_source"] == "mfu" else "at the planned tokens/s"
        cost = f", cost {t['cost']:,.0f}" if t["cost"] is not None else ""
        print(
            f"Training {t['tokens']:.3g} tokens ({t['training_flops']:.3g} model FLOPs, (6·N + 12·L·H·Q·T)·D): "
            f"{t['days']:.1f} days {how} (MFU {t['mfu']:.1%}), {t['gpu_hours']:,.0f} GPU-hours, "
            f"{t['energy_kwh'] / 1000:,.1f} MWh (PUE {t['pue']:g}){cost}"
        )
    for r in data.get("scaling", []):
        if r["tokens_per_s"] is None:
            print(f"  scaling {r['nodes']:>5} nodes: {r['reason']}")
        else:
            print(
                f"  scaling {r['nodes']:>5} nodes: {r['tokens_per_s']:,.0f} tokens/s, efficiency "
                f"{r['efficiency']:.1%} ({r['layout']})"
            )
    if args.report:
        print(f"Report: {args.report}")
    return 0


def _comparison(path: Path, theirs: Any, ours: Any) -> str:
    """One paragraph: the user's config beside the plan, and what differs between them."""
    from toolkit.plan.units import format_bytes

    def said(e: Any) -> str:
        fits = "" if e.fits else " (does not fit)"
        # an MFU is a share of one precision's peak: name it, or fp32's 68 % reads as better than bf16's 62 %
        return (
            f"{format_bytes(e.memory.total, 1)} per GPU, {e.tokens_per_s:,.0f} tokens/s, MFU {e.mfu:.1%} of "
            f"the {e.layout.precision} peak{fits}"
        )

    mine, plan = theirs.layout.model_dump(), ours.layout.model_dump()
    changed = [f"{k} {mine[k]} → {plan[k]}" for k in mine if mine[k] != plan[k] and k != "dp"]
    speed = ours.tokens_per_s / theirs.tokens_per_s if theirs.tokens_per_s else float("inf")
    return (
        f"Your config ({path.name}): {theirs.layout.describe()}: {said(theirs)}.\n"
        f"dstk's plan: {ours.layout.describe()}: {said(ours)} ({speed:.2f}× the tokens/s); "
        + ("the same layout." if not changed else "it changes " + ", ".join(changed) + " (see Why).")
    )
