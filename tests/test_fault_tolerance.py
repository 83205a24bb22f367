"""Fault tolerance on real processes: a killed rank, a checkpoint killed mid-write, resharding through the
universal checkpoint. fp32 throughout so "resumes exactly" can be checked to 1e-6."""

from __future__ import annotations

import json
import random

import pytest

from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import launch

pytestmark = pytest.mark.multiprocess


def test_killed_rank_restarts_and_matches_the_uninterrupted_run(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """SIGKILL one rank at a seeded pseudo-random step; dstk launch --max-restarts restarts the job, which resumes
    from the last complete checkpoint and ends with the same losses and weights as a run that never failed."""
    crash_step = random.Random(1234).randint(3, STEPS - 2)
    cfg = zero_config(tmp_path / "z1.json", 1)
    job = launch(
        tmp_path / "run",
        cfg,
        train_args(
            prepared_data,
            STEPS,
            "--init-from",
            str(init_weights),
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--save-every",
            "2",
            "--crash-at-step",
            str(crash_step),
            "--crash-rank",
            "1",
        ),
        launch_args=["--max-restarts", "2"],
    )
    assert job.code == 0, job.output[-4000:]
    events = [
        json.loads(x) for x in (tmp_path / "run" / "launch" / "launch_events.jsonl").read_text().splitlines()
    ]
    assert [e["exit_code"] != 0 for e in events] == [True, False], (
        events
    )  # one failure, one successful restart
    resumed_at = 2 * (crash_step // 2)
    assert f"at step {resumed_at}" in job.output
    reference = zero_runs[1].summary
    assert job.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert job.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)
    print(f"crash at step {crash_step}, resumed at {resumed_at}: {crash_step - resumed_at} step(s) lost")


def test_checkpoint_killed_mid_write_is_never_loaded(tmp_path, prepared_data, init_weights):
    cfg = zero_config(tmp_path / "z2.json", 2)
    common = [
        "--init-from",
        str(init_weights),
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--save-every",
        "2",
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


def test_resume_on_a_different_world_size_through_universal_checkpoint(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """2 ranks, ZeRO-3, 5 steps; convert; resume on 1 rank with accumulation x2 (global batch constant): the
    next step's loss equals the 2-rank run's step 6 within 1e-4."""
    from tests.cli import dstk

    cfg2 = zero_config(tmp_path / "two.json", 3)
    first = launch(
        tmp_path / "a",
        cfg2,
        train_args(
            prepared_data, 5, "--init-from", str(init_weights), "--checkpoint-dir", str(tmp_path / "ckpt")
        ),
    )
    assert first.code == 0, first.output[-4000:]
    r = dstk("checkpoint", "convert", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "univ"))
    assert r.code == 0, r.err
    cfg1 = zero_config(tmp_path / "one.json", 3, "--gpus-per-node", "1")
    assert json.loads(cfg1.read_text())["gradient_accumulation_steps"] == 2
    second = launch(
        tmp_path / "b",
        cfg1,
        train_args(prepared_data, 6, "--checkpoint-dir", str(tmp_path / "univ"), "--resume", "auto"),
        ranks=1,
    )
    assert second.code == 0, second.output[-4000:]
    assert "at step 5" in second.output
    assert second.summary["losses"][-1] == pytest.approx(zero_runs[3].summary["losses"][5], rel=1e-4)


def _stopped(tmp_path, signum: int, prepared_data, init_weights) -> tuple[int, str]:
    """Start a 2-rank job (slowed from step 3 so the signal lands mid-run), send `signum` to the `dstk launch`
    process as `kill`, systemd or SLURM would, and check what must hold when it is over: the exit status, no
    process and no /dev/shm file of the job left, and a last line naming a complete checkpoint."""
    import glob
    import os
    import re
    import signal
    import subprocess
    import time

    import psutil

    from tests.distributed import REPO, launch_command

    cfg = zero_config(tmp_path / "z1.json", 1)
    ckpt = tmp_path / "ckpt"
    extra = ["--init-from", str(init_weights), "--checkpoint-dir", str(ckpt), "--save-every", "100"]
    cmd = launch_command(
        tmp_path / "run", cfg, train_args(prepared_data, STEPS, *extra, "--inject-fault", "3+:slow")
    )
    port = cmd[cmd.index("--master-port") + 1]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    metrics, deadline = tmp_path / "run" / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < deadline, "the job ended before step 3"
        time.sleep(0.1)
    job = psutil.Process(proc.pid).children(recursive=True)
    sent = time.time()
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=150)
    print(f"{signal.Signals(signum).name}: stopped in {time.time() - sent:.1f} s")
    assert proc.returncode == 128 + signum, out[-3000:]
    assert [p.pid for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
    assert glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*") == []
    said = re.search(r"the last complete checkpoint is (\S+) \(step (\d+)\); resume: (.*)", out)
    assert said, out[-3000:]
    step = int(said[2])
    assert (
        3 <= step < STEPS
        and json.loads((tmp_path / "ckpt" / said[1].rsplit("/", 1)[-1] / "dstk_manifest.json").read_text())[
            "step"
        ]
        == step
    )
    assert "--resume auto" in said[3]
    return step, out


def test_sigterm_to_launch_stops_the_job_at_a_checkpoint_it_resumes_from_exactly(
    tmp_path, zero_runs, prepared_data, init_weights
):
    step, _ = _stopped(tmp_path, 15, prepared_data, init_weights)
    resumed = launch(
        tmp_path / "resumed",
        tmp_path / "z1.json",
        train_args(prepared_data, STEPS, "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume", "auto"),
    )
    assert resumed.code == 0, resumed.output[-3000:]
    assert f"at step {step}" in resumed.output
    reference = zero_runs[1].summary
    assert resumed.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert resumed.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)


def test_sigint_to_launch_stops_the_job_cleanly_too(tmp_path, prepared_data, init_weights):
    _stopped(tmp_path, 2, prepared_data, init_weights)


def test_checkpoints_of_zero_0_1_2_convert_and_resume_on_one_rank(tmp_path, zero_runs, prepared_data):
    """The 2-rank ZeRO-0/1/2 checkpoints of the shared runs (step 10) → `dstk checkpoint convert` → one rank
    (accumulation ×2, same global batch) for one more step: the stages agree on that step's loss within 1e-4,
    as they agree on every step before it. (ZeRO-3 is the test above, against the 2-rank run itself.)"""
    from tests.cli import dstk

    losses = {}
    for stage in (0, 1, 2):
        ckpt = zero_runs[stage].run_dir.parent / f"ckpt{stage}"
        univ = tmp_path / f"univ{stage}"
        r = dstk("checkpoint", "convert", "--checkpoint", str(ckpt), "--out", str(univ))
        assert r.code == 0, r.err
        cfg1 = zero_config(tmp_path / f"one{stage}.json", stage, "--gpus-per-node", "1")
        job = launch(
            tmp_path / f"r{stage}",
            cfg1,
            train_args(prepared_data, STEPS + 1, "--checkpoint-dir", str(univ), "--resume", "auto"),
            ranks=1,
        )
        assert job.code == 0, job.output[-4000:]
        assert f"at step {STEPS}" in job.output
        losses[stage] = job.summary["losses"][-1]
    assert max(losses.values()) - min(losses.values()) <= 1e-4 * abs(losses[0]), losses
