"""Cost of collectives over a process group placed on a cluster (alpha-beta model).

Bandwidth terms follow the ring algorithms NCCL and gloo use (Patarasuk & Yuan 2009; Thakur et al. 2005):
an all-reduce of S bytes over n ranks moves 2(n-1)/n · S per rank, an all-gather or reduce-scatter
(n-1)/n · S, where S is the full (gathered) size.

Placement decides the bandwidth. A group inside one node runs at the intra-node (NVLink) bandwidth. A group
with k members on each of several nodes is bound by the slower of NVLink and the k NICs its members own on
every node: `min(intra, k · inter)`. This is why a data-parallel group with one GPU per node (TP = 8) gets
one NIC's bandwidth while the same group with TP = 1 gets all eight (nccl-tests on DGX A100 show ~190 GB/s
all-reduce bus bandwidth across nodes with 8 × 200 Gb/s HDR, i.e. 8 NICs).

On GPUs each call costs what NCCL's own tuning model says (src/graph/tuning.cc, NCCL 2.30.7): for every
algorithm it may run (ring; tree for all-reduce; PAT for all-gather and reduce-scatter with one rank per
node) and every protocol (LL, LL128, Simple), a latency — a base plus a per-step latency over NVLink and over
the network, steps being 2(n-1) for a ring all-reduce, n-1 for a ring all-gather, a chain inside the node and
log2(nodes) across for the tree — and a bandwidth — the bus bandwidth times what the protocol carries (LL:
half, capped across nodes; LL128: 120 of every 128 bytes; Simple: all) — and NCCL runs the fastest. So a
30 MB all-gather over 512 H100s costs 1.2 ms (ring/LL128), not the 2.5 ms of Simple's 14 µs network steps:
small and medium messages at scale pay LL/LL128 latencies. `collective_latency_us` adds the host's cost of
issuing one call. Bucketed communication pays the latency once per bucket, which is why ZeRO-3 with small
buckets does not scale to thousands of ranks (ZeRO++ hpZ, larger buckets, FSDP's one gather per block).

On the CPU accelerator (gloo) the per-call cost is the calibrated `collective_latency_us` plus NCCL's ring
Simple step latencies, as measured against the calibration.

"Node" here means an NVLink domain (`ClusterSpec.nvlink_domain`): one node, or on GB200/GB300 NVL72 the 18
trays of 4 GPUs one NVSwitch fabric joins. NCCL reaches the GPUs of another tray in the domain through the same
P2P transport it uses inside a node ("the code paths still use the P2P transport like multi-GPU single node
systems", NVIDIA/nccl issue #1159, multi-node NVLink since NCCL 2.20), so a group inside the domain runs at the
NVLink figures, its steps are NVLink steps, and only a group that spans domains pays the network. On a node
whose GPUs are a mesh rather than a switch (`intra_node_topology: full_mesh`, AMD's xGMI: one link per pair of
the 8 GPUs) a group with g members in the node drives g−1 of each GPU's 7 links, so its NVLink-side bandwidth
is (g−1)/7 of the 8-GPU figure (all-reduce bus bandwidth 47.7 GB/s on 2 MI300X, 312.9 on 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.specs import ClusterSpec


@dataclass(frozen=True)
class Group:
    """A process group: its size and how many of its members share each NVLink domain (a node, or an NVL72
    rack of several nodes: module docstring)."""

    size: int
    per_node: int

    @property
    def spans_nodes(self) -> bool:
        """Whether the group crosses the network, i.e. spans NVLink domains."""
        return self.size > self.per_node


def _members_per(domain: int, size: int, stride: int) -> int:
    """Members of a group of `size` ranks `stride` apart that fall in one block of `domain` consecutive ranks."""
    return max(1, min(size, domain // stride)) if stride < domain else 1


def group(size: int, stride: int, cluster: ClusterSpec) -> Group:
    """A group of `size` ranks spaced `stride` apart in rank order (nodes, and NVLink domains, hold consecutive
    ranks).

    DeepSpeed and Megatron order ranks TP-innermost, then sequence/data parallel, then pipeline, so the
    TP group has stride 1, the DP group stride tp·sp, and pipeline neighbours stride tp·sp·dp; ZeRO's group
    (data- and sequence-parallel ranks together, Layout.zero_dp) has stride tp.
    """
    return Group(size=size, per_node=_members_per(cluster.nvlink_domain, size, stride))


def crosses_network(stride: int, cluster: ClusterSpec) -> bool:
    """Whether ranks `stride` apart (pipeline neighbours) are in different NVLink domains."""
    return stride >= cluster.nvlink_domain


def _mesh_share(g: Group, cluster: ClusterSpec) -> float:
    """The share of the 8-GPU bandwidth a group gets inside a full-mesh node: (members in the node − 1) /
    (gpus_per_node − 1); 1 behind a switch."""
    gpn = cluster.gpus_per_node
    if cluster.intra_node_topology != "full_mesh" or gpn <= 1:
        return 1.0
    return (min(g.per_node, gpn) - 1) / (gpn - 1) if g.per_node > 1 else 1.0


def intra_bandwidth_gb_per_s(g: Group, cluster: ClusterSpec, op: str) -> float:
    """The NVLink-side (or xGMI) bus bandwidth of collective `op` for the group's members in one domain, GB/s."""
    base = (cluster.collective_bus_gb_per_s or {}).get(op, cluster.intra_node_gb_per_s)
    return base * _mesh_share(g, cluster)


def bandwidth_bytes_per_s(g: Group, cluster: ClusterSpec, op: str = "all_reduce") -> float:
    """Per-rank bus bandwidth of collective `op` over the group, in bytes/s."""
    intra = intra_bandwidth_gb_per_s(g, cluster, op) * 1e9
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
    """All-reduce of `nbytes` in `calls` buckets: NCCL's fastest algorithm and protocol per call on GPUs;
    ring bandwidth with tree latency on the CPU accelerator."""
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    if cluster.accelerator != "cpu":
        return nccl_s("all_reduce", nbytes, g, cluster, calls)
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
    if cluster.accelerator != "cpu":
        return nccl_s(op, nbytes, g, cluster, calls)
    bandwidth = (g.size - 1) / g.size * nbytes / bandwidth_bytes_per_s(g, cluster, op)
    return bandwidth + ring_latency_s(g, cluster, calls)


# NCCL 2.30.7 src/graph/tuning.cc:150-175, per protocol (LL, LL128, Simple), microseconds: the base latency of
# a call and the latency of one step over NVLink and over the network (InfiniBand plugin)
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}
NVLINK_STEP_US = {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0), "pat": (0.0, 0.0, 4.0)}
NET_STEP_US = {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0), "pat": (0.0, 0.0, 14.0)}
NET_OVERHEAD_US = 1.0
"""tuning.cc:226-233: a network step costs at least this host overhead (Intel hosts; 2 µs on AMD), ×3 for
Simple."""
# tuning.cc:327-337: the share of the bus bandwidth each protocol carries (LL: an 8-byte flag per 8-byte word;
# LL128: 120 payload bytes of every 128), the tree's and PAT's own factors, and LL's cap across nodes
# (`llMaxBws`, Intel host rows: 39.0, 39.0, 20.4 GB/s for 1, 2 and ≥ 3 nodes; Hopper in one node 141.0)
PROTOCOL_BW = (0.5, 0.92, 1.0)
TREE_BW = 0.92
PAT_BW = 0.75
LL_CAP_GB_PER_S = {1: 141.0, 2: 39.0, 3: 20.4}
RING_PLATEAU = 1.4
"""tuning.cc:647-650: a multi-node ring/Simple all-reduce of large messages takes 1.4× its latency."""


def _log2i(n: int) -> int:
    return math.floor(math.log2(n)) if n > 0 else 0


def nccl_latency_us(op: str, algorithm: str, protocol: int, g: Group) -> float | None:
    """NCCL's latency of one call (tuning.cc:384-435), or None where the algorithm does not run: the tree is
    all-reduce's only, PAT all-gather's and reduce-scatter's with one rank per node (tuning.cc:215-223),
    and PAT and the tree have no LL/LL128 rows here."""
    nodes, ppn, n = _nodes(g), g.per_node if g.spans_nodes else g.size, g.size
    if algorithm == "tree" and op != "all_reduce":
        return None
    if algorithm == "pat" and (op == "all_reduce" or ppn != 1 or nodes == 1 or protocol != 2):
        return None
    base = BASE_US[algorithm][protocol]
    intra = NVLINK_STEP_US[algorithm][protocol]
    # a group with one rank per node prices its network steps at the tree's latency (tuning.cc:387-388)
    inter = NET_STEP_US["tree" if ppn == 1 else algorithm][protocol]
    if algorithm == "ring":
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        crossings = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
        floor = NET_OVERHEAD_US * (3 if protocol == 2 else 1) if nodes > 1 else 0.0
        lat = base + (steps - crossings) * max(intra, floor) + crossings * inter
        return lat * (RING_PLATEAU if op == "all_reduce" and nodes > 1 and protocol == 2 else 1.0)
    if algorithm == "tree":
        return base + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    return base + _log2i(nodes) * inter / 3.5 + n * 2.8  # PAT: "still a linear part"


def nccl_s(op: str, nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """`calls` NCCL calls moving `nbytes` in all, each run with the algorithm and protocol NCCL's model finds
    fastest for its size (tuning.cc: ncclTopoGetAlgoTime, `time = latency + bytes / bandwidth`)."""
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    n, per_call = g.size, nbytes / max(calls, 1)
    volume = (2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n) * per_call
    bus = bandwidth_bytes_per_s(g, cluster, op)
    cap = LL_CAP_GB_PER_S[min(_nodes(g), 3)] * 1e9
    best = math.inf
    for algorithm in ("ring", "tree", "pat"):
        factor = {"ring": 1.0, "tree": TREE_BW, "pat": PAT_BW}[algorithm]
        for protocol in range(3):
            lat = nccl_latency_us(op, algorithm, protocol, g)
            if lat is None or (protocol == 1 and g.spans_nodes and not cluster.nccl_ll128_across_nodes):
                continue
            bw = bus * factor * PROTOCOL_BW[protocol]
            bw = min(bw, cap) if protocol == 0 else bw
            best = min(best, (lat + cluster.collective_latency_us) * 1e-6 + volume / bw)
    return max(calls, 1) * best


def all_to_all_s(nbytes: float, g: Group, cluster: ClusterSpec, calls: float = 1) -> float:
    """All-to-all where each rank sends `nbytes` in total (an equal share to every member).

    The share for members on the same node crosses NVLink, the rest crosses the rank's own NIC; both go at
    once, so the slower of the two bounds the call.
    """
    if g.size <= 1 or nbytes <= 0:
        return 0.0
    intra_part = nbytes * (g.per_node - 1) / g.size
    inter_part = nbytes * (g.size - g.per_node) / g.size
    intra = intra_bandwidth_gb_per_s(g, cluster, "all_to_all")
    t = max(
        intra_part / (intra * 1e9),
        inter_part / (cluster.inter_node_gb_per_s * 1e9) if inter_part else 0.0,
    )
    return t + ring_latency_s(g, cluster, calls)


def p2p_s(nbytes: float, crosses_nodes: bool, cluster: ClusterSpec) -> float:
    """One point-to-point send between pipeline neighbours (`crosses_nodes`: in different NVLink domains,
    `crosses_network`); a pair in a full-mesh node has one of each GPU's links."""
    if nbytes <= 0:
        return 0.0
    intra = cluster.intra_node_gb_per_s * _mesh_share(Group(2, 2), cluster)
    bw = (cluster.inter_node_gb_per_s if crosses_nodes else intra) * 1e9
    return nbytes / bw + cluster.collective_latency_us * 1e-6
