"""The pieces of asynchronous checkpoints that need no second process (toolkit.run.async_ckpt, the tiers'
naming): the snapshot is a copy, files appear whole, a writer's failure reaches the training thread, and a
checkpoint is committed only once every rank's files are durable. Multi-rank behaviour (kills inside a
persist, resumes from a snapshot) is in tests/test_zero_runs.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from toolkit.run.async_ckpt import MARKER, Persister, PersistJob, durable_save, snapshot
from toolkit.run.checkpoint import MANIFEST, check, memory_tier, newest_complete, write_manifest


def test_a_snapshot_is_a_copy_training_may_change_at_once() -> None:
    weight = torch.ones(4)
    state = {"module": {"w": weight, "view": weight[:2]}, "steps": [1, (2, torch.zeros(1))], "name": "x"}
    copy = snapshot(state)
    weight.add_(1)
    assert torch.equal(copy["module"]["w"], torch.ones(4)) and torch.equal(
        copy["module"]["view"], torch.ones(2)
    )
    assert copy["module"]["view"].untyped_storage().size() == 2 * 4  # a view is saved alone, not its storage
    assert copy["steps"][0] == 1 and isinstance(copy["steps"][1], tuple) and copy["name"] == "x"
    assert copy["module"] is not state["module"] and copy["steps"] is not state["steps"]


def test_durable_save_leaves_only_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    durable_save({"x": torch.arange(3)}, path)
    assert torch.equal(torch.load(path)["x"], torch.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]  # the temporary name is gone


def test_a_writer_failure_reaches_the_training_thread(tmp_path: Path) -> None:
    writer = Persister(log=lambda _: None)
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    writer.submit(PersistJob(tmp_path, [(blocked / "x.pt", {"a": 1})], rank=0, world=1))
    with pytest.raises(RuntimeError, match="an asynchronous checkpoint write failed"):
        writer.wait()
    writer.submit(PersistJob(tmp_path / "t", [(tmp_path / "t" / "ok.pt", {"a": 1})], rank=0, world=1))
    writer.wait()  # the writer goes on after a failure it reported
    assert (tmp_path / "t" / MARKER.format(rank=0)).is_file()
    writer.close()


def test_rank_zero_commits_only_once_every_rank_is_durable(tmp_path: Path) -> None:
    tag = tmp_path / "step00000002"
    committed = threading.Event()

    def commit() -> None:
        write_manifest(tag, {"tag": tag.name, "step": 2})
        committed.set()

    zero, one = Persister(log=lambda _: None), Persister(log=lambda _: None)
    zero.submit(PersistJob(tag, [(tag / "rank0.pt", {"r": 0})], rank=0, world=2, complete=commit))
    assert not committed.wait(0.3)  # rank 1's files are not durable yet
    assert check(tag) is not None
    one.submit(PersistJob(tag, [(tag / "rank1.pt", {"r": 1})], rank=1, world=2))
    zero.wait()
    one.wait()
    assert committed.is_set() and check(tag) is None
    assert set(p.name for p in tag.iterdir()) >= {"rank0.pt", "rank1.pt", MANIFEST}
    # the markers are not part of the checkpoint: the manifest lists the two files alone
    import json

    assert set(json.loads((tag / MANIFEST).read_text())["files"]) == {"rank0.pt", "rank1.pt"}
    zero.close()
    one.close()


def test_the_memory_tier_is_named_after_the_checkpoint_directory(tmp_path: Path) -> None:
    a, b = memory_tier(tmp_path / "a"), memory_tier(tmp_path / "b")
    assert a != b and a.parent == Path("/dev/shm") and memory_tier(tmp_path / "a") == a
    assert newest_complete(tmp_path / "a") == []


def test_a_pool_reuses_its_buffers_from_one_snapshot_to_the_next() -> None:
    from toolkit.run.async_ckpt import SnapshotPool

    pool, weight = SnapshotPool(), torch.ones(3)
    pool.start()
    first = snapshot({"w": weight, "b": torch.zeros(2)}, pool)
    weight.add_(1)
    pool.start()
    second = snapshot({"w": weight, "b": torch.zeros(2)}, pool)
    assert second["w"].data_ptr() == first["w"].data_ptr() and torch.equal(second["w"], torch.full((3,), 2.0))
    pool.start()
    third = snapshot({"w": torch.ones(5), "b": torch.zeros(2)}, pool)  # another shape: a new buffer
    assert third["w"].shape == (5,) and third["b"].data_ptr() == first["b"].data_ptr()


def test_a_pipelined_save_holds_tensors_and_copies_the_rest_now() -> None:
    """`hold`: the writer reads the tensors before the next optimizer step, but the objects around them (a
    loss scaler, counters) may change earlier, so they are copied at the save."""
    from toolkit.run.async_ckpt import hold

    class Scaler:
        def __init__(self) -> None:
            self.cur_scale = 1024.0

    weight, scaler = torch.ones(3), Scaler()
    held = hold({"w": weight, "scaler": scaler, "steps": [1, 2]})
    assert held["w"].data_ptr() == weight.data_ptr()  # no copy on the training thread
    scaler.cur_scale = 512.0
    assert held["scaler"].cur_scale == 1024.0 and held["steps"] == [1, 2]


def test_a_pipelined_save_releases_the_step_even_when_its_write_fails(tmp_path: Path) -> None:
    released = threading.Event()
    job = PersistJob(
        tmp_path / "step1", [(tmp_path / "step1", {"w": torch.ones(2)})], 0, 1, released=released
    )
    (tmp_path / "step1").mkdir()  # a directory where the file should go: the write fails
    with pytest.raises(OSError):
        job.run(threading.Event())
    assert released.is_set()


def test_snapshots_keep_tuple_types_that_deepspeed_reads_back() -> None:
    """ZeRO-3 model states hold each parameter's shape as a `torch.Size`; DeepSpeed's zero_to_fp32 (under `dstk
    export`) calls `.numel()` on it. A snapshot or a pipelined hold that made it a plain tuple broke the export
    of every asynchronous ZeRO-3 checkpoint; named tuples keep their type too."""
    from collections import namedtuple

    from toolkit.run.async_ckpt import hold, snapshot

    Pair = namedtuple("Pair", "a b")
    state = {"param_shapes": [{"w": torch.Size([4, 2])}], "pair": Pair(torch.ones(1), 2), "plain": (1, 2)}
    for copy in (snapshot(state), hold(state)):
        shape = copy["param_shapes"][0]["w"]
        assert type(shape) is torch.Size and shape.numel() == 8
        assert type(copy["pair"]) is Pair and copy["pair"].b == 2
        assert type(copy["plain"]) is tuple and copy["plain"] == (1, 2)
