"""Where a rank's memory peaks, and what the optimizer step costs the host, per ZeRO stage — beside the cost model.

For ZeRO 0–3 on the 63M GPT-2 of zero_stages.py (2 CPU ranks, micro-batch 2, dstk's config for it), each rank
resets its peak RSS (VmHWM, via /proc/self/clear_refs) before forward and before `engine.step()`, so the
peak of forward + backward and the peak inside the step are measured apart. They stand beside what `dstk
estimate` predicts for each: states + overhead + activations + buffers, and states + overhead + the step's
transient (`step_transient`: the fp32 gradient and, on the CPU accelerator, torch AdamW's temporaries).
As `dstk train` does, the first 2 steps run with large blocks mmapped (RSS is then what is alive); after
`allow_heap_reuse` the steady steps time `engine.step()` and count its minor page faults (memory faulted in
afresh each step). The run also times a 126 MB gloo all-reduce in bf16 and in fp32 (the dtype's effect on
gloo's summation). Output: CSV, Markdown and JSON in benchmarks/results/.
Usage: python benchmarks/step_memory.py [--cluster FILE] [--steps 6] [--quick]
    (worker, run by the script under `dstk launch`: step_memory.py --worker CONFIG MODEL OUT.json STEPS)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = [
    "stage",
    "shard_params",
    "fwd_bwd_peak_bytes",
    "predicted_fwd_bwd_peak_bytes",
    "step_peak_bytes",
    "predicted_step_peak_bytes",
    "step_peak_ratio",
    "after_step_rss_bytes",
    "step_rise_per_shard_param",
    "predicted_transient_per_shard_param",
    "step_s",
    "step_minor_fault_bytes",
]
LEAN_STEPS = 2  # as toolkit.run.loop: peaks over the steps before the allocator switch
MIB = 2**20


def _status() -> dict[str, int]:
    """VmHWM and VmRSS of this process, bytes."""
    lines = Path("/proc/self/status").read_text().splitlines()
    return {
        k: int(v.split()[0]) * 1024
        for k, _, v in (ln.partition(":") for ln in lines)
        if k in ("VmHWM", "VmRSS")
    }


def _reset_peak() -> None:
    """Linux: VmHWM := VmRSS (clear_refs 5), so the next read is the peak since now."""
    Path("/proc/self/clear_refs").write_text("5")


def _allreduce_gb_per_s(dist: Any, torch: Any, nbytes: int = 126 * 10**6, reps: int = 5) -> dict[str, float]:
    """Bus bandwidth (nccl-tests' 2(n-1)/n convention) of an `nbytes` all-reduce in bf16 and in fp32."""
    n = dist.get_world_size()
    out = {}
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.ones(nbytes // torch.tensor([], dtype=dtype).element_size(), dtype=dtype)
        times = []
        for _ in range(reps):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t)
        out[str(dtype).removeprefix("torch.")] = nbytes * 2 * (n - 1) / n / statistics.median(times) / 1e9
    return out


def worker(config: str, model_file: str, out: str, steps: int) -> None:
    from toolkit.run.runtime import keep_large_blocks_in_mmap

    keep_large_blocks_in_mmap()  # before torch, as dstk train does
    import deepspeed
    import torch
    import torch.distributed as dist

    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model
    from toolkit.run.runtime import allow_heap_reuse

    deepspeed.init_distributed()
    cfg = json.loads(Path(config).read_text())
    spec = load_model(model_file)
    torch.manual_seed(0)
    model = build_model(spec, cfg)  # as dstk train builds it (ZeRO-3: partitioned while it is built)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    micro = cfg["train_micro_batch_size_per_gpu"]
    x = torch.randint(
        0, spec.vocab_size, (micro, spec.seq_length), generator=torch.Generator().manual_seed(1)
    )
    page = os.sysconf("SC_PAGE_SIZE")
    fwd_bwd, in_step, after, step_s, faults = [], [], [], [], []
    for i in range(LEAN_STEPS + steps):
        if i == LEAN_STEPS:
            allow_heap_reuse()
        _reset_peak()
        engine.backward(engine(input_ids=x, labels=x).loss)
        fwd_bwd.append(_status()["VmHWM"])
        _reset_peak()
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - t0)
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) * page)
        status = _status()
        in_step.append(status["VmHWM"])
        after.append(status["VmRSS"])
    rise = max(p - a for p, a in zip(in_step[:LEAN_STEPS], after[:LEAN_STEPS], strict=True))
    mine = {
        "fwd_bwd_peak_bytes": max(fwd_bwd[:LEAN_STEPS]),
        "step_peak_bytes": max(in_step[:LEAN_STEPS]),
        "after_step_rss_bytes": after[LEAN_STEPS - 1],
        "step_rise_bytes": rise,
        "step_s": statistics.median(step_s[LEAN_STEPS:]),
        "step_minor_fault_bytes": statistics.median(faults[LEAN_STEPS:]),
    }
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    allreduce = _allreduce_gb_per_s(dist, torch)
    if dist.get_rank() == 0:
        # memory: the most loaded rank; time and faults: rank 0's (the ranks step in lockstep)
        worst = {
            k: max(r[k] for r in ranks)
            for k in ("fwd_bwd_peak_bytes", "step_peak_bytes", "after_step_rss_bytes", "step_rise_bytes")
        }
        Path(out).write_text(json.dumps({**mine, **worst, "allreduce_bus_gb_per_s": allreduce}))
    dist.barrier()


def main() -> int:
    from benchmarks.common import (
        TINY_GPT2,
        bench_env,
        command_line,
        dstk,
        free_port,
        output_paths,
        write_csv,
        write_record,
    )
    from benchmarks.zero_stages import FULL_MODEL

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny GPT-2, ZeRO 0 and 3, 2 steps (CI smoke run)"
    )
    parser.add_argument(
        "--cluster",
        default="local",
        help="cluster to predict against (default: this machine, `local`, at the precision it runs fastest)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steady steps after the 2 measured for memory"
    )
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write (default benchmarks/results)"
    )
    args = parser.parse_args()
    import yaml

    model = TINY_GPT2 if args.quick else FULL_MODEL
    stages = (0, 3) if args.quick else (0, 1, 2, 3)
    steps = args.steps or (2 if args.quick else 6)
    env = bench_env()
    layout = ["--micro-batch", "2", "--global-batch", "4", "--recompute", "selective"]
    rows, allreduce = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model_file = t / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        for stage in stages:
            common = [
                "--model",
                str(model_file),
                "--cluster",
                args.cluster,
                "--zero-stage",
                str(stage),
                *layout,
            ]
            cfg, out = t / f"z{stage}.json", t / f"z{stage}.out.json"
            # the monitors' logs under the temporary folder, not the working directory's logs/
            dstk(
                "config",
                *common,
                "--nodes",
                "1",
                "--gpus-per-node",
                "2",
                "--log-dir",
                str(t / "logs"),
                "-o",
                str(cfg),
                env=env,
            )
            p = json.loads(dstk("estimate", *common, "--json", env=env).stdout)
            launch = ["launch", "--cluster", args.cluster, "--nodes", "1", "--gpus-per-node", "2"]
            launch += ["--run-dir", str(t / f"z{stage}"), "--master-port", str(free_port()), "--"]
            dstk(*launch, __file__, "--worker", str(cfg), str(model_file), str(out), str(steps), env=env)
            m = json.loads(out.read_text())
            allreduce = m.pop("allreduce_bus_gb_per_s")
            mem = p["memory_per_gpu_bytes"]
            base = p["engine_model_states_bytes"]["total"] + mem["framework_overhead"]
            row = {
                "stage": stage,
                "shard_params": p["n_params"] / (2 if stage else 1),
                **m,
                "predicted_fwd_bwd_peak_bytes": base + mem["activations"] + mem["buffers"],
                "predicted_step_peak_bytes": base + p["step_transient_bytes"],
            }
            row["step_peak_ratio"] = row["step_peak_bytes"] / row["predicted_step_peak_bytes"]
            row["step_rise_per_shard_param"] = row.pop("step_rise_bytes") / row["shard_params"]
            row["predicted_transient_per_shard_param"] = p["step_transient_bytes"] / row["shard_params"]
            rows.append(row)
            print(
                f"ZeRO-{stage}: fwd+bwd peak {row['fwd_bwd_peak_bytes'] / MIB:.0f} MiB "
                f"(pred {row['predicted_fwd_bwd_peak_bytes'] / MIB:.0f}), step peak "
                f"{row['step_peak_bytes'] / MIB:.0f} MiB (pred {row['predicted_step_peak_bytes'] / MIB:.0f}, "
                f"×{row['step_peak_ratio']:.2f}), step {row['step_s']:.3f} s, minor faults "
                f"{row['step_minor_fault_bytes'] / 1e6:.0f} MB/step",
                flush=True,
            )
    paths = output_paths("step_memory_quick" if args.quick else "step_memory", args.out_dir)
    write_csv(paths["csv"], rows, COLUMNS)
    write_record(paths["json"], {"rows": rows, "model": model, "allreduce_bus_gb_per_s": allreduce})
    lines = [
        f"# Peak memory per phase and optimizer-step cost by ZeRO stage ({model['name']}, 2 ranks, micro-batch 2)",
        "",
        f"Command: `{command_line()}`",
        "",
        "| stage | shard params | fwd+bwd peak MiB | pred | step peak MiB | pred | × | step rise B/param | "
        "pred transient | step s | minor faults MB/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {r['shard_params'] / 1e6:.1f}M | {r['fwd_bwd_peak_bytes'] / MIB:.0f} | "
            f"{r['predicted_fwd_bwd_peak_bytes'] / MIB:.0f} | {r['step_peak_bytes'] / MIB:.0f} | "
            f"{r['predicted_step_peak_bytes'] / MIB:.0f} | {r['step_peak_ratio']:.2f} | "
            f"{r['step_rise_per_shard_param']:.1f} | "
            f"{r['predicted_transient_per_shard_param']:.1f} | {r['step_s']:.3f} | "
            f"{r['step_minor_fault_bytes'] / 1e6:.0f} |"
        )
    lines += [
        "",
        "Step rise: the peak inside `engine.step()` less the RSS just after it, per parameter the rank updates "
        "(gradients the step frees count in it); pred transient: the cost model's `step_transient` (above the "
        "states with their gradients) per shard parameter. Peaks are the most loaded rank's over the first 2 "
        "steps (large blocks mmapped); step time and minor page faults are rank 0's medians after "
        "`allow_heap_reuse`.",
        "",
        "126 MB gloo all-reduce, bus bandwidth: "
        + ", ".join(f"{k} {v:.2f} GB/s" for k, v in allreduce.items()),
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['json']}")
    return 0


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]  # the launcher prepends it
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2], argv[3], int(argv[4]))
        from toolkit.run.runtime import exit_without_teardown, shutdown

        shutdown()
        exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15 ("terminate called ..."), failing the job
    else:
        sys.exit(main())
