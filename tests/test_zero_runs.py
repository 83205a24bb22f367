"""The shared ZeRO runs (tests/conftest.py: stages 0-3, fp32, 10 steps from the same weights, checkpointed at
steps 5 and 10) and every test measured against them: the stages compute the same thing, hold the estimated
bytes, and every way of continuing — resume, a killed rank, a signal to the launcher, conversion to one rank —
continues to the same losses. In one module so that one pytest-xdist worker (`--dist loadfile`) makes the
runs and runs these tests, while the other runs other modules."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import LAUNCH_SLOTS, launch

pytestmark = pytest.mark.multiprocess
_train_args = train_args


def test_zero_stages_are_the_same_computation(zero_runs) -> None:
    """ZeRO is an exact reformulation of data parallelism: same losses to 1e-4 for stages 0-3 (fp32)."""
    reference = zero_runs[0].summary["losses"]
    assert len(reference) == STEPS and reference[-1] < reference[0] - 0.5  # and it learns
    for stage in (1, 2, 3):
        losses = zero_runs[stage].summary["losses"]
        assert losses == pytest.approx(reference, rel=1e-4), f"stage {stage}"
    # ZeRO-3 recomputed its blocks through DeepSpeed's checkpoint with the inputs offloaded (conftest)
    assert zero_runs[3].summary["layout"]["offload_activations"]
    assert zero_runs[3].summary["predicted"]["offload_per_rank_bytes"]["host_activations"] > 0


def test_model_state_bytes_match_the_estimate(zero_runs) -> None:
    """dstk estimate's engine model states for the cpu cluster equal what the most loaded rank's engine holds
    (2 %); the estimate is per-GPU worst case, so no rank holds more."""
    for stage, job in zero_runs.items():
        s = job.summary
        predicted = s["predicted"]["engine_model_states_bytes"]["total"]
        measured = s["model_state_bytes"]["after_backward"]
        assert max(measured) == pytest.approx(predicted, rel=0.02), (
            f"stage {stage}: {measured} vs {predicted}"
        )
        assert all(m <= predicted * 1.02 for m in measured)
    z0 = zero_runs[0].summary["model_state_bytes"]["after_step"][0]
    z3 = zero_runs[3].summary["model_state_bytes"]["after_step"][0]
    assert z3 < z0  # partitioned states per rank


def test_summary_metrics_and_monitors(zero_runs) -> None:
    s = zero_runs[2].summary
    assert s["tokens_per_s"] > 0 and s["tflops_per_gpu"] > 0 and 0 < s["mfu"] < 1
    assert s["predicted"]["step_time_s"] > 0 and len(s["peak_memory_bytes"]) == 2
    lines = [json.loads(x) for x in (zero_runs[2].run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {"loss", "lr", "tokens_per_s", "mfu", "rss_bytes"} <= set(lines[-1])
    assert "Measured vs predicted" in zero_runs[2].output


def test_shared_memory_snapshots_hold_the_next_optimizer_step_until_read(zero_runs) -> None:
    """The shared runs take pipelined snapshots at steps 3, 6 and 9 whose writer starts 0.3 s late: at every
    ZeRO stage the optimizer's step pre-hook (on the torch optimizer inside DeepSpeed's wrappers) held the
    next update until the writer had read the state — at least 0.3 s after the hand-over, however long the
    forward and backward between them took (the stall is only what was left of it, as little as 0.05 s on a
    loaded host) — and the losses are the same computation as without them
    (test_zero_stages_are_the_same_computation)."""
    for stage, job in zero_runs.items():
        memory = job.summary["checkpoints"]["memory"]
        saves = memory["pipelined_saves"], len(memory["stall_s"]), len(memory["held_s"])
        assert saves == (3, 3, 3), (stage, memory)
        assert min(memory["held_s"]) >= 0.3, (stage, memory)
        assert len(memory["persist_s"]) == 3


def test_resume_continues_exactly(tmp_path, zero_runs, prepared_data) -> None:
    """10 straight steps == the shared ZeRO-2 run's step-5 checkpoint (alone in a directory, as a run stopped
    after 5 steps leaves it) + `--resume auto` for 5 more (fp32, 2 ranks), to 1e-6."""
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(zero_runs[2].run_dir.parent / "ckpt2" / "step00000005", ckpt / "step00000005")
    cfg = zero_config(tmp_path / "z2.json", 2)  # the shared runs' config, logging here
    resume = ["--checkpoint-dir", str(ckpt), "--resume", "auto"]
    second = launch(tmp_path / "b", cfg, _train_args(prepared_data, STEPS, *resume))
    assert second.code == 0, second.output[-3000:]
    assert f"resumed from {ckpt / 'step00000005'} at step 5" in second.output
    straight = zero_runs[2].summary["losses"]
    resumed = second.summary["losses"]
    assert len(resumed) == STEPS
    assert resumed[-1] == pytest.approx(straight[-1], rel=1e-6, abs=1e-6)
    assert resumed[5:] == pytest.approx(straight[5:], rel=1e-6, abs=1e-6)


def _restarted(job, tmp_path) -> None:
    assert job.code == 0, job.output[-4000:]
    log = tmp_path / "run" / "launch" / "launch_events.jsonl"
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert [e["exit_code"] != 0 for e in events] == [True, False], events  # one failure, one restart


def test_rank_killed_inside_an_asynchronous_persist_restarts_from_the_last_complete_one(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """Asynchronous checkpoints every 2 steps; SIGKILL rank 1 inside the background write of the checkpoint
    of a seeded step (after its first file is durable). dstk launch --max-restarts restarts the job: the
    half-persisted checkpoint has no manifest and is skipped, the one before it loads, and the run ends with
    the losses and weights of the run that never failed (fp32, 1e-6)."""
    crash_step = 2 * random.Random(1234).randint(2, STEPS // 2 - 1)  # a save step: 4, 6 or 8
    cfg = zero_config(tmp_path / "z1.json", 1)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "2", "--async-save"]
    crash = ["--crash-at-step", str(crash_step), "--crash-during", "persist", "--crash-rank", "1"]
    job = launch(
        tmp_path / "run",
        cfg,
        train_args(prepared_data, STEPS, "--init-from", str(init_weights), *ckpt, *crash),
        launch_args=["--max-restarts", "1"],
    )
    _restarted(job, tmp_path)
    assert f"step{crash_step:08d}: skipped, no manifest" in job.output
    assert f"at step {crash_step - 2}" in job.output
    reference = zero_runs[1].summary
    assert job.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert job.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)
    stalls = job.summary["checkpoints"]["disk"]
    assert job.summary["checkpoints"]["asynchronous"] and len(stalls["persist_s"]) == len(stalls["stall_s"])


def test_rank_killed_after_a_shared_memory_snapshot_resumes_from_it(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """Asynchronous checkpoints every 4 steps, shared-memory snapshots every step; SIGKILL rank 0 right after
    the step-6 snapshot is complete. The restart resumes from that snapshot (no step lost, where the disk tier
    alone would lose 2) and says so; the run ends with the uninterrupted run's losses (fp32, 1e-6) — the
    snapshots' writer reads the live state 0.5 s late, so only the optimizer step's gate keeps them right — and its
    snapshots leave /dev/shm once the final checkpoint is on disk."""
    from toolkit.run.checkpoint import memory_tier

    cfg = zero_config(tmp_path / "z2.json", 2)
    ckpt = tmp_path / "ckpt"
    tiers = ["--checkpoint-dir", str(ckpt), "--save-every", "4", "--async-save", "--snapshot-every", "1"]
    crash = ["--crash-at-step", "6", "--crash-during", "after-snapshot", "--crash-rank", "0"]
    crash += ["--slow-snapshot", "0.5"]  # the writer reads late: only the step's gate keeps the state right
    job = launch(
        tmp_path / "run",
        cfg,
        train_args(prepared_data, STEPS, "--init-from", str(init_weights), *tiers, *crash),
        launch_args=["--max-restarts", "1"],
    )
    _restarted(job, tmp_path)
    snapshot = memory_tier(ckpt) / "step00000006"
    assert (
        f"resumed from the shared-memory snapshot {snapshot}; newest disk checkpoint: step00000004"
        in job.output
    )
    assert "at step 6" in job.output
    reference = zero_runs[2].summary
    assert job.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert job.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)
    assert not memory_tier(ckpt).exists()
    memory = job.summary["checkpoints"]["memory"]
    # resumed at 6: snapshots at 7 and 9 (8 and the last step go to disk), each holding the next step
    assert memory["pipelined_saves"] == len(memory["stall_s"]) == len(memory["held_s"]) == 2
    assert min(memory["held_s"]) >= 0.5, memory


def test_checkpoints_of_every_stage_convert_and_resume_on_one_rank(tmp_path, zero_runs, prepared_data):
    """The shared 2-rank runs' step-5 checkpoints at ZeRO-0, 1, 2 and 3 → `dstk checkpoint convert` → one rank
    with accumulation ×2 (the same global batch) for steps 6-10: every loss equals the uninterrupted 2-rank
    run's to 1e-4. One-rank jobs use one core each: LAUNCH_SLOTS of them at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.cli import dstk

    resumes = {}
    for stage in range(4):  # in this process (so not in threads: dstk() redirects sys.stdout)
        univ = tmp_path / f"univ{stage}"
        ckpt = zero_runs[stage].run_dir.parent / f"ckpt{stage}"
        r = dstk(
            "checkpoint", "convert", "--checkpoint", str(ckpt), "--tag", "step00000005", "--out", str(univ)
        )
        assert r.code == 0, r.err
        cfg1 = zero_config(tmp_path / f"one{stage}.json", stage, "--gpus-per-node", "1")
        assert json.loads(cfg1.read_text())["gradient_accumulation_steps"] == 2
        resumes[stage] = (
            tmp_path / f"r{stage}",
            cfg1,
            train_args(prepared_data, STEPS, "--checkpoint-dir", str(univ), "--resume", "auto"),
        )
    with ThreadPoolExecutor(max_workers=LAUNCH_SLOTS) as pool:
        futures = {stage: pool.submit(launch, *job, ranks=1) for stage, job in resumes.items()}
        jobs = {stage: f.result() for stage, f in futures.items()}
    for stage, job in jobs.items():
        assert job.code == 0, (stage, job.output[-4000:])
        assert "at step 5" in job.output, stage
        straight = zero_runs[stage].summary["losses"]
        assert job.summary["losses"][5:] == pytest.approx(straight[5:], rel=1e-4), stage


def _second_job_is_refused(cmd: list[str], first_pid: int) -> None:
    """The same launch again, into the folders the running job holds: refused before anything starts, in one
    line naming the running job (its launcher's pid), while the first one trains on."""
    import subprocess
    import time

    from tests.distributed import REPO

    again = list(cmd)
    again[again.index("--master-port") + 1] = "0"  # not the port: the folders must be what refuses it
    start = time.time()
    proc = subprocess.run(again, capture_output=True, text=True, cwd=REPO, timeout=60)
    took = time.time() - start
    print(f"second job into the same folders refused in {took:.2f} s (process start included)")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "is in use by another job: pid " + str(first_pid) in lines[0], lines[0]
    assert took < 10


def _stopped(run_dir, signum: int, cfg, args: list[str], logged: int, intruder: bool = False) -> int:
    """Start a 2-rank job (slowed from step 3 by its args, so the signal lands mid-run), send `signum` to the
    `dstk launch` process once it has logged `logged` steps, as `kill`, systemd or SLURM would, and check what
    must hold when it is over: the exit status, no process and no /dev/shm file of the job left, a last line
    naming a complete checkpoint, and no traceback. `intruder`: first start the same job again into the same
    folders, which must be refused naming this one. Returns the checkpoint's step."""
    import glob
    import os
    import re
    import signal
    import subprocess
    import time

    import psutil

    from tests.distributed import REPO, launch_command

    cmd = launch_command(run_dir, cfg, args)
    port = cmd[cmd.index("--master-port") + 1]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= logged):
        assert proc.poll() is None and time.time() < deadline, f"the job ended before {logged} logged steps"
        time.sleep(0.1)
    if intruder:
        _second_job_is_refused(cmd, proc.pid)
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
    step, tag = int(said[2]), said[1].rsplit("/", 1)[-1]
    ckpt = Path(args[args.index("--checkpoint-dir") + 1])
    assert 3 <= step < STEPS and json.loads((ckpt / tag / "dstk_manifest.json").read_text())["step"] == step
    assert "--resume auto" in said[3]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    return step


def _relaunch_without_resume_is_refused(run_dir, cfg, args: list[str]) -> None:
    """The stopped job's launch again without --resume: refused before any rank starts, naming both ways on,
    and every checkpoint file as it was (SHA-256)."""
    import hashlib
    import time

    ckpt = Path(args[args.index("--checkpoint-dir") + 1])

    def hashes() -> dict[str, str]:
        files = sorted(p for p in ckpt.rglob("*") if p.is_file())
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}

    before, start = hashes(), time.time()
    job = launch(run_dir, cfg, args)
    assert job.code == 2 and time.time() - start < 30, job.output[-3000:]
    lines = [line for line in job.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "holds checkpoints (step" in lines[0], job.output
    assert "--resume auto" in lines[0] and "--overwrite-checkpoints" in lines[0]
    assert hashes() == before and not (run_dir / "metrics.jsonl").exists()


def test_sigint_then_sigterm_to_launch_stop_the_job_at_checkpoints_it_resumes_from_exactly(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """SIGINT (a terminal's Ctrl-C, to the launch PID alone) stops the job; its resume is stopped by SIGTERM
    (kill, systemd, CI cancellation, SLURM preemption); the second resume ends with the losses and weights of
    the run that was never stopped (fp32, 1e-6): each stop saved a checkpoint that continues exactly — the
    first synchronously, the second asynchronously (persisted before the job exits)."""
    import signal

    cfg = zero_config(tmp_path / "z1.json", 1)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    slow = [*ckpt, "--save-every", "100", "--inject-fault", "3+:slow"]
    init = ["--init-from", str(init_weights)]
    sync = [*init, *slow, "--no-async-save"]  # the first stop saves synchronously, the second asynchronously
    first = _stopped(tmp_path / "a", signal.SIGINT, cfg, train_args(prepared_data, STEPS, *sync), 3, True)
    _relaunch_without_resume_is_refused(tmp_path / "b", cfg, train_args(prepared_data, STEPS, *slow))
    resume = ["--resume", "auto"]
    second = _stopped(
        tmp_path / "b", signal.SIGTERM, cfg, train_args(prepared_data, STEPS, *slow, *resume), 1
    )
    assert first < second
    resumed = launch(tmp_path / "c", cfg, train_args(prepared_data, STEPS, *ckpt, *resume))
    assert resumed.code == 0, resumed.output[-3000:]
    assert f"at step {second}" in resumed.output
    reference = zero_runs[1].summary
    assert resumed.summary["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    assert resumed.summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)


def test_asynchronous_checkpoints_of_zero0_and_zero3_export_to_the_same_hf_weights(
    tmp_path, zero_runs
) -> None:
    """`dstk export` of the shared runs' final asynchronous checkpoints: ZeRO-3's (its fp32 partitions merged by
    DeepSpeed's zero_to_fp32, which needs each parameter's shape as the `torch.Size` the engine saved — the
    asynchronous snapshot once turned it into a plain tuple and the export failed) and ZeRO-0's (the whole
    module) give the same HF weights (fp32, 1e-5): the stages are the same computation."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.cli import dstk
    from tests.distributed import TEST_MODEL

    weights = {}
    for stage in (0, 3):
        ckpt = zero_runs[stage].run_dir.parent / f"ckpt{stage}"
        out = tmp_path / f"hf{stage}"
        r = dstk(
            "export",
            "--model",
            TEST_MODEL,
            "--checkpoint",
            str(ckpt),
            "--tag",
            "step00000010",
            "--out",
            str(out),
        )
        assert r.code == 0, r.err
        weights[stage] = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert weights[0].keys() == weights[3].keys()
    for key, value in weights[0].items():
        assert torch.allclose(weights[3][key], value, rtol=1e-5, atol=1e-5), key
