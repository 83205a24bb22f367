"""What the training loop reads back from the device, and when: one read per optimizer step, one step behind.

Why this module exists: a CUDA step returns to Python long before its kernels have run. Every read of a device
value — `float(loss)`, `.item()`, `.tolist()`, a blocking `.to(device)` copy, `synchronize()` — makes the host
wait until the device has drained its queue, and while it waits it cannot queue the next step's kernels, so
the device idles for as long as the host then takes to feed it. Invisible in a 1 s CPU step, that dominates a
30 ms GPU step. So the loop keeps everything a step produces (its loss, the engine's gradient norm, router
losses) on the device and reads it back once per step, as one small record:

- the step's mean loss, the global gradient norm and the stop request (toolkit.run.stop) are summed over the
  ranks in the one all-reduce every step does anyway, so every rank reads identical values and takes
  identical decisions (stop after the same step, roll back together);
- the record is copied into pinned host memory without blocking and an event is recorded behind it; the
  host reads step n's record after it has queued step n+1 (`StepChannel.take(upto=n)` one step later), so the
  wait is for work that is already done or nearly so and the device always has the next step queued;
- a step whose record must be acted on at once — a log, a checkpoint, a snapshot, the last step, every step
  under the spike guard (its verdict decides whether this state may become a checkpoint) — reads it at once;
- step times are device events around the step (`accelerator.Event`), read with the record; an accelerator
  without events (DeepSpeed's CPU accelerator) runs synchronously, so the host clock is its clock.

So outside logging and checkpoint steps dstk does one device-to-host read per step and no `synchronize()`;
`tests/test_step_sync.py` counts them in a real 2-rank run. Router losses of dstk's MoE layers ride in the
same record (unreduced: they are per rank).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step produced, as the host reads it."""

    step: int
    loss: float
    """Mean over the ranks of each rank's mean micro-batch loss."""
    grad_norm: float | None
    """The engine's pre-clipping global norm (inf for DeepSpeed's invalid-norm sentinel); None when it has none."""
    stop: bool
    """Some rank was asked to stop (SIGTERM/SIGINT/SIGUSR1) before this step ended."""
    aux: tuple[float, ...]
    """This rank's router losses, one per micro-batch (dstk's MoE layers)."""
    seconds: float
    """Device time from the step's first micro-batch to its optimizer step."""
    period: float | None
    """Device time since the previous step's end: the step and whatever the loop did around it (data, logging).
    None for the first step of this process and after a rollback."""
    alone: float | None = None
    """Device time from the previous step's end to this rank's first collective of the step — the end of its
    first forward where the forward holds no collective (`StepChannel.forward_is_local`), else the step's
    start: the work this rank does on its own (data, host work, the forward). Ranks leave a step together, so
    a slow rank takes longer over this while the others wait for it at that collective, where their own time
    does not show it (toolkit.run.stragglers). None where `period` is."""
    signum: int = 0
    """The signal those ranks got, when they agree (a SLURM time-limit warning reaches every rank, not all
    before the same step); 0 when none or they differ."""


def to_device(tensor: Any, device: Any) -> Any:
    """A host tensor on the device without making the host wait: torch's default `.to(device)` from pageable
    memory synchronizes the stream (`memcpy_and_sync`), so pin it and copy asynchronously. On the CPU
    accelerator the "device" is host memory and nothing moves."""
    import torch

    if torch.device(device).type == "cpu":
        return tensor
    import deepspeed

    return deepspeed.get_accelerator().pin_memory(tensor).to(device, non_blocking=True)


def device_scalar(value: Any, device: Any) -> Any:
    """A 0-d float64 device tensor from a device tensor (already there) or a Python number, without a blocking
    copy: a number is written by a fill kernel, not copied from pageable host memory as `torch.tensor(x,
    device=d)` would."""
    import torch

    if torch.is_tensor(value):  # a loss or a norm the engine left on the device: no copy, a cast
        return value.detach().to(torch.float64).reshape(())
    return torch.full((), float(value), dtype=torch.float64, device=device)


class _Clock:
    """Marks on the device timeline: accelerator events where there are some, else the host clock."""

    def __init__(self) -> None:
        import deepspeed

        self.event = deepspeed.get_accelerator().Event  # None on the CPU accelerator

    def mark(self) -> Any:
        if self.event is None:
            return time.perf_counter()
        ev = self.event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, a: Any, b: Any) -> float:
        """Between two marks; the later one must be complete (its record was waited for)."""
        if self.event is None:
            return b - a
        return a.elapsed_time(b) / 1e3


@dataclass
class _Pending:
    step: int
    host: Any
    ready: Any
    n_aux: int
    has_norm: bool
    start: Any
    stop: Any
    previous_stop: Any
    alone: Any


class StepChannel:
    """The per-step record from device to host (see the module docstring)."""

    def __init__(self, rt: Any) -> None:
        import os

        import torch

        self.rt = rt
        self.clock = _Clock()
        self._shm = (
            rt.accelerator == "cpu"
            and os.environ.get("LOCAL_SIZE") == str(rt.world_size)
            and hasattr(torch.ops, "deepspeed")
            and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
        )
        self._pending: deque[_Pending] = deque()
        self._start: Any = None
        self._alone: Any = None
        self._last_stop: Any = None
        self.forward_is_local = False
        """The forward runs no collective (no ZeRO-3 gathers, tensor, sequence or expert parallelism, no
        pipeline): the end of the first forward marks a rank's own work (`StepRecord.alone`)."""

    def begin(self) -> None:
        """The step's first micro-batch is about to be queued."""
        self._start = self.clock.mark()
        self._alone = None if self.forward_is_local else self._start

    def forward_done(self) -> None:
        """A micro-batch's forward is queued: the first one of the step ends the rank's own work."""
        if self._alone is None:
            self._alone = self.clock.mark()

    def end(self, step: int, loss: Any, grad_norm: Any, stop: int, aux: list[Any]) -> None:
        """The step's work is queued: reduce its record on the device and start copying it to the host.

        `loss` is a device scalar (the rank's mean micro-batch loss), `grad_norm` a device scalar, a number or
        None, `stop` this rank's pending signal number (0: none), `aux` device scalars (router losses)."""
        import torch

        stop_mark = self.clock.mark()
        device = self.rt.device
        has_norm = grad_norm is not None
        reduced = torch.stack(
            [
                device_scalar(loss, device),
                device_scalar(grad_norm if has_norm else 0.0, device),
                device_scalar(float(stop > 0), device),
                device_scalar(float(stop), device),
            ]
        )
        reduced = self._all_reduce(reduced)
        parts = [reduced, *(device_scalar(a, device).reshape(1) for a in aux)]
        record = torch.cat([p.reshape(-1) for p in parts])
        host = torch.empty(record.shape, dtype=record.dtype)
        if self.clock.event is not None:  # an asynchronous copy needs page-locked memory to land in
            import deepspeed

            host = deepspeed.get_accelerator().pin_memory(host)
        host.copy_(record, non_blocking=True)
        ready = self.clock.mark() if self.clock.event is not None else None
        self._pending.append(
            _Pending(
                step, host, ready, len(aux), has_norm, self._start, stop_mark, self._last_stop, self._alone
            )
        )
        self._last_stop = stop_mark

    def _all_reduce(self, t: Any) -> Any:
        """The record summed over the ranks. NCCL reduces device tensors in microseconds, behind the step. On
        the CPU accelerator gloo's all-reduce goes through TCP loopback: 1.2 ms for these 3 numbers on 2
        ranks of a 2-core host (measured 2026-12-05), a tenth of a 10 ms step; when every rank is on this
        node DeepSpeed's shared-memory all-reduce (its CPU inference kernel: fp32, LOCAL_SIZE == WORLD_SIZE,
        else it skips the work silently — csrc/cpu/comm/shm_interface.cpp) does it in microseconds."""
        import torch
        import torch.distributed as dist

        if self.rt.world_size == 1:
            return t
        if self._shm:
            t32 = t.float()
            torch.ops.deepspeed.inference_all_reduce_(t32)
            return t32.double()
        dist.all_reduce(t)  # NCCL reduces device tensors only; gloo takes the CPU accelerator's
        return t

    def forget_timeline(self) -> None:
        """The next step does not follow the last one (a rollback loaded another state): no period for it."""
        self._last_stop = None

    def take(self, upto: int) -> list[StepRecord]:
        """The records of every step up to `upto`, in order, waiting for them if need be."""
        out = []
        while self._pending and self._pending[0].step <= upto:
            p = self._pending.popleft()
            if p.ready is not None:
                p.ready.synchronize()  # this record's copy and everything queued before it are done
            values = p.host.tolist()
            n = self.rt.world_size
            loss, norm, stop, signals = values[0] / n, values[1] / n, values[2], values[3]
            out.append(
                StepRecord(
                    step=p.step,
                    loss=loss,
                    grad_norm=(math.inf if norm < 0 else norm) if p.has_norm else None,
                    stop=stop > 0,
                    signum=round(signals / stop) if stop > 0 and signals % stop == 0 else 0,
                    aux=tuple(values[4 : 4 + p.n_aux]),
                    seconds=self.clock.seconds(p.start, p.stop),
                    period=None if p.previous_stop is None else self.clock.seconds(p.previous_stop, p.stop),
                    alone=None
                    if p.previous_stop is None or p.alone is None
                    else self.clock.seconds(p.previous_stop, p.alone),
                )
            )
        return out

    @property
    def behind(self) -> int:
        """Steps queued whose record the host has not read."""
        return len(self._pending)


class ScheduledCollection:
    """Python's garbage collector at step boundaries only, as torchtitan runs it (torchtitan/tools/utils.py,
    `GarbageCollection`): an automatic collection starts whenever enough objects were allocated, in the middle
    of whatever step that happens to be — on a rank of a collective that every other rank then waits for — and
    a full one walks every object the process holds (transformers, DeepSpeed and the model's modules: hundreds
    of thousands), tens of milliseconds. So: the objects that exist once the run starts are frozen out of
    collections (`gc.freeze`), automatic collection is off during the loop, and a young-generation collection
    runs every `every` steps, between steps, on every rank alike."""

    def __init__(self, every: int = 50) -> None:
        import gc

        self.every = every
        self._was_enabled = gc.isenabled()
        gc.collect(1)
        gc.freeze()
        gc.disable()

    def step(self, step: int) -> None:
        if step and step % self.every == 0:
            import gc

            gc.collect(1)

    def close(self) -> None:
        import gc

        gc.unfreeze()
        if self._was_enabled:
            gc.enable()
