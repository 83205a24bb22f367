"""`dstk plan`: the best layout for a model on a cluster, its DeepSpeed config and the reasons (pure)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from toolkit.commands import (
    add_allow_fp8_arg,
    add_cluster_args,
    add_layout_args,
    add_model_args,
    add_option_fields,
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
    from toolkit.plan.training_cost import CostRequest

    cost = parser.add_argument_group("training cost (with --tokens)")
    add_option_fields(cost, CostRequest, {"tokens": "N", "price_per_gpu_hour": "X", "mfu": "M", "pue": "P"})
    _add_output_args(parser)


def _add_output_args(parser: argparse.ArgumentParser) -> None:
    """What the answer holds besides the plan (a report, scaling rows, elastic sizes) and its format."""
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


def _job(args: argparse.Namespace) -> Any:
    """The flags as a PlanJob, every one checked before the search (a typo fails in milliseconds)."""
    from toolkit.errors import UserError
    from toolkit.integrations.plan_answer import PlanJob
    from toolkit.plan.query import DEFAULT_MARGIN, PlanQuery
    from toolkit.plan.training_cost import cost_inputs

    model, cluster = model_from_args(args), cluster_from_args(args)
    if args.target == "megatron-core":  # every layout would be refused for the same reason
        from toolkit.plan.core_rules import core_model_problem

        problem = core_model_problem(model, cluster)
        if problem:
            raise UserError(problem)
    margin = DEFAULT_MARGIN if args.memory_margin is None else args.memory_margin
    if not 0 <= margin < 1:
        raise UserError(f"--memory-margin: {margin} must be in [0, 1)")
    scopes = scopes_from_args(args)
    request = layout_request_from_args(args)
    query = PlanQuery.pinning(request, margin=margin, scopes=scopes, allow_fp8=args.allow_fp8)
    theirs = None
    if args.config is not None:
        from toolkit.integrations.ds_layout import estimate_config

        # the layout flags describe the config (they fill its "auto" fields); the plan searches freely for the
        # same job: the config's global batch
        theirs, notes = estimate_config(args.config, model, cluster, request, (args.tp, args.pp, args.sp))
        for note in notes:  # what the config left open and the estimate assumed, said once
            print(f"note: {note}", file=sys.stderr)
        batch = theirs.layout.global_batch_size
        query = PlanQuery(global_batch_size=batch, margin=margin, scopes=scopes, allow_fp8=args.allow_fp8)
    cost = cost_inputs(args.tokens, args.price_per_gpu_hour, args.mfu, args.pue)
    return PlanJob(
        model,
        cluster,
        query,
        job_flags(args),
        theirs,
        args.config,
        cost,
        _elastic(args),
        _scaling(args, cluster),
    )


def _elastic(args: argparse.Namespace) -> tuple[int, int] | None:
    from toolkit.plan.elastic import parse_range

    return parse_range(args.elastic) if args.elastic else None


def _scaling(args: argparse.Namespace, cluster: Any) -> list[int] | None:
    """The report's node counts: --scaling-nodes, else N/4, N/2, N and 2N with --report; else none."""
    from toolkit.plan.scaling import default_node_counts, parse_node_counts

    if args.scaling_nodes:
        return parse_node_counts(args.scaling_nodes)
    return default_node_counts(cluster.nodes) if args.report else None


def run(args: argparse.Namespace) -> int:
    if args.report is not None:
        from toolkit.paths import output_file

        output_file(args.report, "--report")  # before the search and the charts written beside it
    from toolkit.integrations.plan_answer import plan_answer

    job = _job(args)
    result, data = plan_answer(job)
    if args.report:
        from toolkit.report.render import write_plan_report

        write_plan_report(args.report, job.model, job.cluster, result, data)
    if args.json:
        print_json(data)
        return 0
    from toolkit.report.plan_text import print_plan

    print_plan(result, data, job.model.name, job.theirs, args.config)
    if args.report:
        print(f"Report: {args.report}")
    return 0
