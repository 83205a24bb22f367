"""Strong scaling: the same job (model, query, global batch) re-planned at other node counts, for `dstk plan
--scaling-nodes` and the report's scaling table and chart (pure). Beside `elastic`, which asks the other
question about world sizes: which ones keep the global batch exact."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.planner import plan
from toolkit.plan.query import PlanQuery


@dataclass(frozen=True)
class ScalingRow:
    nodes: int
    gpus: int
    layout: str | None
    tokens_per_s: float | None
    mfu: float | None
    efficiency: float | None
    """(tokens/s per GPU) / (tokens/s per GPU at the smallest node count that fits)."""
    reason: str | None = None


def parse_node_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise UserError(
            f"--scaling-nodes: {text!r} must be a comma-separated list of node counts, e.g. 8,16,32"
        )
    return counts


def default_node_counts(nodes: int) -> list[int]:
    """A quarter, half, the planned and twice the planned node count (whole nodes only)."""
    return sorted({nodes, nodes * 2} | {nodes // f for f in (2, 4) if nodes % f == 0})


def scaling_rows(
    model: Any,
    cluster: Any,
    query: PlanQuery,
    *,
    node_counts: list[int],
) -> list[ScalingRow]:
    """Re-plan at each node count with the same query, global batch included (strong scaling)."""
    raw = []
    for n in node_counts:
        sized = cluster.model_copy(update={"nodes": n, "hostnames": None})
        result = plan(model, sized, query)
        raw.append((n, sized.world_size, result))
    base = next(((n, r.best.estimate.tokens_per_s) for n, _, r in raw if r is not None), None)
    rows = []
    for n, gpus, result in raw:
        if result is None or base is None:
            why = f"no layout fits with global batch {query.global_batch_size}"
            rows.append(ScalingRow(n, gpus, None, None, None, None, why))
            continue
        est = result.best.estimate
        eff = (est.tokens_per_s / n) / (base[1] / base[0])
        rows.append(ScalingRow(n, gpus, est.layout.describe(short=True), est.tokens_per_s, est.mfu, eff))
    return rows
