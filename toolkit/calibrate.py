"""`dstk calibrate`: measure the machine it runs on and write a cluster description the planner uses.

Every rank of a local N-rank job (gloo on CPU, NCCL on CUDA, through torch.multiprocessing) measures at the
same time, so shared resources are measured as training shares them (on this 2-core machine each rank has
one core): dense matmul throughput at bf16 and fp32 for large GEMMs (the peak) and for training-sized ones
(the efficiency), memory bandwidth (copy), the host cost of one eager op, the bus bandwidth and latency of
all-reduce / all-gather / reduce-scatter / all-to-all between the ranks (alpha-beta fit over message sizes,
in bf16, the dtype training communicates), DeepSpeed's optimizer step per parameter on the CPU accelerator,
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
from queue import Empty
from typing import Any

TRAINING_SHAPES = ((2048, 768, 3072), (2048, 3072, 768), (1024, 512, 1536), (4096, 1024, 1024))
"""(m, k, n) of GEMMs a small-to-medium transformer runs (tokens × hidden → 3·hidden or 4·hidden), at the
scale of `LARGE_SIDE`; shrunk with it where the dtype is slow (`_sizes`)."""
LARGE_SIDE = 2048
PROBE_SECONDS = 0.05
"""Time one probe GEMM should take: the sizes come from a first 128³ product, so a dtype that is emulated
(bf16 on an AVX2-only CPU: 0.8 GFLOP/s vs 60 in fp32) is measured on small shapes in seconds, not minutes."""


def _sizes(rate_flops: float) -> tuple[tuple[int, int, int], tuple[tuple[int, int, int], ...]]:
    """The large GEMM and the training-sized ones, scaled so the large one takes about `PROBE_SECONDS`."""
    side = int((rate_flops * PROBE_SECONDS / 2) ** (1 / 3)) // 64 * 64
    side = min(max(side, 128), LARGE_SIDE)
    scale = side / LARGE_SIDE
    shapes = tuple(tuple(max(64, int(d * scale) // 16 * 16) for d in s) for s in TRAINING_SHAPES)
    return (side, side, side), shapes  # type: ignore[return-value]


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

    return 6 * m * k * n / _timeit(step, 3, sync) / 1e12


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

    return 3 * 4 * b * s * s * heads * d / _timeit(step, 3, sync) / 1e12


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

    return 5 * numel * x.element_size() / _timeit(ops, 5, sync) / 1e9


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
            times.append(_timeit(ops[name], 5 if numel > 4096 else 20, sync))
        # nccl-tests' bus-bandwidth factors: 2(n-1)/n all-reduce, (n-1)/n the rings
        factor = 2 * (world - 1) / world if name == "all_reduce" else (world - 1) / world
        bus = [n * x.element_size() * (world if name == "all_gather" else 1) * factor for n in sizes]
        busbw = (bus[2] - bus[1]) / max(times[2] - times[1], 1e-9)
        latency = max(times[0] - bus[0] / busbw, 0.0)
        out[name] = {"bus_gb_per_s": busbw / 1e9, "latency_us": latency * 1e6}
    return out


def _probe_engine(
    device: Any, gpt2: dict[str, int], zero: dict[str, Any], precision: str, **extra: Any
) -> tuple[Any, Any]:
    """A DeepSpeed engine over an HF GPT-2 built from `gpt2`, in a dstk config's shape (`precision`, clipping,
    torch AdamW) with ZeRO section `zero` and `extra` config keys, and one micro-batch of random tokens."""
    import deepspeed
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "steps_per_print": 10**9,
        **extra,
    }
    model = GPT2LMHeadModel(GPT2Config(**gpt2)).to(device)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    x = torch.randint(0, gpt2["vocab_size"], (1, gpt2["n_positions"]), device=device)
    return engine, x


ENGINE_PROBE = {"n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 16}
"""A GPT-2 so small that its arithmetic is negligible: what one of its steps costs is the host's part."""


def _engine_probe(device: Any, precision: str, steps: int = 12) -> dict[str, float]:
    """Seconds per optimizer step of a 1- and a 5-block HF GPT-2 (bf16, ZeRO-0, clipping, warm-up schedule: a
    dstk config's shape) through the DeepSpeed engine, and the RSS afterwards. A quarter of the difference
    is one block's host cost (eager ops, autograd, optimizer loop over its tensors) per micro-batch; what the
    1-block step costs beyond one block is the engine's fixed per-step cost (bookkeeping, clipping,
    scheduler, loss reduction). Run the same way on every rank, so the gradient all-reduce is in it too."""
    import deepspeed

    times = {}
    for layers in (1, 5):
        engine, x = _probe_engine(
            device,
            {"n_layer": layers, **ENGINE_PROBE},
            {"stage": 0},
            precision,
            scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        )

        def step(engine: Any = engine, x: Any = x) -> None:
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            loss.item()

        times[layers] = (
            _timeit(lambda: [step() for _ in range(steps)], 1, deepspeed.get_accelerator().synchronize)
            / steps
        )
        del engine
    block = max(times[5] - times[1], 0.0) / 4
    return {
        "block_s": block,
        "step_s": max(times[1] - block, 0.0),
        "rss_gib": _rss_gib(),
    }


OPTIMIZER_PROBE = {"n_layer": 4, "n_embd": 768, "n_head": 12, "vocab_size": 8192, "n_positions": 64}
"""A 35M-parameter GPT-2 (GPT-2 small's width, 4 blocks): the many tensors of a real model, each under
glibc's 32 MiB mmap ceiling in fp32, while a ZeRO-1 partition of them (69 MB on 2 ranks) is above it, as
any real model's is — the two regimes the two code paths run in."""


def _optimizer_probe(device: Any, world: int, precision: str, steps: int = 3) -> dict[str, float]:
    """Nanoseconds per updated parameter of `engine.step()` less its all-gather, at ZeRO-0 (`replicated`)
    and ZeRO-1 (`partitioned`), in a dstk config's shape (bf16, clipping, torch AdamW), after
    `allow_heap_reuse` as `dstk train` runs it. The median of `steps` steps after the first (which creates
    the optimizer state); ZeRO-1's all-gather of the updated partitions (one bf16 call over the model,
    `all_gather_dp_groups`) is timed alone and taken off, the cost model prices it as communication."""
    import deepspeed
    import torch
    import torch.distributed as dist

    width = OPTIMIZER_PROBE["n_embd"]
    out = {}
    for stage, path in ((0, "replicated"), (1, "partitioned")):
        buckets = {"reduce_bucket_size": width * width, "allgather_bucket_size": width * width}
        engine, x = _probe_engine(
            device, OPTIMIZER_PROBE, {"stage": stage, **buckets, "overlap_comm": True}, precision
        )
        n_params = sum(p.numel() for p in engine.module.parameters())
        sync = deepspeed.get_accelerator().synchronize
        times = []
        for _ in range(steps + 1):
            engine.backward(engine(input_ids=x, labels=x).loss)
            sync()
            t = time.perf_counter()
            engine.step()
            sync()
            times.append(time.perf_counter() - t)
        gather = 0.0
        if stage:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
            full = torch.empty(n_params - n_params % world, device=device, dtype=dtype)
            part = full[: full.numel() // world].clone()
            gather = _timeit(lambda f=full, p=part: dist.all_gather_into_tensor(f, p), steps, sync)
        shard = n_params / (world if stage else 1)
        out[path] = max(statistics.median(times[1:]) - gather, 0.0) / shard * 1e9
        del engine
    return out


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
    # the modeling code a training rank loads (bare `import transformers` is 19 MiB of the 126 it costs)
    import datasets  # noqa: F401 - dstk's data loader reads through it
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import GPT2LMHeadModel, LlamaForCausalLM  # noqa: F401

    accel = deepspeed.get_accelerator()
    accel.set_device(rank)
    from toolkit.runtime import allow_heap_reuse

    allow_heap_reuse()  # measure the steady state `dstk train` reaches after its first two steps
    if accel.device_name() == "cpu":
        # as `dstk launch` runs CPU ranks: the cores shared out, no oversubscribed OpenMP pools
        torch.set_num_threads(
            int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // world)
        )
    device = accel.device_name(rank)
    sync = accel.synchronize
    deepspeed.init_distributed(dist_init_required=True)
    result: dict[str, Any] = {
        "rank": rank,
        "accelerator": accel.device_name(),
        # bf16 runs on every CPU (emulated where the ISA lacks it, which the rates show); on GPUs it needs
        # Ampere or newer
        "supports_bf16": accel.device_name() == "cpu" or accel.is_bf16_supported(),
    }
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if accel.device_name() != "cpu":
        dtypes["fp16"] = torch.float16
    dist.barrier()
    # a first 128³ product per dtype sizes the probes, so an emulated dtype costs seconds
    rough = {
        p: _matmul_tflops(dt, (128, 128, 128), device, sync, repeat=3) * 1e12 for p, dt in dtypes.items()
    }
    result["large_tflops"], result["training_tflops"], result["shapes"] = {}, {}, {}
    for p, dt in dtypes.items():
        large, shapes = _sizes(rough[p])
        result["shapes"][p] = large[0]
        result["large_tflops"][p] = _matmul_tflops(dt, large, device, sync)
        result["training_tflops"][p] = statistics.median(
            _linear_train_tflops(dt, s, device, sync) for s in shapes
        )
    # every rank must probe the same way: rank 0's choice of the training precision is the job's
    choice = [_fastest(result["large_tflops"], accel)]
    dist.broadcast_object_list(choice, src=0)
    precision = result["precision"] = choice[0]
    dtype = dtypes[precision]
    result["engine"] = _engine_probe(device, precision)
    dist.barrier()
    result["attention_tflops"] = _attention_tflops(dtype, device, sync)
    dist.barrier()
    result["copy_gb_per_s"] = _copy_gb_per_s(device, sync)
    result["elementwise_gb_per_s"] = _elementwise_gb_per_s(dtype, device, sync)
    result["op_us"] = _op_overhead_us(device, sync)
    dist.barrier()
    result["collectives"] = _collectives(device, sync, world, dtype) if world > 1 else {}
    if accel.device_name() == "cpu":
        # on GPUs the step is HBM-bound kernels, which the analytic model prices; on the CPU it is not
        result["optimizer_ns_per_param"] = _optimizer_probe(device, world, precision)
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


def _fastest(large_tflops: dict[str, float], accel: Any) -> str:
    """The training precision this accelerator computes fastest (bf16, then fp16, when at least as fast
    as fp32 and supported; `toolkit.layout.default_precision` makes the same choice from the result)."""
    for p in ("bf16", "fp16"):
        if p in large_tflops and large_tflops[p] >= large_tflops["fp32"]:
            if p == "bf16" and accel.device_name() != "cpu" and not accel.is_bf16_supported():
                continue
            return p
    return "fp32"


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


def _kernel_us(result: dict[str, Any]) -> float:
    """Host cost per kernel as the cost model counts kernels: one block's measured host cost per micro-batch
    over the kernels its forward and backward issue (3 × `kernels_per_block`); one bare eager op if the
    probe's difference drowned in noise."""
    from toolkit.compute import kernels_per_block
    from toolkit.specs import ModelSpec

    probe = ModelSpec(
        name="probe",
        architecture="gpt2",
        n_layers=1,
        hidden_size=32,
        n_heads=2,
        vocab_size=128,
        seq_length=16,
    )
    per_kernel = result["engine"]["block_s"] / (3 * kernels_per_block(probe)) * 1e6
    return per_kernel if per_kernel > result["op_us"] else result["op_us"]


def _total_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cluster_description(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """A cluster YAML from the measurements: the slowest rank's figure wherever ranks differ."""
    ranks = len(results)
    accel = results[0]["accelerator"]
    sixteen = "bf16" if results[0]["supports_bf16"] or accel == "cpu" else "fp16"
    precision = results[0]["precision"]
    peak = min(r["large_tflops"][sixteen] for r in results)
    fp32 = min(r["large_tflops"]["fp32"] for r in results)
    # efficiencies at the precision training will run in (the fastest one), as the cost model applies them
    eff = min(r["training_tflops"][precision] / r["large_tflops"][precision] for r in results)
    attention = min(r["attention_tflops"] / r["large_tflops"][precision] for r in results)
    coll = {
        name: {
            "bus_gb_per_s": min(r["collectives"][name]["bus_gb_per_s"] for r in results),
            "latency_us": statistics.median(r["collectives"][name]["latency_us"] for r in results),
        }
        for name in results[0]["collectives"]
    }
    # all-reduce is the collective everyone quotes (nccl-tests); the others are kept beside it because on gloo
    # they differ several-fold
    busbw = coll["all_reduce"]["bus_gb_per_s"] if coll else 100.0
    latency = statistics.median(c["latency_us"] for c in coll.values()) if coll else 10.0
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
        "supports_bf16": bool(results[0]["supports_bf16"]),
        "supports_fp16": accel != "cpu",
        "gpu_memory_gb_per_s": round(min(r["elementwise_gb_per_s"] for r in results), 2),
        "gpu_matmul_efficiency": round(min(eff, 1.0), 3),
        "attention_efficiency": round(min(attention, 1.0), 3),
        "intra_node_gb_per_s": round(busbw, 3),
        "inter_node_gb_per_s": round(busbw, 3),
        "pcie_gb_per_s": round(min(r.get("pcie_gb_per_s", r["copy_gb_per_s"]) for r in results), 2),
        "cpu_memory_gib": round(total_ram, 1),
        "cpu_memory_gb_per_s": round(sum(r["copy_gb_per_s"] for r in results), 2),
        "nvme_gib": 0,
        "collective_latency_us": round(latency, 1),
        "collective_bus_gb_per_s": {k: round(v["bus_gb_per_s"], 3) for k, v in coll.items()} or None,
        "kernel_launch_us": round(max(_kernel_us(r) for r in results), 2),
        "framework_overhead_gib": round(max(r["engine"]["rss_gib"] for r in results), 3),
        "step_overhead_ms": round(max(r["engine"]["step_s"] for r in results) * 1e3, 2),
    }
    if results[0].get("optimizer_ns_per_param"):
        desc["optimizer_ns_per_param"] = {
            path: round(max(r["optimizer_ns_per_param"][path] for r in results), 2)
            for path in results[0]["optimizer_ns_per_param"]
        }
    if results[0].get("nvme_gb_per_s"):
        desc["nvme_gb_per_s"] = round(results[0]["nvme_gb_per_s"], 2)
    return desc
