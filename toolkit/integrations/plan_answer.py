"""`dstk plan`'s answer as one document: the chosen layout and its estimate, the DeepSpeed config that runs it,
the reasons and the alternatives, and — when asked — the training cost of a token budget, the elastic world
sizes and the strong-scaling rows. Its JSON is what `dstk plan --json` prints and what scripts read, so the
keys are a contract; the verb only parses flags into a `PlanJob` and prints. Pure: the planner, the cost model
and the config writer, each run once for the best layout."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolkit.integrations.ds_config import ConfigOptions, build_ds_config, recipe_line
from toolkit.plan.cost.estimate import Estimate
from toolkit.plan.planner import Plan, nothing_fits_message, plan
from toolkit.plan.query import PlanQuery
from toolkit.plan.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class PlanJob:
    """What `dstk plan` was asked: the job, the query, and the optional parts of the answer."""

    model: ModelSpec
    cluster: ClusterSpec
    query: PlanQuery
    job_flags: list[str]
    """The flags that describe the job (model, sequence length, cluster and its overrides), for the
    `estimate_command` that reproduces the plan's numbers."""
    theirs: Estimate | None = None
    config_path: Path | None = None
    cost: dict[str, Any] | None = None
    """Checked cost inputs (toolkit.plan.training_cost.cost_inputs), or None without --tokens."""
    elastic: tuple[int, int] | None = None
    scaling_nodes: list[int] | None = None


def plan_to_dict(result: Plan, ds_config: dict[str, Any], training: dict[str, Any] | None) -> dict[str, Any]:
    best = result.best
    out = {
        "layout": best.layout.model_dump(),
        "estimate": best.estimate.to_dict(),
        "ds_config": ds_config,
        "explanation": result.explanation,
        "alternatives": [
            {
                "layout": a.layout.model_dump(),
                "estimate": a.estimate.to_dict() if a.estimate else None,
                "rejected_because": a.rejected_because,
            }
            for a in result.alternatives
        ],
        "estimate_flags": best.layout.flags(),
        "searched": result.searched,
        "checkpoint": result.checkpoint.to_dict(),
    }
    if training is not None:
        out["training"] = training
    return out


def plan_answer(job: PlanJob) -> tuple[Plan, dict[str, Any]]:
    """The plan and its document (see the module docstring); a one-line UserError when nothing fits."""
    from toolkit.plan.training_cost import plan_training_cost

    model, cluster = job.model, job.cluster
    result = plan(model, cluster, job.query)
    if result is None:
        raise nothing_fits_message(model, cluster, job.query)
    best = result.best
    training = None if job.cost is None else plan_training_cost(job.cost, model, cluster, best)
    opts = None
    if job.cost is not None:
        # the schedule spans the token budget: warm-up and cosine decay are laid out over the whole run
        tokens_per_step = best.layout.global_batch_size * model.seq_length
        opts = ConfigOptions(train_steps=max(1, math.ceil(job.cost["tokens"] / tokens_per_step)))
    ds_config = build_ds_config(model, cluster, best.estimate, opts)
    data = plan_to_dict(result, ds_config, training)
    data["recipe"] = recipe_line(ds_config)
    # every input that changed the numbers: model (or --params) and sequence length, cluster and overrides
    data["estimate_command"] = ["dstk", "estimate", *job.job_flags, *best.layout.flags()]
    if job.theirs is not None:
        data["your_config"] = {"path": str(job.config_path), **job.theirs.to_dict()}
    if job.elastic is not None:
        data["elastic"] = elastic_rows(job, best.layout)
    if job.scaling_nodes is not None:
        from toolkit.plan.scaling import scaling_rows

        same_batch = job.query.model_copy(update={"global_batch_size": best.layout.global_batch_size})
        rows = scaling_rows(model, cluster, same_batch, node_counts=job.scaling_nodes)
        data["scaling"] = [asdict(r) for r in rows]
    return result, data


def elastic_rows(job: PlanJob, layout: Any) -> list[dict[str, Any]]:
    """The world sizes in `job.elastic` that keep the plan's global batch exact, and how each would run."""
    from toolkit.plan.elastic import elastic_sizes

    assert job.elastic is not None
    lo, hi = job.elastic
    return [
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
        for s in elastic_sizes(job.model, job.cluster, layout, lo, hi, job.query.scopes)
    ]
