"""Checkpoint cost and the checkpoint interval that minimises expected lost time (pure).

A DeepSpeed checkpoint holds the module weights in the training dtype and the optimizer's fp32 state: 2Ψ +
12Ψ bytes in mixed precision (16-bit weights; fp32 master, m, v), 4Ψ + 8Ψ in fp32 at ZeRO-0 and 4Ψ + 12Ψ at
ZeRO ≥ 1 (whose fp32 partition is saved beside the weights). All nodes write in parallel at
`storage_gb_per_s` each. With a job-level MTBF M (node MTBF / nodes) and a write time δ, the interval that
minimises expected waste is Daly's (2006) refinement of Young's (1974) τ = √(2δM): τ = √(2δM) − δ, for δ < M/2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.layout import Layout
from toolkit.plan.params import count_params
from toolkit.plan.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class CheckpointPlan:
    bytes: float
    write_s: float
    job_mtbf_s: float
    interval_s: float
    interval_steps: int
    expected_waste: float
    """Fraction of wall time lost to writing checkpoints and redoing work after failures."""

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def checkpoint_bytes(model: ModelSpec, layout: Layout) -> float:
    psi = count_params(model).total
    if layout.precision == "fp32":
        return psi * (12 if layout.zero_stage == 0 else 16)
    return psi * 14


def optimal_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly 2006, eq. 37 (first order): √(2δM) − δ, and M itself when δ ≥ M/2."""
    if write_s >= mtbf_s / 2:
        return mtbf_s
    return math.sqrt(2 * write_s * mtbf_s) - write_s


def checkpoint_plan(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, step_time_s: float
) -> CheckpointPlan:
    size = checkpoint_bytes(model, layout)
    write_s = size / (cluster.nodes * cluster.storage_gb_per_s * 1e9)
    mtbf_s = cluster.node_mtbf_hours * 3600 / cluster.nodes
    interval = optimal_interval_s(write_s, mtbf_s)
    steps = max(1, round(interval / step_time_s))
    tau = steps * step_time_s
    # waste per interval: the write itself, plus on failure (probability ~ tau/M) half an interval redone
    waste = write_s / (tau + write_s) + (tau + write_s) / (2 * mtbf_s)
    return CheckpointPlan(
        bytes=size,
        write_s=write_s,
        job_mtbf_s=mtbf_s,
        interval_s=tau,
        interval_steps=steps,
        expected_waste=min(waste, 1.0),
    )
