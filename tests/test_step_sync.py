"""What `dstk train` makes the host wait for, per step: counted in a real 2-rank run, and the pieces that keep
it to one read per step (toolkit.run.step_sync), and DeepSpeed's comms logger only when asked."""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest

from tests.cli import REPO
from tests.distributed import TEST_MODEL, config, run_script

LOG_EVERY, SAVE_EVERY, STEPS = 4, 6, 13


@pytest.fixture(scope="module")
def one_process_group():
    """A gloo group of one in this process, as `dstk train` alone makes (the channel all-reduces its record)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def _runtime():
    from toolkit.run.runtime import Runtime

    return Runtime(rank=0, local_rank=0, world_size=1, device="cpu", accelerator="cpu")


def test_records_are_read_one_step_behind_in_order(one_process_group) -> None:
    import torch

    from toolkit.run.step_sync import StepChannel

    channel = StepChannel(_runtime())
    for step, (loss, norm) in enumerate([(2.0, torch.tensor(-1.0)), (1.5, 0.7), (1.25, None)], start=1):
        channel.begin()
        channel.end(
            step, torch.tensor(loss), norm, stop=15 if step == 2 else 0, aux=[torch.tensor(0.1)] * step
        )
    assert channel.behind == 3
    first = channel.take(upto=1)
    assert [r.step for r in first] == [1] and channel.behind == 2
    # DeepSpeed's invalid-norm sentinel (-1) is inf; a step without a norm has none; the stop request rides along
    assert first[0].grad_norm == float("inf") and first[0].period is None and not first[0].stop
    rest = channel.take(upto=3)
    assert [(r.step, r.loss, r.grad_norm, r.stop, len(r.aux)) for r in rest] == [
        (2, 1.5, 0.7, True, 2),
        (3, 1.25, None, False, 3),
    ]
    assert all(r.period is not None and r.period >= r.seconds for r in rest)
    assert channel.take(upto=10) == [] and channel.behind == 0


class _Device:
    """A stand-in for an asynchronous accelerator: work queued from the host runs later on a thread, and an
    event completes when the thread reaches it, stamped with the thread's clock."""

    def __init__(self) -> None:
        self.work: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.work.get()()

    def Event(self, enable_timing: bool = True) -> _Device._Event:
        return self._Event(self)

    class _Event:
        def __init__(self, device: _Device) -> None:
            self.device, self.at, self.done = device, None, threading.Event()

        def record(self) -> None:
            def stamp() -> None:
                self.at = time.perf_counter()
                self.done.set()

            self.device.work.put(stamp)

        def synchronize(self) -> None:
            self.done.wait()

        def elapsed_time(self, end: _Device._Event) -> float:
            return (end.at - self.at) * 1e3


def test_a_step_is_timed_on_the_device_not_by_the_host(one_process_group) -> None:
    """The host queues a step in no time; the device runs it for 0.2 s. The step's time is the device's, read
    from events around it once its record is complete, and no `synchronize` is needed for it."""
    import torch

    from toolkit.run.step_sync import StepChannel

    device = _Device()
    channel = StepChannel(_runtime())
    channel.clock.event = device.Event
    t0 = time.perf_counter()
    channel.begin()
    device.work.put(lambda: time.sleep(0.2))
    channel.end(1, torch.tensor(1.0), None, 0, [])
    queued = time.perf_counter() - t0
    (rec,) = channel.take(upto=1)
    assert queued < 0.1 and rec.seconds >= 0.2


def test_generated_configs_carry_no_comms_logger_unless_asked(tmp_path) -> None:
    """DeepSpeed switches its comms logger on for any `comms_logger` key, whatever `enabled` says."""
    from toolkit.integrations.ds_input import idle_comms_logger, without_idle_comms_logger

    for name in (REPO / "ds_configs").glob("*.json"):
        assert "comms_logger" not in json.loads(name.read_text()), name
    off, on = tmp_path / "off.json", tmp_path / "on.json"
    config(off, "--model", "tiny-gpt2")
    config(on, "--model", "tiny-gpt2", "--comms-logger")
    assert "comms_logger" not in json.loads(off.read_text())
    assert json.loads(on.read_text())["comms_logger"]["enabled"] is True
    for block, idle in [({"enabled": False}, True), ({}, True), (None, True), ({"enabled": True}, False)]:
        cfg = {"train_batch_size": 8, "comms_logger": block}
        assert idle_comms_logger(cfg) is idle
        assert ("comms_logger" in without_idle_comms_logger(cfg)) is not idle
    assert not idle_comms_logger({"train_batch_size": 8})


@pytest.mark.multiprocess
def test_dstk_train_waits_for_the_device_once_a_step_and_runs_no_comms_logger(
    tmp_path, prepared_data
) -> None:
    """A 2-rank run with every device-to-host wait in dstk's code counted per step (tests/scripts/count_syncs.py),
    from a config that carries the disabled `comms_logger` block older dstk configs had: outside logging and
    checkpoint steps one read per step and no `synchronize`, the block dropped with one message, and DeepSpeed's
    logger records nothing."""
    cfg = config(
        tmp_path / "ds.json",
        "--model",
        TEST_MODEL,
        "--zero-stage",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
        "--train-steps",
        str(STEPS),
    )
    data = json.loads(cfg.read_text())
    data["comms_logger"] = {"enabled": False, "verbose": False, "prof_all": True, "debug": False}
    cfg.write_text(json.dumps(data))
    out, run = tmp_path / "counts", tmp_path / "run"
    args = ["--model", TEST_MODEL, "--config", str(cfg), "--data", str(prepared_data), "--steps", str(STEPS)]
    args += ["--log-every", str(LOG_EVERY), "--run-dir", str(run), "--no-progress"]
    args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", str(SAVE_EVERY)]
    proc = run_script(REPO / "tests" / "scripts" / "count_syncs.py", [str(out), *args])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (proc.stdout + proc.stderr).count("dropped its disabled comms_logger block") == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["comms_logger"] == {"enabled": False, "calls_recorded": 0}
    assert summary["comm_bytes_per_step"] == 0
    assert len(summary["losses"]) == len(summary["step_times_s"]) == STEPS
    from toolkit.run.loop_state import LEAN_STEPS

    for rank in (0, 1):
        steps = {
            int(s): c for s, c in json.loads((out / f"syncs-rank{rank}.json").read_text())["steps"].items()
        }
        assert set(steps) <= set(range(1, STEPS + 1))
        plain = [s for s in range(LEAN_STEPS + 1, STEPS) if s % LOG_EVERY and s % SAVE_EVERY]
        assert len(plain) >= 5
        for s in plain:
            c = steps.get(s, {})
            assert c.get("synchronize", 0) == 0 and c.get("blocking_copy", 0) == 0, (rank, s, c)
            assert c.get("read", 0) <= 1, (rank, s, c)
        assert sum(c.get("read", 0) for c in steps.values()) >= len(plain)  # the count sees the reads
