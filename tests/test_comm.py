"""The collective cost model against NCCL's own tuning model and published nccl-tests figures."""

from __future__ import annotations

import pytest

from toolkit.plan.cost import comm
from toolkit.plan.load import load_cluster, load_model


def test_latency_is_what_nccl_printed_for_24_h100s() -> None:
    """NCCL printed `128 Bytes -> Algo 0 proto 0 time 25.214764` (tree, LL) for an all-reduce over 3 nodes × 8
    H100s (NVIDIA/nccl issue #1453): its tuning model, which comm.nccl_latency_us reproduces."""
    g = comm.Group(size=24, per_node=8)
    assert comm.nccl_latency_us("all_reduce", "tree", 0, g) == pytest.approx(25.2, abs=0.05)


def test_small_and_medium_messages_at_scale_pay_ll128_not_simple_latency() -> None:
    """A 30 MB all-gather over 512 H100s: NCCL's fastest protocol is LL128 (~1.1 ms of latency over 511 ring
    steps), not Simple's 14 µs network steps (~2.4 ms); on A100, where NCCL keeps LL128 off the network, the
    same call costs more."""
    h100, a100 = load_cluster("dgx-h100", {"nodes": 64}), load_cluster("dgx-a100-80g", {"nodes": 64})
    g = comm.group(512, 1, h100)
    simple = comm.nccl_latency_us("all_gather", "ring", 2, g) * 1e-6
    t = comm.all_gather_s(30e6, g, h100)
    assert 1.0e-3 < t < 1.5e-3 < simple
    assert comm.all_gather_s(30e6, comm.group(512, 1, a100), a100) > 1.5 * t


def test_big_messages_are_bandwidth_bound_and_all_reduce_in_a_node_runs_nvls() -> None:
    """8 GiB all-reduce on one DGX H100 node: NVLink SHARP's ~480 GB/s bus bandwidth (nccl-tests issue #347:
    479.4 GB/s), so 2·7/8·8 GiB / 480 GB/s plus microseconds."""
    c = load_cluster("dgx-h100")
    g = comm.group(8, 1, c)
    size = 8 * 2**30
    assert comm.all_reduce_s(size, g, c) == pytest.approx(2 * 7 / 8 * size / 480e9, rel=0.01)


def test_pat_runs_only_with_one_rank_per_node() -> None:
    one_per_node, eight_per_node = comm.Group(size=128, per_node=1), comm.Group(size=1024, per_node=8)
    assert comm.nccl_latency_us("reduce_scatter", "pat", 2, one_per_node) is not None
    assert comm.nccl_latency_us("reduce_scatter", "pat", 2, eight_per_node) is None
    assert comm.nccl_latency_us("all_reduce", "pat", 2, one_per_node) is None


# ------------------------------------------------------------------ NVLink domains larger than a node, xGMI


def test_a_group_across_the_trays_of_an_nvl72_rack_runs_over_nvlink() -> None:
    """GB200 NVL72: 18 trays of 4 GPUs, one NVLink domain of 72. An all-reduce over the whole rack runs at the
    NVLink bus bandwidth (CoreWeave's nccl-tests: 835 GB/s at 8 GiB on 72 GPUs), not at the 4 NICs of a tray
    that the same group would get with the trays joined by InfiniBand only."""
    rack = load_cluster("gb200-nvl72")
    trays = rack.model_copy(update={"nvlink_domain_gpus": None})  # the same 18 nodes, no NVLink between them
    g, g_ib = comm.group(72, 1, rack), comm.group(72, 1, trays)
    assert (g.per_node, g.spans_nodes) == (72, False) and (g_ib.per_node, g_ib.spans_nodes) == (4, True)
    assert comm.bandwidth_bytes_per_s(g, rack) == 835e9
    assert comm.bandwidth_bytes_per_s(g_ib, trays) == 4 * 48e9
    size = 8 * 2**30
    # 142 ring steps of NVLink latency on top (~0.5 ms)
    assert comm.all_reduce_s(size, g, rack) == pytest.approx(2 * 71 / 72 * size / 835e9, rel=0.03)
    assert comm.all_reduce_s(size, g_ib, trays) > 3 * comm.all_reduce_s(size, g, rack)
    # NCCL's latency model sees one node: NVLink steps only (no network step in the ring)
    assert comm.nccl_latency_us("all_gather", "ring", 2, g) == pytest.approx(8.4 + 71 * 3.4)


def test_only_groups_that_span_racks_cross_the_network() -> None:
    """Two racks (--nodes 36): a group with members in both crosses InfiniBand, each rack's 72 NICs in
    parallel (CoreWeave: 810-820 GB/s on 144 GPUs at 16 GiB); tensor-parallel groups over two trays and pipeline
    neighbours a tray apart stay on NVLink, neighbours a rack apart do not."""
    two = load_cluster("gb200-nvl72", {"nodes": 36})
    g = comm.group(144, 1, two)
    assert (g.per_node, g.spans_nodes) == (72, True)
    assert comm.bandwidth_bytes_per_s(g, two) == min(835e9, 72 * 48e9)
    tp8 = comm.group(8, 1, two)
    assert not tp8.spans_nodes and comm.bandwidth_bytes_per_s(tp8, two, "all_gather") == 740e9
    assert not comm.crosses_network(4, two) and not comm.crosses_network(32, two)
    assert comm.crosses_network(72, two) and comm.crosses_network(8, load_cluster("dgx-b200"))


def test_an_nvl72_step_gains_over_the_same_trays_on_infiniband() -> None:
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.layout import LayoutRequest
    from toolkit.plan.rules import resolve_layout

    model = load_model("llama-7b")
    rack = load_cluster("gb200-nvl72")
    trays = rack.model_copy(update={"nvlink_domain_gpus": None})
    request = LayoutRequest(zero_stage=1, micro_batch_size=1)
    nvl, ib = (estimate(model, c, resolve_layout(model, c, request)) for c in (rack, trays))
    assert nvl.time.total_s < ib.time.total_s


def test_xgmi_full_mesh_gives_a_group_one_link_per_peer() -> None:
    """8 MI300X on xGMI: a pair has one of each GPU's 7 links, so a 2-GPU group gets 1/7 of the 8-GPU bus
    bandwidth and a 4-GPU group 3/7 (all-reduce busbw measured 47.7 GB/s on 2 GPUs, 312.9 on 8; stas00/
    ml-engineering network/README.md); on NVSwitch every group gets the same."""
    amd, nv = load_cluster("mi300x-8"), load_cluster("dgx-b200")
    for size, share in ((2, 1 / 7), (4, 3 / 7), (8, 1.0)):
        g = comm.group(size, 1, amd)
        assert comm.bandwidth_bytes_per_s(g, amd) == pytest.approx(313e9 * share)
        assert comm.bandwidth_bytes_per_s(comm.group(size, 1, nv), nv, "all_gather") == 740e9
    assert comm.bandwidth_bytes_per_s(comm.group(2, 1, amd), amd) == pytest.approx(47.7e9, rel=0.07)
    assert comm.p2p_s(1e9, False, amd) == pytest.approx(1e9 / (313e9 / 7) + 10e-6)
    # a tensor-parallel pair on MI300X pays for it against the whole node
    pair, node = comm.group(2, 1, amd), comm.group(8, 1, amd)
    assert comm.all_to_all_s(1e9, pair, amd) > comm.all_to_all_s(1e9, node, amd)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nvlink_domain_gpus": 70}, "not a whole number of nodes"),
        ({"nvlink_domain_gpus": 16, "intra_node_topology": "full_mesh"}, "a full_mesh \\(xGMI\\) node"),
    ],
)
def test_nvlink_domains_are_whole_nodes(fields, message) -> None:
    from toolkit.plan.specs import ClusterSpec

    base = load_cluster("dgx-b200").model_dump()
    with pytest.raises(ValueError, match=message):
        ClusterSpec.model_validate({**base, **fields})
