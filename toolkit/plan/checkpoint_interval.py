"""Checkpoint cost, the checkpoint tiers and their intervals that minimise expected lost time (pure).

A DeepSpeed checkpoint holds the module weights in the training dtype and the optimizer's fp32 state: 2Ψ +
12Ψ bytes in mixed precision (16-bit weights; fp32 master, m, v), 4Ψ + 8Ψ in fp32 at ZeRO-0 and 4Ψ + 12Ψ at
ZeRO ≥ 1 (whose fp32 partition is saved beside the weights). All nodes write in parallel at
`storage_gb_per_s` each. With a job-level MTBF M (node MTBF / nodes) and a write time δ, the interval that
minimises expected waste is Daly's (2006) refinement of Young's (1974) τ = √(2δM): τ = √(2δM) − δ, for δ < M/2.

Asynchronous saves (toolkit.run.async_ckpt; CheckFreq, Mohan et al., FAST '21) stall training only for the
copy of the node's share to host memory, δₐ = bytes per node / copy bandwidth (each GPU's PCIe link, bounded
by half the host memory bandwidth, a copy reading and writing it; on CPU that half alone), while the write (δ
above) goes on in the background: the next save waits for it, so τ ≥ δ, and a failure redoes τ/2 plus the δ
during which the newest checkpoint was not yet complete. First order (Young): τₐ = √(2δₐM), waste
δₐ/τₐ + (τₐ/2 + δ)/M.

Shared-memory snapshots (toolkit.run.tiers; Gemini, Wang et al., SOSP '23, keeps them in CPU memory) survive
the failures that leave the node up — a fraction f of them; the others need the disk tier. They are
pipelined (CheckFreq's snapshot overlapped with the next iteration): the writer copies the live state into
/dev/shm while the next forward and backward run, and the optimizer's step waits only for what is left, so
their stall is δₘ = max(0, δₐ − the step's forward/backward time) on an accelerator; on the CPU accelerator
the writer takes cores from the ranks, and δₘ = δₐ. Minimising δₐ/τ_d + δₘ/τₘ + fτₘ/(2M) + (1−f)(τ_d/2 +
δ)/M term by term gives τₘ = √(2δₘM/f) (at least a step, and the copy: one snapshot in flight) and τ_d =
√(2δₐM/(1−f)) (no shorter than δ or τₘ). dstk's snapshots are node-local, so single-node jobs only. Host
memory: the disk tier's snapshot, and the shared-memory tier's newest snapshot beside the one being written
(3 per node with both tiers), beside what offloaded states take; where one does not fit, saves stay
synchronous.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.cost.memory import HOST_USABLE
from toolkit.plan.layout import Layout
from toolkit.plan.params import count_params
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.units import GIB, as_bytes, format_bytes

MEMORY_RECOVERABLE = 0.23
"""Share of job interruptions that leave the nodes and their memory up, so a shared-memory snapshot recovers
them: software bugs (12.9 %), network switches and cables (8.4 %) and NCCL watchdog timeouts (1.7 %) of Llama
3's 419 unexpected interruptions (Dubey et al. 2024, Table 5); the GPU, memory and host failures that make up
most of the rest take the node down or out of the job."""


@dataclass(frozen=True)
class CheckpointPlan:
    bytes: float
    write_s: float
    job_mtbf_s: float
    interval_s: float
    interval_steps: int
    """The disk tier's interval in steps, of the scheme chosen (`asynchronous`)."""
    expected_waste: float
    """Fraction of wall time lost to writing checkpoints and redoing work after failures (chosen scheme)."""
    sync_interval_steps: int = 0
    sync_waste: float = 0.0
    snapshot_s: float = 0.0
    """Training stall of one asynchronous save: the copy to host memory."""
    memory_snapshot_s: float = 0.0
    """Training stall of one pipelined shared-memory snapshot: the copy the next forward/backward does not hide."""
    asynchronous: bool = False
    """The host holds a snapshot per tier beside the offloaded states: saves are asynchronous."""
    snapshot_interval_steps: int = 0
    """Shared-memory snapshots every K steps (0: none — multi-node, or synchronous saves)."""
    snapshot_host_bytes: float = 0.0
    """Host memory per node the snapshots need (the disk tier's in flight; the shared-memory tier's newest and
    the one being written)."""
    tiered_snapshot_steps: int = 0
    tiered_waste: float = 0.0
    """The shared-memory tier's best interval and the waste with it, whether chosen or not (0: not possible —
    several nodes, or no host memory for a second snapshot)."""

    def to_dict(self) -> dict[str, float]:
        """JSON: every field, byte figures in whole bytes."""
        return {k: as_bytes(v) if k.endswith("bytes") else v for k, v in self.__dict__.items()}


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


def _steps(seconds: float, step_time_s: float) -> int:
    return max(1, round(seconds / step_time_s))


def checkpoint_plan(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    step_time_s: float,
    host_bytes_per_node: float = 0.0,
    overlap_s: float | None = None,
) -> CheckpointPlan:
    """The checkpoint scheme for this layout; `host_bytes_per_node`: host memory the layout already takes
    (offloaded states), which the snapshots must fit beside; `overlap_s`: the part of a step before the
    optimizer's update, which hides a pipelined snapshot's copy (default: the whole step)."""
    size = checkpoint_bytes(model, layout)
    per_node = size / cluster.nodes
    write_s = per_node / (cluster.storage_gb_per_s * 1e9)
    mtbf_s = cluster.node_mtbf_hours * 3600 / cluster.nodes
    steps = _steps(optimal_interval_s(write_s, mtbf_s), step_time_s)
    tau = steps * step_time_s
    # waste per interval: the write itself, plus on failure (probability ~ tau/M) half an interval redone and
    # the checkpoint read back (at the write bandwidth)
    sync_waste = min(write_s / (tau + write_s) + (tau + write_s) / (2 * mtbf_s) + write_s / mtbf_s, 1.0)
    host_gb_per_s = cluster.cpu_memory_gb_per_s / 2  # a copy reads and writes host memory
    if cluster.accelerator != "cpu":
        host_gb_per_s = min(host_gb_per_s, cluster.gpus_per_node * cluster.pcie_gb_per_s)
    snapshot_s = per_node / (host_gb_per_s * 1e9)
    hidden = 0.0 if cluster.accelerator == "cpu" else step_time_s if overlap_s is None else overlap_s
    memory_s = max(0.0, snapshot_s - hidden)
    sync = CheckpointPlan(
        size, write_s, mtbf_s, tau, steps, sync_waste, steps, sync_waste, snapshot_s, memory_s
    )
    usable = HOST_USABLE * cluster.cpu_memory_gib * GIB - host_bytes_per_node
    if per_node > usable:
        return sync
    options = [_tiers((snapshot_s, memory_s), write_s, mtbf_s, 0.0, step_time_s)]
    if cluster.nodes == 1 and 3 * per_node <= usable:  # node-local snapshots
        options.append(_tiers((snapshot_s, memory_s), write_s, mtbf_s, MEMORY_RECOVERABLE, step_time_s))
    waste, disk_steps, snap_steps = min(options)
    tiered = options[1] if len(options) > 1 else (0.0, 0, 0)
    return CheckpointPlan(
        bytes=size,
        write_s=write_s,
        job_mtbf_s=mtbf_s,
        interval_s=disk_steps * step_time_s,
        interval_steps=disk_steps,
        expected_waste=min(waste, 1.0),
        sync_interval_steps=steps,
        sync_waste=sync_waste,
        snapshot_s=snapshot_s,
        memory_snapshot_s=memory_s,
        asynchronous=True,
        snapshot_interval_steps=snap_steps,
        snapshot_host_bytes=per_node * (3 if snap_steps else 1),
        tiered_snapshot_steps=tiered[2],
        tiered_waste=tiered[0],
    )


def _tiers(
    stalls: tuple[float, float], write_s: float, mtbf_s: float, f: float, step_time_s: float
) -> tuple[float, int, int]:
    """(waste, disk steps, snapshot steps) of asynchronous saves (stall δₐ) with a shared-memory tier (stall
    δₘ) recovering a fraction f of failures (f = 0: none). The tier pays when the disk interval is held up by a
    slow persist (τ_d = δ) or read-back dominates; otherwise its extra stalls cost more than it saves."""
    stall_s, memory_s = stalls
    disk_steps = _steps(max(math.sqrt(2 * stall_s * mtbf_s / (1 - f)), write_s), step_time_s)
    tau_d = disk_steps * step_time_s
    # a failure the disk tier recovers redoes half an interval, the persist lag and the read-back
    waste = stall_s / tau_d + (1 - f) * (tau_d / 2 + 2 * write_s) / mtbf_s
    if f == 0:
        return waste, disk_steps, 0
    # one snapshot in flight: the next starts once the previous copy is written
    snap_steps = _steps(max(math.sqrt(2 * memory_s * mtbf_s / f), stall_s), step_time_s)
    if snap_steps >= disk_steps:  # no more often than the disk tier: it adds stalls and saves nothing
        return math.inf, disk_steps, snap_steps
    tau_m = snap_steps * step_time_s
    return waste + memory_s / tau_m + f * (tau_m / 2 + stall_s) / mtbf_s, disk_steps, snap_steps


def _snapshots_held(ckpt: CheckpointPlan) -> str:
    return (
        "the disk tier's, and the shared-memory tier's newest beside the one being written"
        if ckpt.snapshot_interval_steps
        else "the disk tier's, until it is written"
    )


def checkpoint_lines(ckpt: CheckpointPlan, cluster: ClusterSpec) -> list[str]:
    """The plan explanation's checkpoint lines: the synchronous scheme, and the tiers chosen when they fit."""
    per_node = ckpt.bytes / cluster.nodes
    share = f" ({format_bytes(per_node, 1)} per node)" if cluster.nodes > 1 else ""
    sync = (
        f"Checkpoints: {format_bytes(ckpt.bytes, 1)} each{share}, {ckpt.write_s:.3g} s to write at "
        f"{cluster.storage_gb_per_s:g} GB/s per node (cluster figure: storage_gb_per_s); job MTBF "
        f"{ckpt.job_mtbf_s / 3600:.3g} h (cluster figure: node_mtbf_hours / nodes). Synchronous: "
        f"save every {ckpt.sync_interval_steps} steps (Young/Daly), {ckpt.sync_waste:.2%} of the time lost to "
        "saving and redoing work."
    )
    if not ckpt.asynchronous:
        return [sync + " Saves stay synchronous: the host has no room for a snapshot beside what it holds."]
    tiers = f"disk every {ckpt.interval_steps} steps"
    if ckpt.snapshot_interval_steps:
        tiers += (
            f", shared-memory snapshot every {ckpt.snapshot_interval_steps} steps (--snapshot-every; pipelined"
            f" with the next step, stalling {ckpt.memory_snapshot_s:.3g} s)"
        )
    lines = [
        sync,
        f"Asynchronous (dstk train --async-save): each save stalls training {ckpt.snapshot_s:.3g} s (the copy "
        f"of {format_bytes(per_node, 1)} per node to host memory) and persists in the background; {tiers}: "
        f"{ckpt.expected_waste:.2%} of the time lost. Snapshots hold {format_bytes(ckpt.snapshot_host_bytes, 1)} "
        f"of host memory per node ({_snapshots_held(ckpt)}).",
    ]
    if not ckpt.snapshot_interval_steps:
        recovers = f"it recovers the {MEMORY_RECOVERABLE:.0%} of failures that leave the node up"
        lines.append(
            f"No shared-memory tier: its best interval ({ckpt.tiered_snapshot_steps} steps; {recovers}) is no "
            "shorter than the disk tier's."
            if ckpt.tiered_snapshot_steps and math.isinf(ckpt.tiered_waste)
            else f"No shared-memory tier: at its best interval ({ckpt.tiered_snapshot_steps} steps; {recovers}) "
            f"it would lose {ckpt.tiered_waste:.2%}."
            if ckpt.tiered_snapshot_steps
            else "No shared-memory tier: its snapshots are node-local and this job spans several nodes."
            if cluster.nodes > 1
            else "No shared-memory tier: the host has no room for its two snapshots beside the disk tier's."
        )
    return lines
