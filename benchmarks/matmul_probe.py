"""torch's CPU matmul rates as `dstk calibrate`'s ranks meet them: N processes started at once, T threads each,
bf16 and fp32 `a @ b` on n×n matrices at n = 128, 512, 1024, 2048 (median and best of 5 calls after one
warm-up call, whose time is printed too).

It answers two questions the calibration depends on. Is bf16 native or emulated on this host, and does
`ONEDNN_MAX_CPU_ISA=AVX2` make a native-bf16 host emulate it (`python benchmarks/matmul_probe.py 1 1`, with and
without the variable)? Do small GEMMs stall when the ranks' thread pools fill every CPU
(`python benchmarks/matmul_probe.py 2 8` on a 16-vCPU host)? Prints one line per process; writes nothing.

Usage: python benchmarks/matmul_probe.py PROCESSES THREADS
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

SIZES = (128, 512, 1024, 2048)


def _probe(rank: int, threads: int, barrier: Any, queue: Any) -> None:
    import torch

    torch.set_num_threads(threads)
    out: dict[str, Any] = {
        "rank": rank,
        "threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)),
    }
    barrier.wait()
    for dtype in (torch.bfloat16, torch.float32):
        for n in SIZES:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            t0 = time.perf_counter()
            a @ b
            first = time.perf_counter() - t0
            times = []
            for _ in range(5):
                t = time.perf_counter()
                a @ b
                times.append(time.perf_counter() - t)
            flops = 2 * n**3 / 1e9
            out[f"{str(dtype).removeprefix('torch.')}_{n}"] = (
                round(flops / statistics.median(times), 1),
                round(flops / min(times), 1),
                round(first * 1e3, 1),
            )
            if first > 1.0:  # an emulated dtype: the next size (8x the work) would take minutes
                break
    queue.put(out)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1].strip())
    procs, threads = int(sys.argv[1]), int(sys.argv[2])
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_probe, args=(r, threads, barrier, queue)) for r in range(procs)]
    for w in workers:
        w.start()
    results = sorted((queue.get() for _ in workers), key=lambda r: r["rank"])
    for w in workers:
        w.join()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "unset")
    print(
        f"# {procs} processes × {threads} threads, ONEDNN_MAX_CPU_ISA={cap}: GFLOP/s (median, best), first call ms"
    )
    for r in results:
        print(r)


if __name__ == "__main__":
    main()
