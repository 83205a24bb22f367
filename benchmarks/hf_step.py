"""An HF model at a real block shape through `dstk train` on this machine's accelerator, each step's measured
time beside `dstk estimate`'s prediction for the same layout.

The question it answers is whether the HF target's per-layer pricing (eager RMSNorm and rotary, SwiGLU, SDPA,
the fp32 loss) holds on a GPU, where `dstk plan` predicts ~60 % MFU for Llama-2-7B. The default model is
Llama-2-7B's block (h 4096, 32 heads, MLP 11008, vocabulary 32000) with `--layers` blocks (4: 1.07B
parameters, so ZeRO-1 with Adam fits one 80 GB GPU) at 2048 tokens; ZeRO-1, micro-batch 4, no recomputation,
the precision the cluster computes fastest (bf16 on a GPU), one rank per accelerator. `--cluster` defaults to `local`, which on a GPU node that has not
been calibrated uses the GPU table's published peaks: the prediction a user gets before measuring anything
(run `dstk calibrate` first, and `local` predicts from this machine's measurements instead).
`--tiny` shrinks the model to a CPU smoke run. Every step's time is printed: a time that drifts over the run
is a finding of its own. `--profile` also turns on DeepSpeed's `wall_clock_breakdown` (forward, backward and
step milliseconds, synchronized, every 5 steps) and its FLOPs profiler (per-module latency at step 10) and keeps
their lines: where the time goes, from one run. Writes JSON and Markdown to benchmarks/results/.

`--bare` also runs the same model, config and data through benchmarks/minimal_loop.py — forward, backward, step,
no dstk — and reports the ratio of the median step periods (time between step ends), what dstk's loop costs on
this accelerator. The record also gives the step time's trend: the least-squares slope over the steps after
warm-up, relative to the median (0 for a flat run), and the median of the last 10 over the first 10.

Usage: python benchmarks/hf_step.py [--layers N] [--micro-batch N] [--steps N] [--ranks N] [--cluster C]
                                    [--zero-stage S] [--precision P] [--tiny] [--profile] [--bare]
                                    [--out-dir DIR] [--tag NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (
    REPO,
    bench_env,
    command_line,
    dstk,
    free_port,
    output_paths,
    prepare_data,
    train,
    write_record,
)

LLAMA2_7B_BLOCK = {
    "architecture": "llama",
    "hidden_size": 4096,
    "n_heads": 32,
    "ffn_hidden_size": 11008,
    "vocab_size": 32000,
    "seq_length": 2048,
}
TINY = {"architecture": "llama", "hidden_size": 256, "n_heads": 4, "ffn_hidden_size": 688, "vocab_size": 4096}
TINY["seq_length"] = 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument(
        "--ranks", type=int, default=None, help="ranks on this node (default: as --cluster local)"
    )
    ap.add_argument("--cluster", default="local")
    ap.add_argument("--zero-stage", type=int, default=1)
    ap.add_argument(
        "--precision", default=None, help="default: what --cluster computes fastest (bf16 on a GPU)"
    )
    ap.add_argument("--tiny", action="store_true", help="a 2-block h=256 Llama: a CPU smoke run")
    ap.add_argument(
        "--profile", action="store_true", help="DeepSpeed's wall-clock breakdown and FLOPs profiler"
    )
    ap.add_argument("--bare", action="store_true", help="also the bare DeepSpeed loop, for dstk's overhead")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--tag", default="hf_step", help="name of the result files")
    args = ap.parse_args()
    name = "tiny-llama" if args.tiny else "llama2-7b-block"
    model = {"name": f"{name}-x{args.layers}", **(TINY if args.tiny else LLAMA2_7B_BLOCK)}
    model["n_layers"] = args.layers
    env = bench_env()
    with tempfile.TemporaryDirectory(prefix="dstk-hf-step-") as d:
        tmp = Path(d)
        model_file = tmp / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        if args.ranks is None:
            from toolkit.host.local import detect

            args.ranks = detect().cluster["gpus_per_node"]
        if args.precision is None:  # never bf16 where it is emulated (an AVX2-only CPU: ~75x slower)
            from toolkit.host.local import load_cluster
            from toolkit.plan.layout import default_precision

            args.precision = default_precision(load_cluster(args.cluster))
        layout = [
            "--zero-stage", str(args.zero_stage), "--precision", args.precision, "--recompute", "none",
            "--micro-batch", str(args.micro_batch), "--global-batch", str(args.micro_batch * args.ranks),
        ]  # fmt: skip
        job = ["--model", str(model_file), "--cluster", args.cluster, "--nodes", "1"]
        job += ["--gpus-per-node", str(args.ranks), *layout]
        predicted = json.loads(dstk("estimate", *job, "--json", env=env).stdout)
        data = prepare_data(tmp, model, 1000)
        # the comms logger synchronizes around every collective: off, so the step is timed as it runs;
        # --profile: DeepSpeed's own timers (synchronized, every 5 steps) and its FLOPs profiler
        summary = train(
            tmp / "run",
            model_file,
            args.cluster,
            data,
            args.steps,
            layout,
            env,
            config_extra=("--warmup-steps", "2", *(["--flops-profiler"] if args.profile else [])),
            ranks=args.ranks,
            comms_logger=False,
            config_update={"wall_clock_breakdown": True, "steps_per_print": 5} if args.profile else None,
        )
        log = (tmp / "run" / "launch.log").read_text().splitlines()
        bare = _bare_periods(tmp, model_file, data, args.steps, args.ranks, env) if args.bare else None
    profile = [
        line for line in log if "time (ms)" in line or "fwd latency" in line or "Flops Profiler" in line
    ]
    step_s, pred_s = summary["step_time_s"], predicted["step_time_s"]
    mfu = predicted["mfu"] * pred_s / step_s
    record = {
        "command": command_line(),
        "model": model,
        "cluster": args.cluster,
        "accelerator": summary["accelerator"],
        "ranks": args.ranks,
        "precision": args.precision,
        "predicted": {k: predicted[k] for k in ("step_time_s", "mfu", "step_time_breakdown_s")},
        "predicted_memory_bytes": predicted["memory_per_gpu_bytes"]["total"],
        "measured_step_time_s": step_s,
        "measured_step_times_s": summary["step_times_s"],
        "measured_mfu": mfu,
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "losses": summary["losses"],
        "profile": profile,
        "trend": trend(summary["step_times_s"][WARMUP:]),
        "step_periods_s": summary["step_periods_s"],
    }
    if bare is not None:
        ours = [p for p in summary["step_periods_s"][WARMUP:] if p is not None]
        record["bare_step_periods_s"] = bare
        theirs = [p for p in bare[WARMUP:] if p is not None]
        record["dstk_over_bare"] = statistics.median(ours) / statistics.median(theirs)
    paths = output_paths(args.tag, args.out_dir)
    write_record(paths["json"], record)
    peak = max(summary["peak_memory_bytes"])
    lines = [
        f"# {model['name']} (seq {model['seq_length']}) through dstk train on {args.ranks} × "
        f"{summary['accelerator']}, against `--cluster {args.cluster}`",
        "",
        f"Command: `{record['command']}`",
        "",
        "| | measured | predicted | measured / predicted |",
        "|---|---|---|---|",
        f"| step time (s, median after warm-up) | {step_s:.4f} | {pred_s:.4f} | {step_s / pred_s:.2f} |",
        f"| MFU | {mfu:.3f} | {predicted['mfu']:.3f} | {mfu / predicted['mfu']:.2f} |",
        f"| peak memory per rank (GB) | {peak / 1e9:.2f} | {record['predicted_memory_bytes'] / 1e9:.2f} | "
        f"{peak / record['predicted_memory_bytes']:.2f} |",
        f"Trend after warm-up: slope {record['trend']['slope_per_step']:+.4f} of the median per step, last 10 "
        f"over first 10 ×{record['trend']['last_over_first']:.3f}"
        + (
            f"; dstk train / bare DeepSpeed loop (median step period) ×{record['dstk_over_bare']:.3f}"
            if bare
            else ""
        ),
        "",
        "Every step (s): " + ", ".join(f"{t:.3f}" for t in summary["step_times_s"]),
        "",
        "Predicted breakdown (s): "
        + ", ".join(f"{k} {v:.4f}" for k, v in predicted["step_time_breakdown_s"].items() if v),
        *(["", "DeepSpeed's timers (`--profile`):", "", "```", *profile[-12:], "```"] if profile else []),
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


WARMUP = 2
"""Steps left out of the trend and the overhead ratio (JIT, allocator, lazily created optimizer state)."""


def trend(times: list[float]) -> dict[str, float]:
    """Least-squares slope of the step times relative to their median (per step), and the median of the last
    10 over the first 10: a run whose steps grow shows both above 0 and 1."""
    n = len(times)
    if n < 3:
        return {"slope_per_step": 0.0, "last_over_first": 1.0}
    mean_x, mean_y = (n - 1) / 2, sum(times) / n
    slope = sum((i - mean_x) * (t - mean_y) for i, t in enumerate(times)) / sum(
        (i - mean_x) ** 2 for i in range(n)
    )
    k = min(10, n // 2)
    return {
        "slope_per_step": slope / statistics.median(times),
        "last_over_first": statistics.median(times[-k:]) / statistics.median(times[:k]),
    }


def _bare_periods(
    tmp: Path, model_file: Path, data: Path, steps: int, ranks: int, env: dict
) -> list[float | None]:
    """The same config, model and data through benchmarks/minimal_loop.py (no dstk in the loop)."""
    out = tmp / "bare.json"
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks)]
    cmd += [
        "--master_port",
        str(free_port()),
        "--no_local_rank",
        str(REPO / "benchmarks" / "minimal_loop.py"),
    ]
    cmd += [str(model_file), str(tmp / "run" / "ds_config.json"), str(data), str(steps), str(out), str(steps)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"the bare loop failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())["step_periods_s"]


if __name__ == "__main__":
    main()
