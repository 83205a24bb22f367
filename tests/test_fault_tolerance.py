"""Fault tolerance on real processes: a checkpoint killed mid-write is never loaded. (A killed rank, signals
to the launcher and resharding through the universal checkpoint are measured against the shared ZeRO runs in
tests/test_zero_runs.py.)"""

from __future__ import annotations

import pytest

from tests.conftest import train_args, zero_config
from tests.distributed import launch

pytestmark = pytest.mark.multiprocess


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
