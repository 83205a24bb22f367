"""The collective cost model against NCCL's own tuning model and published nccl-tests figures."""

from __future__ import annotations

import pytest

from toolkit.plan.cost import comm
from toolkit.plan.load import load_cluster


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
