"""The checkpoint scheme the planner picks (toolkit.plan.checkpoint_interval): synchronous Young/Daly, and
asynchronous saves with an optional shared-memory tier, chosen from the stall each costs — pure, no torch."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from tests.cli import dstk
from toolkit.plan.checkpoint_interval import MEMORY_RECOVERABLE, checkpoint_lines
from toolkit.plan.cost.estimate import estimate
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.planner import plan
from toolkit.plan.query import PlanQuery


def _plan(model: str, cluster: str, **overrides: float):
    c = load_cluster(cluster, overrides)
    p = plan(load_model(model), c, PlanQuery())
    assert p is not None
    return p, c


@pytest.mark.parametrize(
    ("model", "cluster", "overrides"),
    [
        ("llama-7b", "dgx-a100-80g", {}),
        ("llama-7b", "dgx-a100-80g", {"nodes": 4}),
        ("llama-70b", "dgx-h100", {"nodes": 64}),
        ("gpt2", "dgx-a100-40g", {"node_mtbf_hours": 50}),
    ],
)
def test_asynchronous_saves_lose_less_than_synchronous_ones(model, cluster, overrides) -> None:
    p, _ = _plan(model, cluster, **overrides)
    ck = p.checkpoint
    assert ck.asynchronous and ck.snapshot_s < ck.write_s
    assert ck.expected_waste < ck.sync_waste
    # a save waits for the previous persist: the disk interval is never shorter than the write
    assert ck.interval_steps * p.best.estimate.time.total_s >= ck.write_s * 0.999
    text = " ".join(p.explanation)
    assert (
        f"save every {ck.sync_interval_steps} steps" in text
        and f"disk every {ck.interval_steps} steps" in text
    )
    assert f"{ck.expected_waste:.2%} of the time lost" in text and f"{ck.sync_waste:.2%}" in text


def test_the_stall_is_the_copy_to_host_memory() -> None:
    p, c = _plan("llama-7b", "dgx-a100-80g")
    ck = p.checkpoint
    # one node: its share is the whole checkpoint, copied over 8 PCIe links (bounded by host memory)
    rate = min(c.cpu_memory_gb_per_s / 2, c.gpus_per_node * c.pcie_gb_per_s)
    assert ck.snapshot_s == pytest.approx(ck.bytes / (rate * 1e9))
    assert ck.write_s == pytest.approx(ck.bytes / (c.storage_gb_per_s * 1e9))


def test_the_shared_memory_tier_is_chosen_only_where_it_pays() -> None:
    from toolkit.plan.checkpoint_interval import checkpoint_plan

    fast, c = _plan("llama-7b", "dgx-a100-80g")
    # the step hides the pipelined copy: snapshots cost no stall, and recover 23 % of failures from memory
    assert fast.checkpoint.memory_snapshot_s == 0 and fast.checkpoint.snapshot_interval_steps >= 1
    # where nothing hides it, a fast persist makes the disk tier alone better
    est = fast.best.estimate
    bare = checkpoint_plan(est.model, c, est.layout, est.time.total_s, overlap_s=0.0)
    assert bare.snapshot_interval_steps == 0 and bare.tiered_snapshot_steps >= bare.interval_steps
    slow, c = _plan("llama-7b", "dgx-a100-80g", storage_gb_per_s=0.01, node_mtbf_hours=100)
    ck = slow.checkpoint
    # a persist of hours holds the disk interval up; snapshots recover the failures that leave the node up
    assert 0 < ck.snapshot_interval_steps < ck.interval_steps and ck.expected_waste < ck.sync_waste
    # the disk tier's snapshot in flight; the shared-memory tier's newest beside the one being written
    assert ck.snapshot_host_bytes == pytest.approx(3 * ck.bytes)
    lines = checkpoint_lines(ck, c)
    # pipelined: the step's forward and backward hide the copy
    assert ck.memory_snapshot_s < ck.snapshot_s and "pipelined with the next step" in lines[1]
    assert f"shared-memory snapshot every {ck.snapshot_interval_steps} steps" in lines[1]
    several, c = _plan("llama-7b", "dgx-a100-80g", storage_gb_per_s=0.01, node_mtbf_hours=100, nodes=2)
    assert several.checkpoint.snapshot_interval_steps == 0  # node-local snapshots: single-node jobs only
    assert "spans several nodes" in " ".join(checkpoint_lines(several.checkpoint, c))
    assert 0 < MEMORY_RECOVERABLE < 1


def test_a_pipelined_snapshot_stalls_for_the_copy_the_step_does_not_hide() -> None:
    from toolkit.plan.checkpoint_interval import checkpoint_plan

    p, gpu = _plan("llama-7b", "dgx-a100-80g")
    model, layout = p.best.estimate.model, p.best.layout
    copy = checkpoint_plan(model, gpu, layout, 10.0, overlap_s=0.0).snapshot_s
    assert checkpoint_plan(model, gpu, layout, 10.0, overlap_s=0.0).memory_snapshot_s == pytest.approx(copy)
    part = checkpoint_plan(model, gpu, layout, 10.0, overlap_s=copy / 4)
    assert part.memory_snapshot_s == pytest.approx(copy * 3 / 4)
    assert checkpoint_plan(model, gpu, layout, 10.0, overlap_s=copy * 2).memory_snapshot_s == 0.0
    # on the CPU accelerator the writer takes the ranks' cores: nothing is hidden
    small, cpu = _plan("gpt2", "cpu")
    ck = checkpoint_plan(small.best.estimate.model, cpu, small.best.layout, 10.0)
    assert ck.memory_snapshot_s == ck.snapshot_s > 0


def test_no_room_for_a_snapshot_keeps_saves_synchronous() -> None:
    model, cluster = load_model("llama-7b"), load_cluster("dgx-a100-80g", {"cpu_memory_gib": 64})
    p = plan(model, cluster, PlanQuery())
    assert p is not None
    ck = p.best.estimate.checkpoint_plan()
    assert not ck.asynchronous and ck.interval_steps == ck.sync_interval_steps
    assert ck.expected_waste == ck.sync_waste
    assert "the host has no room for a snapshot" in " ".join(p.explanation)


def test_on_the_cpu_accelerator_the_ranks_memory_is_host_memory() -> None:
    cluster = load_cluster("cpu")
    est = estimate(load_model("gpt2"), cluster, plan(load_model("gpt2"), cluster, PlanQuery()).best.layout)
    in_use = est.memory.total * cluster.gpus_per_node + est.memory.cpu_per_node
    ck = est.checkpoint_plan()
    room = 0.9 * cluster.cpu_memory_gib * 2**30 - in_use
    assert ck.asynchronous == (ck.bytes <= room)


def test_dstk_config_writes_the_tiers_dstk_train_reads(tmp_path) -> None:
    out = tmp_path / "ds.json"
    r = dstk("config", "--model", "llama-7b", "--cluster", "dgx-a100-80g", "-o", str(out))
    assert r.code == 0, r.err
    block = json.loads(out.read_text())["dstk"]
    from toolkit.plan.layout import Layout

    layout = Layout(**block["layout"])
    ck = estimate(load_model("llama-7b"), load_cluster("dgx-a100-80g"), layout).checkpoint_plan()
    assert block["checkpoint"] == {
        "asynchronous": ck.asynchronous,
        "snapshot_interval_steps": ck.snapshot_interval_steps,
    }
    assert block["checkpoint_interval_steps"] == ck.interval_steps and ck.asynchronous
    assert math.isfinite(ck.expected_waste)
    from toolkit.integrations.dstk_block import read_dstk_block
    from toolkit.run.preflight import checkpoint_tiers

    args = argparse.Namespace(async_save=None, snapshot_every=None, checkpoint_dir=tmp_path)
    planned = (True, ck.snapshot_interval_steps)
    assert checkpoint_tiers(args, read_dstk_block(json.loads(out.read_text()))) == planned
    args = argparse.Namespace(async_save=False, snapshot_every=3, checkpoint_dir=tmp_path)
    assert checkpoint_tiers(args, read_dstk_block(json.loads(out.read_text()))) == (False, 3)
