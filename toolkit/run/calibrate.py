"""`dstk calibrate`: measure the machine it runs on and write a cluster description the planner uses.

Every rank of a local N-rank job (gloo on CPU, NCCL on CUDA, through torch.multiprocessing) measures at the
same time, so shared resources are measured as training shares them (on this 2-core machine each rank has
one core): dense matmul throughput at bf16 and fp32 for large GEMMs (the peak) and for training-sized ones
(the efficiency), memory bandwidth (copy), the host cost of one eager op, the bus bandwidth and latency of
all-reduce / all-gather / reduce-scatter / all-to-all between the ranks (alpha-beta fit over message sizes,
in bf16, the dtype training communicates), DeepSpeed's optimizer step per parameter on the CPU accelerator,
host↔device copy bandwidth, optional NVMe write/read bandwidth, the memory a rank holds once torch,
DeepSpeed and transformers are imported and the process group is up, and (`storage_gb_per_s`, in the calling
process) what writing a checkpoint costs where it goes.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any

from toolkit.run.calibrate_engine import engine_probe, optimizer_probe, timeit

TRAINING_SHAPES = ((2048, 768, 3072), (2048, 3072, 768), (1024, 512, 1536), (4096, 1024, 1024))
"""(m, k, n) of GEMMs a small-to-medium transformer runs (tokens × hidden → 3·hidden or 4·hidden), at the
scale of `LARGE_SIDE`; on a CPU shrunk with the large probe where the dtype is slow (`_sizes`)."""
LARGE_SIDE = 2048
ACCELERATOR_LARGE_SIDE = 16384
"""On a GPU a 2048³ product is over in tens of microseconds, far from the peak: on an H200 it ran at 309
TFLOP/s bf16 where 8192³ reaches ~790, so a calibration capped at 2048 wrote a peak 2.5× too low (2026-12-04)."""
ACCELERATOR_TRAINING_SHAPES = tuple((4 * m, 4 * k, 4 * n) for m, k, n in TRAINING_SHAPES)
"""On a GPU the CPU's training shapes are launch-bound (a 2048×768×3072 forward and backward: 46 TFLOP/s on
the H200, 0.18 of its 2048³ product) and would price a 7B model's GEMMs at a kernel's issue time, which the
cost model counts apart (`kernel_launch_us`). Four times larger, they are a 1–7B model's GEMMs at 8k tokens."""
PROBE_SECONDS = 0.02
"""Time one probe GEMM should take at least: the large GEMM's side doubles from 128 until one product takes
this long (or reaches `LARGE_SIDE`), so a dtype that is emulated (bf16 on an AVX2-only CPU: 0.8 vs 60 GFLOP/s
in fp32) is measured on small shapes in seconds, not minutes, and the training-sized probes, which scale
with it, stay within the time box on a CPU (fp32 stops at 1024³, 20–40 ms, on the 2-core hosts)."""


def _large_side(dtype: Any, device: Any, sync: Any, limit: int = LARGE_SIDE) -> int:
    """The side of the large GEMM probe: doubled from 128 while one product takes under `PROBE_SECONDS`.

    Sized by time, not from a rate measured on one small product: with two ranks of 8 OpenMP threads on the 16
    vCPUs of a lent Xeon (AMX), a 128³ bf16 product sometimes ran at 0.5 GFLOP/s for five calls in a row
    (a parallel region waits for a descheduled thread, milliseconds against microseconds of work) while the
    same process reached 2,300 GFLOP/s at 512³; a probe sized from that rate stayed at 128³ and the
    calibration planned fp32 on a CPU whose bf16 is 3× faster (2026-12-04). Doubling stops only on a product
    that is really slow, which a stall of a few milliseconds is not."""
    import torch

    side = 128
    while side < limit:
        a = torch.randn(side, side, dtype=dtype, device=device)
        if timeit(lambda a=a: a @ a, 3, sync) >= PROBE_SECONDS:
            break
        side *= 2
    return min(side, limit)


def _sizes(side: int) -> tuple[tuple[int, int, int], tuple[tuple[int, int, int], ...]]:
    """The large GEMM and the training-sized ones, scaled with it."""
    scale = side / LARGE_SIDE
    shapes = tuple(tuple(max(64, int(d * scale) // 16 * 16) for d in s) for s in TRAINING_SHAPES)
    return (side, side, side), shapes  # type: ignore[return-value]


def _matmul_tflops(dtype: Any, shape: tuple[int, int, int], device: Any, sync: Any, repeat: int = 5) -> float:
    import torch

    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    return 2 * m * k * n / timeit(lambda: a @ b, repeat, sync) / 1e12


def _linear_train_tflops(dtype: Any, shape: tuple[int, int, int], device: Any, sync: Any) -> float:
    """A Linear layer's forward and backward (input and weight gradients: the transposed GEMMs training runs,
    which on some back-ends are slower than the plain product), 6·m·k·n FLOPs."""
    import torch

    m, k, n = shape
    layer = torch.nn.Linear(k, n, bias=False, device=device, dtype=dtype)
    x = torch.randn(m, k, dtype=dtype, device=device, requires_grad=True)
    grad = torch.randn(m, n, dtype=dtype, device=device)

    def step() -> None:
        layer(x).backward(grad)

    return 6 * m * k * n / timeit(step, 3, sync) / 1e12


def _attention_tflops(dtype: Any, device: Any, sync: Any) -> float:
    """Causal scaled-dot-product attention forward and backward at a training shape, in the FLOPs the cost
    model counts for it (4·s·h per token forward, i.e. QKᵀ and AV without the causal half skipped, ×3)."""
    import torch
    import torch.nn.functional as F

    on_cpu = torch.device(device).type == "cpu"
    b, heads, s, d = (4, 12, 256, 64) if on_cpu else (4, 16, 2048, 128)
    q, k, v = (torch.randn(b, heads, s, d, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, heads, s, d, dtype=dtype, device=device)

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return 3 * 4 * b * s * s * heads * d / timeit(step, 3, sync) / 1e12


def _elementwise_gb_per_s(dtype: Any, device: Any, sync: Any, nbytes: int = 1 << 24) -> float:
    """Bandwidth of memory-bound kernels at the training dtype (a scalar multiply, then a sum of two
    tensors: 2 + 3 passes), which is what norms, activations and residual adds achieve. 16 MiB tensors in any
    dtype: under glibc's 32 MiB mmap ceiling, so on CPU their buffers come from the heap as training's do
    after `allow_heap_reuse` (32 MiB fp32 tensors are mapped and faulted in afresh: 2.8 GB/s against 19)."""
    import torch

    numel = nbytes // torch.empty(0, dtype=dtype).element_size()

    x = torch.randn(numel, dtype=dtype, device=device)
    y = torch.randn(numel, dtype=dtype, device=device)

    def ops() -> None:
        torch.add(x.mul(1.5), y)

    return 5 * numel * x.element_size() / timeit(ops, 5, sync) / 1e9


def _copy_gb_per_s(device: Any, sync: Any, numel: int = 1 << 24) -> float:
    import torch

    x = torch.empty(numel, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / timeit(lambda: y.copy_(x), 5, sync) / 1e9


def _op_overhead_us(device: Any, sync: Any) -> float:
    import torch

    x = torch.ones(8, device=device)
    n = 200

    def ops() -> None:
        for _ in range(n):
            x.add_(1)

    return timeit(ops, 5, sync) / n * 1e6


def _collectives(device: Any, sync: Any, world: int, dtype: Any) -> dict[str, dict[str, float]]:
    """Bus bandwidth (GB/s) and latency (µs) per collective (nccl-tests' bus-bandwidth convention): the
    bandwidth from the two largest messages (the slope), the latency from the smallest (its time less its
    bytes at that bandwidth), each time the median of several calls.

    Measured in the training dtype, the one gradients and parameters travel in: gloo sums bf16 in scalar
    code well under its fp32 byte rate (all-reduce of 126 MB on the 2-core machine, bus bandwidth: 0.85 GB/s
    in bf16, 1.33 in fp32; benchmarks/step_memory.py), while NCCL's rate does not depend on the dtype."""
    import torch
    import torch.distributed as dist

    sizes = (1 << 9, 1 << 21, 1 << 23)  # elements: 1-2 KB, 4-8 MB, 16-32 MB
    out = {}
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        times = []
        for numel in sizes:
            x = torch.ones(numel, device=device, dtype=dtype)
            y = torch.empty(numel, device=device, dtype=dtype)
            gathered = torch.empty(numel * world, device=device, dtype=dtype)
            part = y[: numel // world]
            ops = {
                "all_reduce": lambda x=x: dist.all_reduce(x),
                "all_gather": lambda x=x, g=gathered: dist.all_gather_into_tensor(g, x),
                "reduce_scatter": lambda x=x, p=part: dist.reduce_scatter_tensor(p, x),
                "all_to_all": lambda x=x, y=y: dist.all_to_all_single(y, x),
            }
            dist.barrier()
            times.append(timeit(ops[name], 3 if numel > 4096 else 20, sync))
        # nccl-tests' bus-bandwidth factors: 2(n-1)/n all-reduce, (n-1)/n the rings
        factor = 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world
        bus = [n * x.element_size() * (world if name == "all_gather" else 1) * factor for n in sizes]
        busbw = (bus[2] - bus[1]) / max(times[2] - times[1], 1e-9)
        latency = max(times[0] - bus[0] / busbw, 0.0)
        out[name] = {"bus_gb_per_s": busbw / 1e9, "latency_us": latency * 1e6}
    return out


def _nvme_gb_per_s(path: Path, mbytes: int = 256) -> float:
    """Write then read a file on `path` (fsync'd; the read may hit the page cache, an upper bound)."""
    data = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=path, delete=True) as f:
        t = time.perf_counter()
        for _ in range(mbytes):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
        write = mbytes / 1e3 / (time.perf_counter() - t)
        f.seek(0)
        t = time.perf_counter()
        while f.read(1 << 24):
            pass
        read = mbytes / 1e3 / (time.perf_counter() - t)
    return 2 / (1 / write + 1 / read)


def storage_gb_per_s(path: Path, mbytes: int = 64) -> float:
    """What a synchronous dstk checkpoint costs per byte where it is written: write, fsync, then the SHA-256
    its manifest records (toolkit.run.checkpoint) — the rate `storage_gb_per_s` prices saves with."""
    import hashlib

    data = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".dstk-calibrate-", delete=True) as f:
        t = time.perf_counter()
        for _ in range(mbytes):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
        f.seek(0)
        h = hashlib.sha256()
        while chunk := f.read(1 << 22):
            h.update(chunk)
        return mbytes * (1 << 20) / 1e9 / (time.perf_counter() - t)


def _progress(rank: int) -> Any:
    """Rank 0's progress lines on stderr, with the seconds since the ranks joined: a calibration takes tens
    of seconds, and a user should see it move."""
    start = time.monotonic()

    def say(text: str) -> None:
        if rank == 0:
            print(f"  {time.monotonic() - start:5.1f} s  {text}", file=sys.stderr, flush=True)

    return say


def _worker(rank: int, world: int, port: int, nvme: str | None, queue: Any) -> None:
    from toolkit.run.chatter import quiet

    quiet()  # a spawned process: the CLI's silencing of library notices does not reach it
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    # the modeling code a training rank loads (bare `import transformers` is 19 MiB of the 126 it costs)
    import datasets  # noqa: F401 - dstk's data loader reads through it
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401

    accel = deepspeed.get_accelerator()
    accel.set_device(rank)
    on_cpu = accel.device_name() == "cpu"
    from toolkit.plan.layout import fastest_precision
    from toolkit.run.metrics import device_memory_outside_allocator
    from toolkit.run.runtime import allow_heap_reuse

    allow_heap_reuse()  # measure the steady state `dstk train` reaches after its first two steps
    if on_cpu:
        # as `dstk launch` runs CPU ranks: the cores shared out, no oversubscribed OpenMP pools
        torch.set_num_threads(
            int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // world)
        )
    device = accel.device_name(rank)
    sync = accel.synchronize
    from toolkit.run.chatter import init_distributed_quietly

    init_distributed_quietly(lambda: deepspeed.init_distributed(dist_init_required=True))
    result: dict[str, Any] = {
        "rank": rank,
        "accelerator": accel.device_name(),
        # bf16 runs on every CPU (emulated where the ISA lacks it, which the rates show); on GPUs it needs
        # Ampere or newer
        "supports_bf16": on_cpu or accel.is_bf16_supported(),
    }
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if not on_cpu:
        dtypes["fp16"] = torch.float16
    dist.barrier()
    say = _progress(rank)
    say("ranks joined; matrix-multiply probes")
    result["large_tflops"], result["training_tflops"], result["shapes"] = {}, {}, {}
    for p, dt in dtypes.items():
        if on_cpu:
            large, shapes = _sizes(_large_side(dt, device, sync))
        else:
            side = _large_side(dt, device, sync, ACCELERATOR_LARGE_SIDE)
            large, shapes = (side, side, side), ACCELERATOR_TRAINING_SHAPES
        result["shapes"][p] = large[0]
        result["large_tflops"][p] = _matmul_tflops(dt, large, device, sync)
        result["training_tflops"][p] = statistics.median(
            _linear_train_tflops(dt, s, device, sync) for s in shapes
        )
        say(f"{p}: {result['large_tflops'][p] * 1e3:,.4g} GFLOP/s at {large[0]}³")
    # every rank must probe the same way, in the precision fastest by the slowest rank's figures: those the
    # cluster file records (rounded as written, host.calibration.cluster_description), from which the
    # planner's default_precision chooses again; rank 0's own figures could disagree with them
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result["large_tflops"])
    supported = {
        p: round(min(g[p] for g in gathered), 4)
        for p in result["large_tflops"]
        if p != "bf16" or result["supports_bf16"]
    }
    precision = result["precision"] = fastest_precision(supported)
    dtype = dtypes[precision]
    say(f"training precision {precision}; a DeepSpeed engine step")
    result["engine"] = engine_probe(device, precision)
    dist.barrier()
    say("attention, memory bandwidth, kernel overhead")
    result["attention_tflops"] = _attention_tflops(dtype, device, sync)
    dist.barrier()
    result["copy_gb_per_s"] = _copy_gb_per_s(device, sync)
    result["elementwise_gb_per_s"] = _elementwise_gb_per_s(dtype, device, sync)
    result["op_us"] = _op_overhead_us(device, sync)
    dist.barrier()
    say("collectives" + (" and the optimizer step" if on_cpu else ""))
    result["collectives"] = _collectives(device, sync, world, dtype) if world > 1 else {}
    if on_cpu:
        # on GPUs the step is HBM-bound kernels, which the analytic model prices; on the CPU it is not
        result["optimizer_ns_per_param"] = optimizer_probe(device, world, precision)
    if not on_cpu:
        host = torch.empty(1 << 26, dtype=torch.uint8).pin_memory()
        dev = torch.empty_like(host, device=device)
        result["pcie_gb_per_s"] = (
            host.numel() / timeit(lambda: dev.copy_(host, non_blocking=True), 5, sync) / 1e9
        )
        free, total = accel.available_memory(rank), accel.total_memory(rank)
        result["device_memory_gib"] = min(free, total) / 2**30
        # the CUDA context and, after the collectives above, NCCL's buffers: what a rank's device holds
        # beyond its tensors (the RSS below is host memory, which on a GPU node is not the device's)
        result["device_outside_gib"] = device_memory_outside_allocator() / 2**30
        # CPU Adam and offload copies run at the host's memory bandwidth, not the device's copy rate
        result["host_copy_gb_per_s"] = _copy_gb_per_s("cpu", lambda: None)
    if nvme and rank == 0:
        result["nvme_gb_per_s"] = _nvme_gb_per_s(Path(nvme))
    dist.barrier()
    dist.destroy_process_group()
    queue.put(result)
    queue.close()
    queue.join_thread()  # the result is in the pipe before the process ends
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15, which would fail the calibration


def measure(ranks: int, nvme: str | None = None, timeout_s: float = 600) -> list[dict[str, Any]]:
    """Run the measurement on `ranks` local processes; one result dict per rank. A rank that dies or a
    measurement that overruns `timeout_s` (the first DeepSpeed op build included) ends it with an error."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, ranks, port, nvme, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < ranks:
        try:
            results.append(queue.get(timeout=1))
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                why = f"a rank exited with status {dead[0]}" if dead else f"no result after {timeout_s:.0f} s"
                raise RuntimeError(f"calibration failed: {why}") from None
    for p in procs:
        p.join(timeout=60)
        if p.exitcode not in (0, None):
            raise RuntimeError(f"calibration rank exited with {p.exitcode}")
    return sorted(results, key=lambda r: r["rank"])
