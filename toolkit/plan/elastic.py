"""Elastic world sizes: which ranks counts keep the global batch exact, and how each would run (pure).

DeepSpeed 0.19.x removed its `elasticity` block (issue #8489), so dstk owns the arithmetic: for a planned
layout with global batch G, a world size W works when its data-parallel degree dp = W / (tp·pp·sp) divides
G and some micro-batch (the planned one, else the largest power of two that does) divides G/dp; the
accumulation steps take up the rest, so every size sees the same samples per step. A job moves between sizes
by checkpointing, `dstk checkpoint convert` (universal format) and relaunching with the config for the new
size (`dstk config ... --gpus-per-node/--nodes`), which `dstk train --resume auto` picks up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.errors import UserError
from toolkit.plan.layout import Layout, LayoutRequest, data_parallel_size
from toolkit.plan.rules import resolve_layout
from toolkit.plan.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class ElasticSize:
    world_size: int
    nodes: int
    gpus_per_node: int
    layout: Layout | None
    fits: bool
    tokens_per_s: float
    reason: str | None
    """Why this size is refused (None when it is listed)."""


def parse_range(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)) or int(m.group(2)) > 1_000_000:
        raise UserError(f"--elastic: {text!r} is not MIN..MAX with 1 <= MIN <= MAX (e.g. 8..64)")
    return int(m.group(1)), int(m.group(2))


def cluster_for(cluster: ClusterSpec, world: int) -> ClusterSpec | None:
    """The cluster with `world` ranks: whole nodes, or one partly used node."""
    gpn = cluster.gpus_per_node
    if world < gpn:
        return cluster.model_copy(update={"nodes": 1, "gpus_per_node": world, "hostnames": None})
    if world % gpn:
        return None
    return cluster.model_copy(update={"nodes": world // gpn, "hostnames": None})


def elastic_sizes(
    model: ModelSpec, cluster: ClusterSpec, base: Layout, lo: int, hi: int, scopes: tuple[str, ...]
) -> list[ElasticSize]:
    from toolkit.plan.cost.estimate import estimate

    out = []
    mp = base.tp * base.pp * base.sp
    for world in range(lo, hi + 1):
        c = cluster_for(cluster, world)
        if c is None:
            out.append(
                ElasticSize(
                    world, 0, 0, None, False, 0.0, f"not whole nodes of {cluster.gpus_per_node} ranks"
                )
            )
            continue
        if world % mp:
            out.append(
                ElasticSize(
                    world, c.nodes, c.gpus_per_node, None, False, 0.0, f"not divisible by tp·pp·sp = {mp}"
                )
            )
            continue
        dp = data_parallel_size(world, base.tp, base.pp, base.sp)
        if base.global_batch_size % dp:
            out.append(
                ElasticSize(
                    world,
                    c.nodes,
                    c.gpus_per_node,
                    None,
                    False,
                    0.0,
                    f"global_batch_size({base.global_batch_size}) is not divisible by dp({dp})",
                )
            )
            continue
        per_rank = base.global_batch_size // dp
        micro = (
            base.micro_batch_size
            if per_rank % base.micro_batch_size == 0
            else max(
                d
                for d in range(1, per_rank + 1)
                if per_rank % d == 0 and d & (d - 1) == 0 and d <= base.micro_batch_size
            )
        )
        fields = base.model_dump(include=set(LayoutRequest.model_fields))
        fields.update(
            micro_batch_size=micro, global_batch_size=base.global_batch_size, gradient_accumulation_steps=None
        )
        try:
            layout = resolve_layout(model, c, LayoutRequest(**fields), scopes)
        except UserError as exc:
            out.append(ElasticSize(world, c.nodes, c.gpus_per_node, None, False, 0.0, str(exc)))
            continue
        est = estimate(model, c, layout)
        out.append(
            ElasticSize(
                world,
                c.nodes,
                c.gpus_per_node,
                layout,
                est.fits,
                est.tokens_per_s,
                None if est.fits else "does not fit in memory",
            )
        )
    return out
