"""`dstk calibrate`: measure the machine it runs on and write a cluster description the planner uses.

Every rank of a local N-rank job (gloo on CPU, NCCL on CUDA, through torch.multiprocessing) measures at the
same time, so shared resources are measured as training shares them (on this 2-core machine each rank has
one core): dense matmul throughput at bf16 and fp32 for large GEMMs (the peak) and for training-sized ones
(the efficiency), memory bandwidth (copy), the host cost of one eager op, the bus bandwidth and latency of
all-reduce / all-gather / reduce-scatter / all-to-all between the ranks (alpha-beta fit over message sizes),
host↔device copy bandwidth, optional NVMe write/read bandwidth, and the memory a rank holds once torch,
DeepSpeed and transformers are imported and the process group is up.
"""

from __future__ import annotations

import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

TRAINING_SHAPES = ((2048, 768, 3072), (2048, 3072, 768), (1024, 512, 1536), (4096, 1024, 1024))
"""(m, k, n) of GEMMs a small-to-medium transformer runs (tokens × hidden → 3·hidden or 4·hidden)."""
LARGE_SHAPE = (2048, 2048, 2048)


def _timeit(fn: Any, repeat: int, sync: Any) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _matmul_tflops(dtype: Any, shape: tuple[int, int, int], device: Any, sync: Any, repeat: int = 5) -> float:
    import torch

    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    return 2 * m * k * n / _timeit(lambda: a @ b, repeat, sync) / 1e12


def _copy_gb_per_s(device: Any, sync: Any, numel: int = 1 << 25) -> float:
    import torch

    x = torch.empty(numel, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / _timeit(lambda: y.copy_(x), 5, sync) / 1e9


def _op_overhead_us(device: Any, sync: Any) -> float:
    import torch

    x = torch.ones(8, device=device)
    n = 200

    def ops() -> None:
        for _ in range(n):
            x.add_(1)

    return _timeit(ops, 5, sync) / n * 1e6


def _collectives(device: Any, sync: Any, world: int) -> dict[str, dict[str, float]]:
    """Bus bandwidth (GB/s) and latency (µs) per collective (nccl-tests' bus-bandwidth convention): the
    bandwidth from the two largest messages (the slope), the latency from the smallest (its time less its
    bytes at that bandwidth), each time the median of several calls."""
    import torch
    import torch.distributed as dist

    sizes = (1 << 8, 1 << 22, 1 << 24)  # elements (fp32): 1 KB, 16 MB, 64 MB
    out = {}
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        times = []
        for numel in sizes:
            x = torch.ones(numel, device=device)
            y = torch.empty(numel, device=device)
            gathered = torch.empty(numel * world, device=device)
            part = y[: numel // world]
            ops = {
                "all_reduce": lambda x=x: dist.all_reduce(x),
                "all_gather": lambda x=x, g=gathered: dist.all_gather_into_tensor(g, x),
                "reduce_scatter": lambda x=x, p=part: dist.reduce_scatter_tensor(p, x),
                "all_to_all": lambda x=x, y=y: dist.all_to_all_single(y, x),
            }
            dist.barrier()
            times.append(_timeit(ops[name], 7 if numel > 4096 else 30, sync))
        factor = 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world
        bus = [n * 4 * (world if name == "all_gather" else 1) * factor for n in sizes]
        busbw = (bus[2] - bus[1]) / max(times[2] - times[1], 1e-9)
        latency = max(times[0] - bus[0] / busbw, 0.0)
        out[name] = {"bus_gb_per_s": busbw / 1e9, "latency_us": latency * 1e6}
    return out


def _training_baseline_gib(device: Any) -> float:
    """RSS of a rank that has done what a training rank does before its model matters: the imports, the
    process group, and one step of a 1,000-parameter model through the engine (allocator, autograd, threads)."""
    import deepspeed
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)).to(device)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    loss = engine(torch.ones(1, 32, device=device)).sum()
    engine.backward(loss)
    engine.step()
    return _rss_gib()


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 2**30
    return 0.0


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


def _worker(rank: int, world: int, port: int, nvme: str | None, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    import deepspeed
    import torch
    import torch.distributed as dist
    import transformers  # noqa: F401 - imported to count its memory like a training rank does

    accel = deepspeed.get_accelerator()
    accel.set_device(rank)
    device = accel.device_name(rank)
    sync = accel.synchronize
    deepspeed.init_distributed(dist_init_required=True)
    result: dict[str, Any] = {
        "rank": rank,
        "accelerator": accel.device_name(),
        "framework_gib": _training_baseline_gib(device),
    }
    dist.barrier()
    result["large_tflops"] = {
        dt: _matmul_tflops(getattr(torch, dt), LARGE_SHAPE, device, sync) for dt in ("bfloat16", "float32")
    }
    result["training_tflops"] = {
        dt: statistics.median(_matmul_tflops(getattr(torch, dt), s, device, sync) for s in TRAINING_SHAPES)
        for dt in ("bfloat16", "float32")
    }
    dist.barrier()
    result["copy_gb_per_s"] = _copy_gb_per_s(device, sync)
    result["op_us"] = _op_overhead_us(device, sync)
    dist.barrier()
    result["collectives"] = _collectives(device, sync, world) if world > 1 else {}
    if accel.device_name() != "cpu":
        host = torch.empty(1 << 26, dtype=torch.uint8).pin_memory()
        dev = torch.empty_like(host, device=device)
        result["pcie_gb_per_s"] = (
            host.numel() / _timeit(lambda: dev.copy_(host, non_blocking=True), 5, sync) / 1e9
        )
        free, total = accel.available_memory(rank), accel.total_memory(rank)
        result["device_memory_gib"] = min(free, total) / 2**30
    if nvme and rank == 0:
        result["nvme_gb_per_s"] = _nvme_gb_per_s(Path(nvme))
    dist.barrier()
    dist.destroy_process_group()
    queue.put(result)


def measure(ranks: int, nvme: str | None = None) -> list[dict[str, Any]]:
    """Run the measurement on `ranks` local processes; one result dict per rank."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, ranks, port, nvme, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode not in (0, None):
            raise RuntimeError(f"calibration rank exited with {p.exitcode}")
    return sorted(results, key=lambda r: r["rank"])


def _total_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cluster_description(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """A cluster YAML from the measurements: the slowest rank's figure wherever ranks differ."""
    ranks = len(results)
    accel = results[0]["accelerator"]
    peak = min(r["large_tflops"]["bfloat16"] for r in results)
    fp32 = min(r["large_tflops"]["float32"] for r in results)
    eff = min(r["training_tflops"]["bfloat16"] / r["large_tflops"]["bfloat16"] for r in results)
    coll = results[0]["collectives"]
    ring = [coll[k] for k in ("all_reduce", "all_gather", "reduce_scatter")] if coll else []
    busbw = min(c["bus_gb_per_s"] for c in ring) if ring else 100.0
    latency = statistics.median(c["latency_us"] for c in ring) if ring else 10.0
    total_ram = _total_memory_gib()
    desc: dict[str, Any] = {
        "name": name,
        "nodes": 1,
        "gpus_per_node": ranks,
        "accelerator": accel,
        "gpu_memory_gib": round(0.9 * total_ram / ranks, 2)
        if accel == "cpu"
        else round(min(r["device_memory_gib"] for r in results), 2),
        "gpu_peak_tflops": round(peak, 4),
        "gpu_fp32_peak_tflops": round(fp32, 4),
        "supports_bf16": True,
        "supports_fp16": accel != "cpu",
        "gpu_memory_gb_per_s": round(min(r["copy_gb_per_s"] for r in results), 2),
        "gpu_matmul_efficiency": round(min(eff, 1.0), 3),
        "intra_node_gb_per_s": round(busbw, 3),
        "inter_node_gb_per_s": round(busbw, 3),
        "pcie_gb_per_s": round(min(r.get("pcie_gb_per_s", r["copy_gb_per_s"]) for r in results), 2),
        "cpu_memory_gib": round(total_ram, 1),
        "cpu_memory_gb_per_s": round(sum(r["copy_gb_per_s"] for r in results), 2),
        "nvme_gib": 0,
        "collective_latency_us": round(latency, 1),
        "kernel_launch_us": round(max(r["op_us"] for r in results), 2),
        "framework_overhead_gib": round(max(r["framework_gib"] for r in results), 3),
    }
    if results[0].get("nvme_gb_per_s"):
        desc["nvme_gb_per_s"] = round(results[0]["nvme_gb_per_s"], 2)
    return desc
