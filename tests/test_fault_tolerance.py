"""Fault tolerance, each fault injected for real (docs/fault-tolerance.md): a checkpoint killed mid-write is
never loaded; a frozen rank is named and the job restarted (hang); a slow rank is named (straggler); a full
disk or a read-only one keeps the last checkpoint and stops or trains on; a truncated shard or another tokenizer is one line before
any rank starts. The pure verdicts behind them are tested first, without processes. (A killed rank, signals to
the launcher and resharding through the universal checkpoint are measured against the shared ZeRO runs in
tests/test_zero_runs.py; a lost node in tests/test_multinode.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli import REPO
from tests.conftest import STEPS, train_args, zero_config
from tests.distributed import TEST_MODEL, launch


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


# --- pure: the verdicts, without processes -------------------------------------------------------------------


def _beat(rank: int, step: int, phase: str, progress: int, beat: int) -> Any:
    from toolkit.launcher.heartbeat import Beat

    return Beat(
        rank=rank, node=0, host="h", pid=100 + rank, step=step, phase=phase, progress=progress, beat=beat
    )


def test_hang_watch_names_the_silent_rank_and_spares_set_up_and_saves() -> None:
    """No verdict while a rank is still setting up or inside a save (ten timeouts there); a rank whose
    heartbeat stops is named with its step and phase, the others as waiting; ranks alive but all stuck are
    named as such."""
    from toolkit.launcher.heartbeat import SLOW_PHASE_FACTOR, HangWatch

    watch = HangWatch(timeout_s=5, world_size=2, hostnames=["node1"])
    assert watch.observe({0: _beat(0, 1, "forward", 1, 1), 1: _beat(1, 0, "setup", 0, 1)}, 0) is None
    assert watch.observe({0: _beat(0, 1, "forward", 1, 2), 1: _beat(1, 0, "setup", 0, 2)}, 20) is None
    assert watch.observe({0: _beat(0, 3, "save", 9, 3), 1: _beat(1, 3, "save", 9, 3)}, 21) is None
    assert watch.observe({0: _beat(0, 3, "save", 9, 4), 1: _beat(1, 3, "save", 9, 4)}, 21 + 5 * 2) is None
    late = watch.observe(
        {0: _beat(0, 3, "save", 9, 5), 1: _beat(1, 3, "save", 9, 5)}, 22 + 5 * SLOW_PHASE_FACTOR
    )
    assert late is not None and "alive, all stuck in the same place" in late
    watch = HangWatch(timeout_s=5, world_size=2, hostnames=["node1"])
    for t, (p0, p1) in enumerate([(1, 1), (2, 2), (3, 3)]):
        assert watch.observe({0: _beat(0, 5, "forward", p0, t), 1: _beat(1, 5, "forward", p1, t)}, t) is None
    assert watch.observe({0: _beat(0, 5, "backward", 4, 3), 1: _beat(1, 5, "forward", 3, 2)}, 3) is None
    for t in range(4, 7):  # rank 1 is silent from t=2; rank 0 keeps beating, waiting in its collective
        assert watch.observe({0: _beat(0, 5, "backward", 4, t), 1: _beat(1, 5, "forward", 3, 2)}, t) is None
    report = watch.observe({0: _beat(0, 5, "backward", 4, 7), 1: _beat(1, 5, "forward", 3, 2)}, 7)
    assert report is not None and "\n" not in report
    assert (
        "rank 1 on node1 (node 0, pid 101) went silent: no heartbeat for 5.0 s, the last at step 5 (forward)"
        in report
    )
    assert "; rank 0 wait at step 5 (backward)" in report
    done = HangWatch(timeout_s=5, world_size=2)
    done.observe({0: _beat(0, 9, "done", 50, 9), 1: _beat(1, 9, "end", 50, 9)}, 0)
    assert done.observe({0: _beat(0, 9, "done", 50, 9), 1: _beat(1, 9, "end", 50, 10)}, 30) is None


def test_straggler_ratio_is_busy_time_against_the_other_ranks() -> None:
    """Ranks leave a step together, so the slow rank is the one that waited least: its busy time is the
    whole period, the others' is shorter by their wait. Named after WINDOWS windows in a row, once; a rank
    slower by less than MIN_EXCESS_S a step (scheduling noise on a busy host) is not named, whatever its ratio."""
    from toolkit.run.stragglers import WINDOWS, StragglerWatch, busy_ratios

    ratios = busy_ratios([0.52, 0.52, 0.52], [0.01, 0.51, 0.012])
    assert ratios[1] == pytest.approx(0.52 / 0.021, rel=1e-6) and ratios[0] < 1 and ratios[2] < 1
    assert busy_ratios([0.30, 0.30], [0.05, 0.05]) == [1.0, 1.0]
    watch = StragglerWatch(ratio=1.2)
    watch._places = [(0, "a"), (0, "a"), (1, "b")]
    named = [watch.judge(step, [0.52] * 3, [0.01, 0.012, 0.51]) for step in range(1, WINDOWS + 2)]
    assert [len(n) for n in named] == [0] * (WINDOWS - 1) + [1, 0]
    (s,) = named[WINDOWS - 1]
    assert (s.rank, s.node, s.host, s.named_at_step) == (2, 1, "b", WINDOWS)
    assert watch.report()[0]["windows"] == WINDOWS + 1 and watch.report()[0]["ratio"] > 20
    assert "straggler: rank 2 (b, node 1) works" in watch.message(s)
    # the noise the suite's own runs showed: 50-140 ms steps, a healthy rank 1.2-2.6x the other's busy time
    noisy = StragglerWatch(ratio=1.2)
    noisy._places = [(0, "a"), (0, "a")]
    assert not any(noisy.judge(step, [0.06, 0.06], [0.005, 0.04]) for step in range(1, 3 * WINDOWS))
    assert busy_ratios([0.06, 0.06], [0.005, 0.04])[1] > 2 and noisy.report() == []


def test_a_storage_error_is_told_from_a_bug_and_said_in_one_line(tmp_path) -> None:
    import errno

    from toolkit.run.save_errors import SaveError, is_storage_error, say

    for code in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
        assert is_storage_error(OSError(code, "x"))
    assert is_storage_error(RuntimeError("[enforce fail] PytorchStreamWriter failed writing file data/3"))
    assert is_storage_error(RuntimeError("basic_ios::clear: iostream error"))  # the closing flush, torch 2.9
    assert not is_storage_error(OSError(errno.ENOENT, "x")) and not is_storage_error(ValueError("no"))
    error = SaveError(
        4, str(tmp_path / "step00000004" / "a.pt"), "No space left on device", 2_300_000, 1_100_000
    )
    line = say(error, str(tmp_path / "step00000002"), "continue")
    assert "\n" not in line and "cannot write" in line and "needs 2.19 MiB, 1.05 MiB was free" in line
    assert "step00000002 is the newest complete checkpoint" in line and "(--on-save-error continue)" in line


def test_a_slow_fault_can_name_one_rank() -> None:
    from toolkit.errors import UserError
    from toolkit.run.stability import Fault

    assert Fault.parse("2+:slow@1") == Fault(2, "slow", True, 1)
    assert Fault.parse("3:nan") == Fault(3, "nan", False, None)
    for bad in ("2:nan@1", "2:slow@x", "0:slow"):
        with pytest.raises(
            UserError,
            match=r"--inject-fault: expected STEP\[\+\]:nan\|spike\|slow\[=S\]\[@RANK\]\[,first-run\]",
        ):
            Fault.parse(bad)


# --- real faults on real processes ----------------------------------------------------------------------------

HANG_S = 6.0


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "launch" / "launch_events.jsonl").read_text().splitlines()]


@pytest.mark.multiprocess
def test_a_stopped_rank_is_named_and_the_job_restarts_to_the_uninterrupted_losses(
    tmp_path, zero_runs, prepared_data, init_weights
):
    """SIGSTOP rank 1 mid-run (a frozen process: alive, answering nothing). Within the hang timeout `dstk
    launch` names it (rank, node, pid, step and phase; rank 0 waiting), kills the job, and `--max-restarts 1`
    resumes from the last complete checkpoint: the run ends with the uninterrupted run's losses and weights
    (fp32, 1e-6). Both ranks are slowed alike, so neither is named a straggler."""
    from tests.distributed import launch_command
    from toolkit.launcher.heartbeat import heartbeat_dir, read_beats

    cfg = zero_config(tmp_path / "z1.json", 1)
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "2", "--inject-fault", "2+:slow"]
    args = train_args(prepared_data, STEPS, "--init-from", str(init_weights), *ckpt)
    run = tmp_path / "run"
    cmd = launch_command(run, cfg, args, launch_args=["--max-restarts", "1", "--hang-timeout", str(HANG_S)])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    metrics, deadline = run / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        assert proc.poll() is None and time.time() < deadline, "the job ended before 5 logged steps"
        time.sleep(0.1)
    victim = read_beats(heartbeat_dir(run))[1]
    os.kill(victim.pid, signal.SIGSTOP)
    stopped = time.time()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    (hang,) = [e for e in _events(run) if "hang_detected" in e]
    latency = hang["time"] - stopped
    print(f"hang detected {latency:.1f} s after SIGSTOP (--hang-timeout {HANG_S:g})")
    # silence counts from the rank's last heartbeat, up to a beat (1 s) before the signal; polled every second
    assert HANG_S - 1.5 <= latency <= HANG_S + 3, latency
    said = hang["hang_detected"]
    assert f"rank 1 on {victim.host} (node 0, pid {victim.pid}) went silent: no heartbeat for" in said, said
    assert "; rank 0 wait at step" in said and f"dstk launch: hang: {said}; stopping the job" in out
    assert "restart 1/1 from the newest complete checkpoint" in out
    assert [e["exit_code"] != 0 for e in _events(run) if "exit_code" in e] == [True, False]
    reference = zero_runs[1].summary
    assert read_json(run / "summary.json")["losses"] == pytest.approx(reference["losses"], rel=1e-6, abs=1e-6)
    summary = read_json(run / "summary.json")
    assert summary["param_norm"] == pytest.approx(reference["param_norm"], rel=1e-6)
    assert summary["stragglers"] == []


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


@contextlib.contextmanager
def small_filesystem(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `path` (tests run as root here; elsewhere this fails saying why)."""
    path.mkdir(parents=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"cannot mount a {size}-byte tmpfs at {path} (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="module")
def full_disk_runs(tmp_path_factory, prepared_data, init_weights):
    """Three 2-rank ZeRO-2 runs, two at a time, checkpointing every 2 steps onto a tmpfs each. Two disks hold one
    checkpoint and a half (the planner's checkpoint size × 1.5): the step-2 save fits, the step-4 one runs out
    of space. One saves synchronously and stops there (`--on-save-error stop`); the other saves asynchronously
    and trains on (`continue`). The third disk has room but is remounted read-only once the step-2 checkpoint
    is committed (a permission fault); that run saves synchronously and trains on (`continue`) for 16 steps,
    with rank 1 slowed by 0.5 s a step from step 2 (`slow@1`): a straggler."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.distributed import LAUNCH_SLOTS
    from toolkit.integrations.dstk_block import read_dstk_block
    from toolkit.plan.checkpoint_interval import checkpoint_bytes
    from toolkit.plan.load import load_model

    root = tmp_path_factory.mktemp("full_disk")
    cfg = zero_config(root / "z2.json", 2)
    layout = read_dstk_block(json.loads(cfg.read_text())).layout
    size = int(1.5 * checkpoint_bytes(load_model(TEST_MODEL), layout))
    runs = {
        "sync": ["--no-async-save", "--on-save-error", "stop"],
        "async": ["--async-save", "--on-save-error", "continue"],
        "readonly": ["--no-async-save", "--on-save-error", "continue", "--inject-fault", "2+:slow@1"],
    }
    steps = {"sync": STEPS, "async": STEPS, "readonly": READ_ONLY_STEPS}
    with contextlib.ExitStack() as stack:
        disks = {
            k: stack.enter_context(small_filesystem(root / f"disk-{k}", size * (4 if k == "readonly" else 1)))
            for k in runs
        }
        common = ["--init-from", str(init_weights), "--save-every", "2"]
        jobs = {
            k: (
                root / k,
                cfg,
                train_args(
                    prepared_data, steps[k], *common, "--checkpoint-dir", str(disks[k] / "ckpt"), *extra
                ),
            )
            for k, extra in runs.items()
        }
        with ThreadPoolExecutor(max_workers=LAUNCH_SLOTS) as pool:
            done = {k: pool.submit(launch, *job) for k, job in jobs.items() if k != "readonly"}
            done["readonly"] = pool.submit(_read_only_after_first_save, *jobs["readonly"], disks["readonly"])
            results = {k: f.result() for k, f in done.items()}
        # what the test checks on the disks, read before they are unmounted
        kept = {k: _checkpoints(disks[k] / "ckpt") for k in runs}
    return results, kept, size


READ_ONLY_STEPS = 16


def _read_only_after_first_save(run_dir: Path, cfg: Path, args: list[str], disk: Path) -> Any:
    """`launch`, with `disk` remounted read-only as soon as the step-2 checkpoint is committed (its pointer
    written, the last write of a save): EROFS at the step-4 save, at least two slowed steps later. As root the
    suite passes every mode-bit check, so a read-only mount is the permission fault it can inject."""
    from tests.distributed import Job, launch_command
    from toolkit.run.checkpoint import POINTER

    pointer, deadline = disk / "ckpt" / POINTER, time.time() + 600
    cmd = launch_command(run_dir, cfg, args)  # makes run_dir
    with (run_dir / "output.txt").open("w+") as out:  # a file, not a pipe: nothing blocks while we poll
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        while not (pointer.is_file() and pointer.read_text().strip() == "step00000002"):
            if proc.poll() is not None or time.time() > deadline:
                break
            time.sleep(0.05)
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        proc.wait(timeout=900)
        out.seek(0)
        return Job(proc.returncode, out.read(), run_dir)


def _checkpoints(ckpt: Path) -> dict[str, Any]:
    """Each step folder on the disk: its completeness (hashes included), and whether its files load."""
    import torch

    from toolkit.run.checkpoint import check

    out = {}
    for tag in sorted(p for p in ckpt.iterdir() if p.name.startswith("step")):
        problem = check(tag)
        loads = problem is None and all(
            torch.load(f, weights_only=False) is not None for f in tag.glob("*.pt")
        )
        out[tag.name] = {"problem": problem, "loads": loads}
    return out


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]


def _say_full(output: str, step: int) -> str:
    lines = [x for x in output.splitlines() if f"checkpoint step {step}: cannot write " in x]
    assert len(lines) == 1, output[-4000:]
    return lines[0]


@pytest.mark.multiprocess
def test_a_full_disk_stops_a_synchronous_run_cleanly_with_the_last_checkpoint_intact(full_disk_runs):
    """The step-4 save runs out of space: one line names the file, the bytes the save needs against those
    free and the checkpoint that stays; the run stops there on every rank (exit 1, no hang), and the disk
    holds the step-2 checkpoint whole (every hash, every file loads) and nothing of step 4."""
    results, kept, size = full_disk_runs
    job = results["sync"]
    assert job.code == 1, job.output[-4000:]
    line = _say_full(job.output, 4)
    assert "(No space left on device)" in line and "/disk-sync/ckpt/" in line, line
    needed, free = (_bytes(x) for x in re.search(r"the save needs (.+?), (.+?) was free", line).groups())
    assert free < needed and needed > 0.9 * size / 1.5, line  # the checkpoint's bytes, not a part of them
    assert "disk-sync/ckpt/step00000002 is the newest complete checkpoint and loads as before" in line
    assert "stopping the run here (--on-save-error stop)" in line
    assert kept["sync"] == {"step00000002": {"problem": None, "loads": True}}
    s = job.summary
    assert s["final_step"] == 4 and len(s["losses"]) == 4 and s["stopped_by_save_error"]
    assert [(e["step"], e["reason"]) for e in s["save_errors"]] == [(4, "No space left on device")]


@pytest.mark.multiprocess
def test_a_full_disk_lets_an_asynchronous_run_train_on(full_disk_runs):
    """The same full disk under asynchronous saves and `--on-save-error continue`: each failed save (steps 4,
    6, 8, 10, found before the next save or at the end) is one line, its partial files are removed, training
    goes on to step 10, the step-2 checkpoint stays whole and loadable, and the exit status says that the final
    state is in no checkpoint (1)."""
    results, kept, _ = full_disk_runs
    job = results["async"]
    assert job.code == 1, job.output[-4000:]
    line = _say_full(job.output, 4)
    assert "disk-async/ckpt/step00000002 is the newest complete checkpoint and loads as before" in line
    assert "training goes on and the next save tries again (--on-save-error continue)" in line
    s = job.summary
    assert s["final_step"] == STEPS and len(s["losses"]) == STEPS and not s["stopped_by_save_error"]
    assert [e["step"] for e in s["save_errors"]] == [4, 6, 8, 10]
    assert kept["async"] == {"step00000002": {"problem": None, "loads": True}}


@pytest.mark.multiprocess
def test_a_read_only_checkpoint_folder_is_one_line_and_a_synchronous_run_trains_on(full_disk_runs):
    """A permission fault: the checkpoint filesystem turns read-only after the step-2 save. The step-4 save is
    one line naming the path and the reason, `--on-save-error continue` trains on synchronously to the last
    step (every later save fails the same way), step 2 stays whole and loadable, and the exit status says that
    the final state is in no checkpoint (1)."""
    results, kept, _ = full_disk_runs
    job = results["readonly"]
    assert job.code == 1, job.output[-4000:]
    line = _say_full(job.output, 4)
    assert "(Read-only file system)" in line and "/disk-readonly/ckpt/step00000004" in line, line
    assert "disk-readonly/ckpt/step00000002 is the newest complete checkpoint and loads as before" in line
    assert "training goes on and the next save tries again (--on-save-error continue)" in line
    s = job.summary
    assert s["final_step"] == READ_ONLY_STEPS and not s["stopped_by_save_error"]
    assert [e["step"] for e in s["save_errors"]] == list(range(4, READ_ONLY_STEPS + 1, 2))
    assert kept["readonly"] == {"step00000002": {"problem": None, "loads": True}}


@pytest.mark.multiprocess
def test_a_slow_rank_is_named_with_its_ratio_while_the_job_goes_on(full_disk_runs):
    """Rank 1 sleeps 0.5 s before each step from step 2: it is named once, in the log, events.jsonl and
    summary.json, with how much longer it works than rank 0 (one all-gather per window); rank 0 is not; the run
    still ends at its last step. The other two runs, unslowed beside it on the same 2 cores, name no one."""
    from toolkit.run.stragglers import WINDOW_STEPS, WINDOWS

    results, _, _ = full_disk_runs
    job = results["readonly"]
    named = [x for x in job.output.splitlines() if x.startswith("straggler: ")]
    assert len(named) == 1 and named[0].startswith("straggler: rank 1 ("), job.output[-4000:]
    (s,) = job.summary["stragglers"]
    print(f"{named[0]} (named at step {s['named_at_step']})")
    assert s["rank"] == 1 and s["ratio"] > 3 and s["since_step"] >= 2, s
    assert s["named_at_step"] <= 2 + WINDOWS * WINDOW_STEPS + 1, s  # as soon as its windows are full
    events = [json.loads(x) for x in (job.run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["rank"] for e in events if e.get("event") == "straggler"] == [1]
    assert results["async"].summary["stragglers"] == [] and results["sync"].summary["stragglers"] == []


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


def test_elastic_replans_for_the_nodes_that_remain_at_the_same_global_batch(tmp_path) -> None:
    """Two nodes of one rank each lose node2: the config is rewritten for one rank — gradient accumulation
    1 → 2 at micro-batch 4, the global batch 8 kept, the dstk block's layout with it — and accepted by
    DeepSpeed for that world; the line says what changed. Losing every node is one line."""
    from toolkit.errors import UserError
    from toolkit.plan.load import load_cluster, load_model
    from toolkit.run.elastic import shrink

    cfg = zero_config(tmp_path / "z2.json", 2)
    two = load_cluster(
        "cpu", {"nodes": 2, "gpus_per_node": 1, "hostnames": ["node1", "node2"], "launcher": "pdsh"}
    )
    model = load_model(TEST_MODEL)
    smaller = shrink(two, ["node2"], cfg, model, None, tmp_path)
    new = json.loads(smaller.config.read_text())
    assert (
        new["train_batch_size"],
        new["train_micro_batch_size_per_gpu"],
        new["gradient_accumulation_steps"],
    ) == (8, 4, 2)
    assert (
        new["dstk"]["layout"]["world_size"] == 1
        and new["optimizer"] == json.loads(cfg.read_text())["optimizer"]
    )
    assert smaller.cluster.hostnames == ["node1"] and smaller.cluster.world_size == 1
    assert smaller.message == (
        "--elastic: node2 lost; the job goes on node1 with 1 rank(s) instead of 2: dp 2 → 1, gradient accumulation "
        "1 → 2 (global batch 8 kept: each step reads the same rows); no checkpoint yet: it starts from step 0"
    )
    with pytest.raises(UserError, match=r"^--elastic: every node is lost \(node1, node2\)"):
        shrink(two, ["node1", "node2"], cfg, model, None, tmp_path)
