"""Process-level set-up for the run path: distributed init, device, seeds, teardown.

The accelerator is DeepSpeed's (`deepspeed.get_accelerator()`): CUDA with NCCL on a cluster, the CPU
accelerator with gloo here — nothing below names a device type.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    device: Any
    accelerator: str
    """DeepSpeed accelerator name: "cuda", "cpu", ..."""
    node: int = 0
    """This rank's node among `nodes` (CROSS_RANK from DeepSpeed's per-node launcher, SLURM_NODEID under srun)."""
    nodes: int = 1
    host: str = ""
    """The node's name: SLURMD_NODENAME under srun (several slurmd may share a host), else the hostname."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def adopt_slurm_task(environ: Any = os.environ) -> bool:
    """Give a task that `srun` started the torch.distributed variables; True if it was one.

    DeepSpeed's slurm backend starts every rank as `srun ... python SCRIPT`: the task has SLURM_PROCID,
    SLURM_LOCALID and SLURM_STEP_NUM_TASKS (srun sets them for job steps, not the batch script) but not the
    RANK/LOCAL_RANK/WORLD_SIZE that `deepspeed.init_distributed` reads, and without them it falls back to MPI
    discovery (mpi4py) and fails. MASTER_ADDR/MASTER_PORT come from the sbatch script's exports, which
    `srun --export=ALL` passes on.
    """
    if "RANK" in environ or "SLURM_PROCID" not in environ or "SLURM_STEP_NUM_TASKS" not in environ:
        return False
    environ.update(
        RANK=environ["SLURM_PROCID"],
        LOCAL_RANK=environ.get("SLURM_LOCALID", "0"),
        WORLD_SIZE=environ["SLURM_STEP_NUM_TASKS"],
    )
    return True


def init_distributed() -> Runtime:
    """Join the job the launcher started (RANK/WORLD_SIZE/MASTER_* in the environment), or make a one-rank
    job when run directly, and bind this process to its device."""
    import deepspeed

    if "RANK" not in os.environ:  # a plain `dstk train`: a job of one
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )
    from toolkit.run.chatter import init_distributed_quietly

    init_distributed_quietly(lambda: deepspeed.init_distributed(dist_init_required=True))
    accel = deepspeed.get_accelerator()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    accel.set_device(local_rank)
    import torch.distributed as dist

    return Runtime(
        rank=dist.get_rank(),
        local_rank=local_rank,
        world_size=dist.get_world_size(),
        device=accel.device_name(local_rank),
        accelerator=accel.device_name(),
        node=int(os.environ.get("CROSS_RANK") or os.environ.get("SLURM_NODEID") or 0),
        nodes=int(os.environ.get("CROSS_SIZE") or os.environ.get("SLURM_STEP_NUM_NODES") or 1),
        host=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
    )


M_MMAP_THRESHOLD = -3  # glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1


def _mallopt(param: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(param, value)


def keep_large_blocks_in_mmap() -> None:
    """Call first thing in a training process, before torch is imported.

    zero.Init materialises each parameter in full, partitions it and frees the full tensor. With glibc's
    default dynamic mmap threshold, earlier large frees (imports, process-group set-up) leave free heap
    chunks that those full tensors then reuse, and the heap never shrinks: RSS grows by the whole model
    although only a partition is alive (measured here: 1.0-1.4× the fp32 size of a 300M model on 2 ranks;
    0.41× with a fixed 128 KiB threshold from process start — setting it just before the build is too late).
    """
    _mallopt(M_MMAP_THRESHOLD, 128 * 1024)


def allow_heap_reuse() -> None:
    """Once the engine is built and peak memory measured (`metrics.LeanPeak`): the mmap threshold at 32 MiB (glibc's ceiling for its dynamic threshold)
    and the trim threshold at twice that (as glibc's dynamic rule sets it), so per-step activation buffers
    are reused from the heap instead of being mapped, faulted in and zeroed again at every allocation.
    Measured on the 63M GPT-2 of benchmarks/zero_stages.py, one CPU rank: 3.50 s per step with the
    128 KiB threshold kept for the whole run, 2.8 s after this call (the bare engine's time)."""
    _mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)
    _mallopt(M_TRIM_THRESHOLD, 64 * 1024 * 1024)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from, to be restored bit for bit on resume."""
    import deepspeed
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    accel = deepspeed.get_accelerator()
    if accel.device_name() != "cpu":
        state["accelerator"] = accel.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import deepspeed
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "accelerator" in state:
        deepspeed.get_accelerator().set_rng_state(state["accelerator"])


def shutdown(clean: bool = True) -> None:
    """Tear the process group down explicitly: without it ~1 run in 15 on CPU/gloo aborts with "terminate
    called without an active exception" after finishing, and the launcher reports failure. After an error
    the other ranks may be gone, so no barrier then."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def exit_without_teardown(code: int = 0) -> None:
    """End a launched rank with status `code` (0, or 128 + the signal that stopped it) without running C++ static destructors. Even after
    `destroy_process_group`, about 1 two-rank CPU/gloo run in 15 aborts at interpreter exit with "terminate
    called without an active exception" (a joinable std::thread destroyed during teardown); the launcher then
    kills the job and reports failure although every file is written. Everything is flushed first. Used by
    `dstk train` and by every script the tests and benchmarks start under the deepspeed launcher."""
    import logging
    import os
    import sys

    from toolkit.launcher.lock import release_all

    release_all()  # the folders this rank locked (os._exit skips atexit)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def settle_zero3(engine: Any) -> None:
    """Wait for and release every parameter ZeRO-3's prefetcher still has in flight. Evaluation forwards with
    no backward can leave prefetched parameters INFLIGHT (seen with peft-wrapped models), and a
    `GatheredParameters` over them then asserts "Cannot partition a param in flight"."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    if offload is not None:
        offload.get_param_coordinator().release_and_reset_all(engine.module)
