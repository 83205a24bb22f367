"""Cost of collectives over a process group placed on a cluster (alpha-beta model).

Bandwidth terms follow the ring algorithms NCCL and gloo use (Patarasuk & Yuan 2009; Thakur et al. 2005):
an all-reduce of S bytes over n ranks moves 2(n-1)/n · S per rank, an all-gather or reduce-scatter
(n-1)/n · S, where S is the full (gathered) size.

Placement decides the bandwidth. A group inside one node runs at the intra-node (NVLink) bandwidth. A group
with k members on each of several nodes is bound by the slower of NVLink and the k NICs its members own on
every node: `min(intra, k · inter)`. This is why a data-parallel group with one GPU per node (TP = 8) gets
one NIC's bandwidth while the same group with TP = 1 gets all eight (nccl-tests on DGX A100 show ~190 GB/s
all-reduce bus bandwidth across nodes with 8 × 200 Gb/s HDR, i.e. 8 NICs).

Latency follows NCCL's own cost model (src/graph/tuning.cc): a base cost per call (`collective_latency_us`)
plus a per-hop cost; training moves bucket-sized messages, for which NCCL picks its Simple protocol, whose
per-hop latencies are 3.4 µs over NVLink and 14 µs over the network (ring).
Rings (all-gather, reduce-scatter, all-to-all) pay one hop per member, so a 3,072-rank all-gather costs
milliseconds however small; all-reduce uses NCCL's double binary tree for latency, 2·log2 hops. Bucketed
communication pays the latency once per bucket, which is why ZeRO-3 does not scale to thousands of ranks
without hierarchy (ZeRO++ hpZ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.specs import ClusterSpec


@dataclass(frozen=True)
class Group:
    """A process group: its size and how many of its members share each node."""

    size: int
    per_node: int

    @property
    def spans_nodes(self) -> bool:
        return self.size > self.per_node


def group(size: int, stride: int, cluster: ClusterSpec) -> Group:
    """A group of `size` ranks spaced `stride` apart in rank order (nodes hold consecutive ranks).

    DeepSpeed and Megatron order ranks TP-innermost, then sequence/data parallel, then pipeline, so the
    TP group has stride 1, the DP group stride tp·sp, and pipeline neighbours stride tp·sp·dp.
    """
    gpn = cluster.gpus_per_node
    per_node = max(1, min(size, gpn // stride)) if stride < gpn else 1
    return Group(size=size, per_node=per_node)


def bandwidth_bytes_per_s(g: Group, cluster: ClusterSpec, op: str = "all_reduce") -> float:
    """Per-rank bus bandwidth of collective `op` over the group, in bytes/s."""
    intra = (cluster.collective_bus_gb_per_s or {}).get(op, cluster.intra_node_gb_per_s) * 1e9
    if not g.spans_nodes:
        return intra
    return min(intra, g.per_node * cluster.inter_node_gb_per_s * 1e9)


INTRA_HOP_US = 3.4
"""Per-hop latency over NVLink/NVSwitch (NCCL tuning.cc hwLat, ring, Simple protocol)."""
INTER_HOP_US = 14.0
"""Per-hop latency over the network (NCCL tuning.cc hwLat, ring, Simple protocol)."""


def _nodes(g: Group) -> int:
    return math.ceil(g.size / g.per_node)


def ring_latency_s(g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """One hop per member: network hops between nodes, NVLink hops inside them."""
    if g.size <= 1:
        return 0.0
    nodes = _nodes(g)
    inter = nodes if nodes > 1 else 0
    hops_us = inter * INTER_HOP_US + (g.size - inter) * INTRA_HOP_US
    return calls * (cluster.collective_latency_us + hops_us) * 1e-6


def tree_latency_s(g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """Up and down a binary tree: 2·log2 hops over nodes (network) and within a node (NVLink)."""
    if g.size <= 1:
        return 0.0
    nodes = _nodes(g)
    hops_us = 2 * (
        math.ceil(math.log2(nodes)) * INTER_HOP_US + math.ceil(math.log2(g.per_node)) * INTRA_HOP_US
    )
    return calls * (cluster.collective_latency_us + hops_us) * 1e-6


def all_reduce_s(nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """All-reduce of `nbytes` in `calls` buckets: ring bandwidth, tree latency."""
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    bandwidth = 2 * (g.size - 1) / g.size * nbytes / bandwidth_bytes_per_s(g, cluster, "all_reduce")
    return bandwidth + tree_latency_s(g, cluster, calls)


def all_gather_s(nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """All-gather whose gathered result is `nbytes`, in `calls` buckets (rings)."""
    return _ring_s("all_gather", nbytes, g, cluster, calls)


def reduce_scatter_s(nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """Reduce-scatter of `nbytes` (the full, unscattered size), in `calls` buckets (rings)."""
    return _ring_s("reduce_scatter", nbytes, g, cluster, calls)


def _ring_s(op: str, nbytes: float, g: Group, cluster: ClusterSpec, calls: float) -> float:
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    bandwidth = (g.size - 1) / g.size * nbytes / bandwidth_bytes_per_s(g, cluster, op)
    return bandwidth + ring_latency_s(g, cluster, calls)


def all_to_all_s(nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """All-to-all where each rank sends `nbytes` in total (an equal share to every member).

    The share for members on the same node crosses NVLink, the rest crosses the rank's own NIC; both go at
    once, so the slower of the two bounds the call.
    """
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    intra_part = nbytes * (g.per_node - 1) / g.size
    inter_part = nbytes * (g.size - g.per_node) / g.size
    intra = (cluster.collective_bus_gb_per_s or {}).get("all_to_all", cluster.intra_node_gb_per_s)
    t = max(
        intra_part / (intra * 1e9),
        inter_part / (cluster.inter_node_gb_per_s * 1e9) if inter_part else 0.0,
    )
    return t + ring_latency_s(g, cluster, calls)


def p2p_s(nbytes: float, crosses_nodes: bool, cluster: ClusterSpec) -> float:
    """One point-to-point send between pipeline neighbours."""
    if nbytes <= 0:
        return 0.0
    bw = (cluster.inter_node_gb_per_s if crosses_nodes else cluster.intra_node_gb_per_s) * 1e9
    return nbytes / bw + cluster.collective_latency_us * 1e-6
