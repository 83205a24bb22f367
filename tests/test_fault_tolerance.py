"""Fault tolerance, each fault injected for real: a checkpoint killed mid-write is never loaded; a truncated
shard or another tokenizer is one line before any rank starts. (A killed rank, signals to the launcher and
resharding through the universal checkpoint are measured against the shared ZeRO runs in
tests/test_zero_runs.py.)"""

from __future__ import annotations

import re

import pytest

from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import launch


@pytest.mark.multiprocess
def test_checkpoint_killed_mid_write_is_never_loaded(tmp_path, prepared_data, init_weights):
    cfg = zero_config(tmp_path / "z2.json", 2)
    common = [
        "--init-from",
        str(init_weights),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--save-every",
        "2",
        "--no-async-save",  # the synchronous path; the asynchronous one: tests/test_zero_runs.py
    ]
    dead = launch(
        tmp_path / "a", cfg, train_args(prepared_data, 6, *common, "--fault-after-save-shards", "4")
    )
    assert dead.code != 0
    step4 = tmp_path / "ckpt" / "step00000004"
    assert (
        step4.is_dir() and any(step4.glob("*optim_states.pt")) and not (step4 / "dstk_manifest.json").exists()
    )
    again = launch(tmp_path / "b", cfg, train_args(prepared_data, 6, *common, "--resume", "auto"))
    assert again.code == 0, again.output[-4000:]
    assert "step00000004: skipped, no manifest" in again.output
    assert "at step 2" in again.output and again.summary["final_step"] == 6


@pytest.mark.parametrize("fault", ["truncated-shard", "other-tokenizer"])
def test_a_bad_data_shard_is_one_line_before_any_rank_starts(tmp_path, prepared_data, fault) -> None:
    """A copy of the prepared data with its train shard cut short by 100 bytes, or its tokenizer.json edited
    after tokenizing: `dstk launch` (no --dry-run) refuses it in one line naming the file, exit 2, and no rank
    started (no heartbeat, no launch log)."""
    import shutil

    from tests.cli import dstk

    data = tmp_path / "data"
    shutil.copytree(prepared_data, data)
    if fault == "truncated-shard":
        (shard,) = (data / "train").glob("*.arrow")
        shard.write_bytes(shard.read_bytes()[:-100])
        pattern = rf"^dstk launch: error: --data: {re.escape(str(shard))} has [\d,]+ bytes, the manifest says"
    else:
        shard = data / "tokenizer" / "tokenizer.json"
        shard.write_text(shard.read_text().replace('"<|pad|>"', '"<|PAD|>"', 1))
        pattern = (
            rf"^dstk launch: error: --data: {re.escape(str(shard))} does not match the manifest's SHA-256"
        )
    cfg = zero_config(tmp_path / "z0.json", 0)
    run = tmp_path / "run"
    r = dstk("launch", "--cluster", "cpu", "--gpus-per-node", "2", "--config", str(cfg), "--run-dir",
             str(run / "launch"), "--", *train_args(data, STEPS, "--run-dir", str(run)))  # fmt: skip
    lines = [x for x in r.err.splitlines() if x.strip() and "[WARNING]" not in x]
    assert r.code == 2 and len(lines) == 1 and re.search(pattern, lines[0]), r.err[-2000:]
    assert not (run / "heartbeat").exists() and not (run / "launch" / "launch_events.jsonl").exists()
