"""Pipeline bubble on 2 stages, measured beside the 1F1B formula (p−1)/(m+p−1) and beside `dstk estimate`.

A GPT-2 (8 blocks, hidden 512, 8 heads, seq 256, vocabulary 4096, 27M parameters: big enough that compute,
not gloo latency, fills a micro-batch slot) runs as a DeepSpeed `PipelineModule` over pp = 2 ranks (gloo on
CPU, ZeRO-0, bf16) through `dstk config --pp 2` → `dstk launch` → `dstk train`, once per m = 1, 2, 4, 8
micro-batches per step at a fixed micro-batch size. The 1F1B schedule runs m + p − 1 slots of one
micro-batch's forward + backward, so the step time is linear in m: t(m) = (m + p − 1)·slot + fixed, where
fixed is what every step pays once (optimizer step, engine bookkeeping). The slot is the slope of t over m
(least squares over the m values), and the measured bubble at each m is (t(m) − m·slope) / t(m): every
second of the step that is not the m slots of useful work. Beside it:
- `1F1B`: (p−1)/(m+p−1), the schedule alone (fixed = 0);
- `dstk`: `pipeline_bubble / step_time` from the run's own prediction (summary.json["predicted"], the
  same JSON as `dstk estimate --json`), the bubble the cost model charges;
- `dstk (as measured)`: the prediction put through the measured definition, (t_pred − m·slot_pred) /
  t_pred, which also counts the predicted optimizer and data-parallel time: compare this one with the
  measurement like for like.
Per m also the step time and tokens/s measured vs predicted, and each stage's peak memory (RSS on CPU,
max allocated on CUDA) vs the prediction for that stage: stage 0 holds min(p, m) micro-batches in flight, the
last stage one plus the logits. Writes CSV, JSON, Markdown and a PNG to benchmarks/results/.

Usage: python benchmarks/pipeline.py [--quick] [--cluster C] [--m 1,2,4,8] [--micro-batch 2] [--steps 8]
                                     [--out-dir DIR]
       (--quick: a 4-block hidden-128 GPT-2, m = 1, 4, 4 steps each: a CI smoke run in about a minute;
        --cluster: a cluster file or preset to predict against, default: `dstk calibrate` this machine first)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import (
    TINY_GPT2,
    bench_env,
    cluster_for,
    command_line,
    output_paths,
    prepare_data,
    train,
    write_csv,
    write_record,
)

REPO = Path(__file__).resolve().parents[1]
STAGES = 2
FULL_MODEL = {
    "name": "gpt2-27m-pp",
    "architecture": "gpt2",
    "n_layers": 8,
    "hidden_size": 512,
    "n_heads": 8,
    "vocab_size": 4096,
    "seq_length": 256,
    "max_position_embeddings": 256,
    "dropout": False,
}
QUICK_MODEL = {**TINY_GPT2, "name": "gpt2-tiny-pp", "n_layers": 4}
COLUMNS = [
    "m",
    "micro_batch",
    "global_batch",
    "step_time_s",
    "predicted_step_time_s",
    "step_time_ratio",
    "measured_bubble",
    "formula_bubble",
    "predicted_bubble",
    "predicted_bubble_as_measured",
    "tokens_per_s",
    "predicted_tokens_per_s",
    "peak_memory_stage0_bytes",
    "predicted_memory_stage0_bytes",
    "peak_memory_stage1_bytes",
    "predicted_memory_stage1_bytes",
    "comm_bytes_per_step",
    "final_loss",
]


# ---- the pipeline benchmark ---------------------------------------------------------------------------------


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def predicted_stage_memory(model_file: Path, cluster_file: Path, layout: dict[str, Any]) -> list[float]:
    """Predicted peak bytes on each stage's rank (`dstk estimate` reports only the most loaded stage), so the
    earlier stage's extra in-flight micro-batch shows."""
    from toolkit.host.local import load_cluster
    from toolkit.plan.cost.estimate import stage_memories
    from toolkit.plan.layout import Layout
    from toolkit.plan.load import load_model

    model, cluster = load_model(str(model_file)), load_cluster(str(cluster_file))
    return [m.total for m in stage_memories(model, cluster, Layout.model_validate(layout))]


def measure(args: argparse.Namespace, model: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """Run every m; return the rows (bubble columns filled in later by `add_bubbles`) and the cluster."""
    import yaml

    env = bench_env()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model_file = t / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        cluster = cluster_for(t, args.cluster, env)
        data = prepare_data(t, model, 600 if args.quick else 1500)
        for m in args.m:
            run = t / f"m{m}"
            layout = ["--pp", str(STAGES), "--zero-stage", "0", "--micro-batch", str(args.micro_batch)]
            layout += ["--global-batch", str(m * args.micro_batch), "--warmup-steps", "1"]
            s = train(run, model_file, cluster, data, args.steps, layout, env)
            p = s["predicted"]
            assert s["layout"]["gradient_accumulation_steps"] == m, s["layout"]
            stage_pred = predicted_stage_memory(model_file, run / "launch" / "cluster.yaml", s["layout"])
            if abs(max(stage_pred) / p["memory_per_gpu_bytes"]["total"] - 1) > 1e-6:
                print("warning: per-stage memory walk disagrees with dstk estimate's most loaded stage")
            bd = p["step_time_breakdown_s"]
            rows.append(
                {
                    "m": m,
                    "micro_batch": args.micro_batch,
                    "global_batch": m * args.micro_batch,
                    "step_time_s": s["step_time_s"],
                    "predicted_step_time_s": p["step_time_s"],
                    "step_time_ratio": s["step_time_s"] / p["step_time_s"],
                    "formula_bubble": (STAGES - 1) / (m + STAGES - 1),
                    "predicted_bubble": bd["pipeline_bubble"] / p["step_time_s"],
                    # the prediction through the measured definition: one slot is compute + sends of one
                    # micro-batch, everything but the m slots counts
                    "predicted_slot_s": (bd["compute"] + bd["model_parallel_comm"]) / m,
                    "tokens_per_s": s["tokens_per_s"],
                    "predicted_tokens_per_s": p["tokens_per_s"],
                    # pipe × data topology with dp = 1: rank r is stage r
                    "peak_memory_stage0_bytes": s["peak_memory_bytes"][0],
                    "predicted_memory_stage0_bytes": stage_pred[0],
                    "peak_memory_stage1_bytes": s["peak_memory_bytes"][1],
                    "predicted_memory_stage1_bytes": stage_pred[1],
                    "comm_bytes_per_step": s["comm_bytes_per_step"],
                    "final_loss": s["losses"][-1],
                    "step_times_s": s["step_times_s"],
                    "predicted_breakdown_s": bd,
                }
            )
            r = rows[-1]
            print(
                f"m={m}: step {r['step_time_s']:.3f} s (pred {r['predicted_step_time_s']:.3f}, "
                f"×{r['step_time_ratio']:.2f}); peak stage 0 / 1: {r['peak_memory_stage0_bytes'] / 2**30:.2f} / "
                f"{r['peak_memory_stage1_bytes'] / 2**30:.2f} GiB (pred {stage_pred[0] / 2**30:.2f} / "
                f"{stage_pred[1] / 2**30:.2f})",
                flush=True,
            )
        cluster_text = (run / "launch" / "cluster.yaml").read_text()
    return rows, cluster, cluster_text


def add_bubbles(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Fill in the measured bubble from the least-squares slot; return the fit."""
    ms = [float(r["m"]) for r in rows]
    slope, intercept = fit_line(ms, [r["step_time_s"] for r in rows])
    p_slope, p_intercept = fit_line(ms, [r["predicted_step_time_s"] for r in rows])
    for r in rows:
        r["measured_bubble"] = (r["step_time_s"] - r["m"] * slope) / r["step_time_s"]
        r["predicted_bubble_as_measured"] = (r["predicted_step_time_s"] - r["m"] * r["predicted_slot_s"]) / r[
            "predicted_step_time_s"
        ]
    bd = rows[0]["predicted_breakdown_s"]
    return {
        "slot_s": slope,
        "intercept_s": intercept,
        # 1F1B: intercept = (p − 1)·slot + fixed
        "fixed_s": intercept - (STAGES - 1) * slope,
        "predicted_slot_s": p_slope,
        "predicted_intercept_s": p_intercept,
        "predicted_bubble_s": bd["pipeline_bubble"],
        "predicted_fixed_s": bd["optimizer"] + bd["data_parallel_comm"] + bd["offload"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", help="cluster file or preset to predict against (default: calibrate)")
    parser.add_argument("--m", help="comma-separated micro-batches per step (default 1,2,4,8; --quick 1,4)")
    parser.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 8; --quick 4)")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write (default benchmarks/results)"
    )
    args = parser.parse_args()
    args.m = [int(x) for x in args.m.split(",")] if args.m else [1, 4] if args.quick else [1, 2, 4, 8]
    if len(args.m) < 2:
        parser.error("--m: the slot is a slope; give at least two micro-batch counts")
    args.steps = args.steps or (4 if args.quick else 8)
    model = QUICK_MODEL if args.quick else FULL_MODEL
    rows, cluster, cluster_text = measure(args, model)
    fit = add_bubbles(rows)
    for r in rows:
        print(
            f"m={r['m']}: bubble measured {r['measured_bubble']:.3f}  1F1B {r['formula_bubble']:.3f}  dstk "
            f"{r['predicted_bubble']:.3f} (as measured {r['predicted_bubble_as_measured']:.3f})"
        )
    print(
        f"slot {fit['slot_s']:.4f} s (pred {fit['predicted_slot_s']:.4f}); fixed per step {fit['fixed_s']:.4f} s "
        f"(pred {fit['predicted_fixed_s']:.4f})"
    )
    write_outputs(rows, fit, model, cluster, cluster_text, args)
    return 0


def write_outputs(
    rows: list[dict[str, Any]],
    fit: dict[str, float],
    model: dict[str, Any],
    cluster: str,
    cluster_text: str,
    args: argparse.Namespace,
) -> None:
    tag = "pipeline_quick" if args.quick else "pipeline"
    out_dir = args.out_dir
    paths = output_paths(tag, out_dir)
    write_csv(paths["csv"], rows, COLUMNS, extrasaction="ignore")
    record = {
        "rows": rows,
        "fit": fit,
        "stages": STAGES,
        "steps": args.steps,
        "model": model,
        "cluster": cluster,
        "cluster_resolved": cluster_text,
    }
    write_record(paths["json"], record)
    gib = 2**30
    lines = [
        f"# Pipeline bubble on {STAGES} stages, measured vs predicted ({model['name']})",
        "",
        f"Command: `{command_line()}` — GPT-2 with "
        f"{model['n_layers']} blocks, hidden {model['hidden_size']}, {model['n_heads']} heads, seq "
        f"{model['seq_length']}, vocabulary {model['vocab_size']}; pp = {STAGES} on 2 ranks, ZeRO-0, bf16, "
        f"micro-batch {args.micro_batch}, {args.steps} steps per run (median of steps 2..{args.steps}); "
        f"cluster `{Path(cluster).name}`.",
        "",
        "| m | step s | pred | × | bubble measured | 1F1B | dstk | dstk (as measured) | tokens/s | pred "
        "| stage 0 peak GiB | pred | stage 1 peak GiB | pred |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['m']} | {r['step_time_s']:.3f} | {r['predicted_step_time_s']:.3f} | {r['step_time_ratio']:.2f} "
            f"| {r['measured_bubble']:.3f} | {r['formula_bubble']:.3f} | {r['predicted_bubble']:.3f} "
            f"| {r['predicted_bubble_as_measured']:.3f} | {r['tokens_per_s']:,.0f} | {r['predicted_tokens_per_s']:,.0f} "
            f"| {r['peak_memory_stage0_bytes'] / gib:.3f} | {r['predicted_memory_stage0_bytes'] / gib:.3f} "
            f"| {r['peak_memory_stage1_bytes'] / gib:.3f} | {r['predicted_memory_stage1_bytes'] / gib:.3f} |"
        )
    lines += [
        "",
        f"- One micro-batch slot (slope of step time over m): {fit['slot_s'] * 1e3:.1f} ms measured, "
        f"{fit['predicted_slot_s'] * 1e3:.1f} ms predicted.",
        f"- Intercept {fit['intercept_s'] * 1e3:.1f} ms = (p−1)·slot {(STAGES - 1) * fit['slot_s'] * 1e3:.1f} ms "
        f"+ {fit['fixed_s'] * 1e3:.1f} ms paid once per step (optimizer, engine); predicted: bubble "
        f"{fit['predicted_bubble_s'] * 1e3:.1f} ms + {fit['predicted_fixed_s'] * 1e3:.1f} ms.",
        "- `measured` = (t(m) − m·slot)/t(m) counts the fixed cost too, so it sits above the 1F1B formula; "
        "`dstk (as measured)` is the prediction through the same definition.",
        f"- Chart: `{paths['png'].name}`",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(rows, fit, paths["png"])
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")


def plot(rows: list[dict[str, Any]], fit: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [r["m"] for r in rows]
    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax_b.plot(ms, [r["measured_bubble"] for r in rows], "o-", label="measured (t − m·slot)/t")
    ax_b.plot(ms, [r["formula_bubble"] for r in rows], "k--", label="1F1B (p−1)/(m+p−1)")
    ax_b.plot(ms, [r["predicted_bubble"] for r in rows], "s-", label="dstk: bubble / step time")
    ax_b.plot(
        ms,
        [r["predicted_bubble_as_measured"] for r in rows],
        "s:",
        label="dstk through the measured definition",
    )
    ax_b.set_xscale("log", base=2)
    low = min(0.0, *(r["measured_bubble"] for r in rows))  # noise can push the measured one below 0
    ax_b.set(xlabel="micro-batches per step m", ylabel="fraction of step", ylim=(low - 0.02, 1))
    ax_b.axhline(0, color="grey", linewidth=0.5)
    ax_b.set_xticks(ms, [str(m) for m in ms])
    ax_b.minorticks_off()
    ax_b.set_title(f"pipeline bubble, p = {STAGES}")
    ax_b.legend(fontsize=8)
    ax_t.plot(ms, [r["step_time_s"] for r in rows], "o", label="measured")
    ax_t.plot(ms, [fit["intercept_s"] + fit["slot_s"] * m for m in ms], "-", label="least-squares fit")
    ax_t.plot(ms, [r["predicted_step_time_s"] for r in rows], "s--", label="dstk prediction")
    ax_t.set(xlabel="micro-batches per step m", ylabel="step time (s)", ylim=(0, None))
    ax_t.set_title("step time")
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
