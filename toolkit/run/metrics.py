"""Training metrics: throughput, TFLOP/s and MFU with the cost model's own FLOPs formula, memory, and where
they go (DeepSpeed's monitors — TensorBoard, CSV, wandb — a JSONL log and the rank-0 progress bar)."""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.plan.cost.flops import model_tflops_per_gpu
from toolkit.plan.specs import ModelSpec


def strict_json(obj: Any, **kwargs: Any) -> str:
    """JSON that strict parsers (jq, JavaScript, Go) read: a NaN or infinity (a step that did not run, a loss
    that overflowed) becomes null instead of Python's bare `NaN`."""
    import math

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def device_memory_outside_allocator() -> int:
    """Bytes the device holds beyond what torch's caching allocator reserved: the CUDA context (kernel images,
    about 0.5 GiB with torch 2.11 on an H200), NCCL's communicator buffers, library workspaces taken outside
    the pool. `max_memory_allocated` never sees them, yet they are part of what must fit: on an H200 the demo's
    0.32 GB of allocations measured ×0.24 of a prediction that counts its framework overhead (2026-12-04).
    Read from the driver's used memory (total − free) less torch's reserved pool, so other processes on the
    same device count too: one rank per device, as the launcher places them. 0 where the accelerator's torch
    module has no `mem_get_info`."""
    import deepspeed
    import torch

    accel = deepspeed.get_accelerator()
    info = getattr(getattr(torch, accel.device_name(), None), "mem_get_info", None)
    if info is None:
        return 0
    free, total = info()
    return max(int(total - free - (accel.memory_reserved() or 0)), 0)


def peak_memory_bytes(accelerator: str) -> int:
    """Peak memory of this rank: on an accelerator, max allocated plus what the device holds outside torch's
    allocator (`device_memory_outside_allocator`), the two parts the cost model predicts (states,
    activations and buffers; framework overhead); peak RSS (VmHWM) on the CPU accelerator."""
    if accelerator != "cpu":
        import deepspeed

        return int(deepspeed.get_accelerator().max_memory_allocated()) + device_memory_outside_allocator()
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class LeanPeak:
    """After this process's first LEAN_STEPS steps: note the peak memory, then let glibc reuse freed heap.

    Until then the process runs with the 128 KiB mmap threshold `keep_large_blocks_in_mmap` set, so on
    the CPU accelerator every large tensor is its own mapping and RSS is what is alive — the analogue of
    CUDA's `max_memory_allocated`, which is what the cost model predicts. Afterwards `allow_heap_reuse`
    keeps freed buffers in the heap: 22 % faster steps on CPU (63M GPT-2: 3.50 → 2.73 s), but RSS then
    also holds free heap the allocator keeps (0.5–1.1 GiB above the prediction at ZeRO-1/2/3 on that
    model when the switch came first), as CUDA's caching allocator holds reserved memory. `summary.json`
    reports both."""

    def __init__(self, accelerator: str) -> None:
        self.accelerator = accelerator
        self.steps = 0
        """Optimizer steps this process has run (resumed runs start counting again)."""
        self.lean: int | None = None
        """Peak memory of this rank over set-up and the first LEAN_STEPS steps."""

    def after_step(self) -> None:
        from toolkit.run.loop_state import LEAN_STEPS
        from toolkit.run.runtime import allow_heap_reuse

        self.steps += 1
        if self.steps == LEAN_STEPS:
            if self.accelerator == "cpu":
                self.lean = peak_memory_bytes(self.accelerator)
            allow_heap_reuse()

    def peak(self) -> int:
        """On an accelerator the whole run's peak allocation and the memory outside torch's pool; on CPU the
        peak RSS up to the allocator switch."""
        return self.lean or peak_memory_bytes(self.accelerator)


@dataclass
class Meter:
    """Per-step times and the derived figures; the first `warmup` steps (JIT, allocator) are excluded.

    The times are the device's, read with each step's record (toolkit.run.step_sync): a CUDA step returns to
    Python long before its kernels finish, so a host clock around it measures only the queueing. On the lent
    H200 an unsynchronized 7B-shaped Llama step read 0.19 s in its first steps and 0.73 s by the twentieth
    (2026-12-04) — a run whose every config carried DeepSpeed's comms logger, which synchronizes around every
    collective and re-reads every timer event since the start (toolkit.integrations.ds_input)."""

    model: ModelSpec
    world_size: int
    tokens_per_step: int
    peak_flops: float | None
    warmup: int = 1
    frozen: bool = False
    """LoRA: the base weights get no gradients, so a token costs 4·N model FLOPs (as the estimate counts)."""
    step_times: list[float] = field(default_factory=list)
    """Each step from its first micro-batch to its optimizer step."""
    step_periods: list[float | None] = field(default_factory=list)
    """Each step's end since the previous one's: the step plus what the loop did around it (data, logging,
    checkpoints); None where there was no previous step in this process's timeline."""

    def add(self, seconds: float, period: float | None = None) -> None:
        self.step_times.append(seconds)
        self.step_periods.append(period)

    @property
    def measured(self) -> list[float]:
        return self.step_times[self.warmup :] or self.step_times

    @property
    def step_time_s(self) -> float:
        times = sorted(self.measured)
        return times[len(times) // 2] if times else float("nan")

    def rates(self, step_s: float) -> dict[str, float]:
        tokens_per_s = self.tokens_per_step / step_s
        tflops = model_tflops_per_gpu(self.model, tokens_per_s, self.world_size, self.frozen)
        out = {"tokens_per_s": tokens_per_s, "tflops_per_gpu": tflops}
        if self.peak_flops:
            out["mfu"] = tflops * 1e12 / self.peak_flops
        return out


class Logger:
    """Rank 0 writes metrics to DeepSpeed's monitors (when configured), `metrics.jsonl` and the progress bar."""

    def __init__(
        self, run_dir: Path, engine: Any, is_main: bool, total_steps: int, start_step: int, progress: bool
    ) -> None:
        self.is_main, self.engine, self.run_dir = is_main, engine, run_dir
        self.file = None
        self.bar = None
        if is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")
            if progress:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr
                )

    def log(self, step: int, values: dict[str, float], prefix: str = "train") -> None:
        if not self.is_main:
            return
        record = {"step": step, "split": prefix, **values}
        assert self.file is not None
        self.file.write(strict_json(record) + "\n")
        self.file.flush()
        monitor = getattr(self.engine, "monitor", None)
        if monitor is not None and getattr(monitor, "enabled", False):
            monitor.write_events(
                [(f"{prefix.capitalize()}/dstk/{k}", float(v), step) for k, v in values.items()]
            )
        if self.bar is not None and prefix == "train":
            self.bar.set_postfix(
                {k: f"{v:.4g}" for k, v in values.items() if k in ("loss", "tokens_per_s", "mfu")}
            )

    def event(self, record: dict[str, Any]) -> None:
        """A discrete event (a spike-guard rollback): one line of `events.jsonl` beside the metrics, so a run's
        history can be read without scanning every step."""
        if not self.is_main:
            return
        with (self.run_dir / "events.jsonl").open("a", encoding="utf-8") as f:
            f.write(strict_json({"time": time.time(), **record}) + "\n")

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def rewind(self, step: int) -> None:
        """The run went back to `step` (a rollback): the progress bar follows."""
        if self.bar is not None:
            self.bar.n = step
            self.bar.refresh()

    def message(self, text: str) -> None:
        if self.is_main:
            (self.bar.write if self.bar is not None else print)(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
