"""ZeRO stages side by side, each measured beside what `dstk estimate` predicted for it.

One run per (stage, micro-batch): ZeRO 0, 1, 2, 3 and 3 + CPU offload, through `dstk launch` → `dstk train` on
2 ranks (gloo on CPU; on a GPU machine DeepSpeed picks the GPUs and NCCL — pass a larger `--model` there). Per row: step time, tokens/s, model-state
bytes per rank held by the engine, peak memory per rank (RSS, or max allocated on CUDA), communication
volume (DeepSpeed's comms logger), DeepSpeed's own model-state estimator, and dstk's prediction with the
ratio. Then the layout `dstk plan` picks for the same model and cluster — with no trial run — is compared
with the best measured row. Writes CSV, JSON, Markdown and PNG charts to benchmarks/results/.

Usage: python benchmarks/zero_stages.py [--quick] [--cluster FILE] [--model M] [--micro-batches 2,4,8]
                                        [--steps N] [--out-dir DIR]
       (--quick: a tiny model, two stages, one micro-batch: a CI smoke run in well under 3 minutes)

HF Accelerate's DeepSpeed plugin is not in the comparison on CPU: Accelerate cannot drive DeepSpeed on the
CPU accelerator (it runs N independent jobs or drops DeepSpeed; ../shared/RECIPES.md).
"""

from __future__ import annotations

import argparse
import json
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
    dstk,
    output_paths,
    prepare_data,
    train,
    write_csv,
    write_record,
)
from toolkit.plan.params import count_params

REPO = Path(__file__).resolve().parents[1]
FULL_MODEL = {
    "name": "gpt2-63m",
    "architecture": "gpt2",
    "n_layers": 8,
    "hidden_size": 768,
    "n_heads": 12,
    "vocab_size": 8192,
    "seq_length": 256,
    "max_position_embeddings": 256,
    "dropout": False,
}
QUICK_MODEL = TINY_GPT2
COLUMNS = [
    "stage",
    "offload",
    "micro_batch",
    "global_batch",
    "step_time_s",
    "predicted_step_time_s",
    "step_time_ratio",
    "tokens_per_s",
    "predicted_tokens_per_s",
    "model_states_bytes",
    "predicted_model_states_bytes",
    "model_states_ratio",
    "peak_memory_bytes",
    "predicted_total_bytes",
    "memory_ratio",
    "comm_bytes_per_step",
    "deepspeed_estimator_bytes",
    "final_loss",
]


def accelerator_of(cluster: str) -> str:
    """The accelerator of the cluster the predictions are made for (`cpu`, `cuda`, ...)."""
    from toolkit.host.local import load_cluster

    return load_cluster(cluster).accelerator


def deepspeed_estimate(n_params: int, stage: int, offload: bool, ranks: int) -> float | None:
    """DeepSpeed's own model-state estimator (GPU bytes per rank), for the comparison table."""
    try:
        if stage == 3:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

            _, gpu, _ = estimate_zero3_model_states_mem_needs(
                n_params, 0, ranks, 1, cpu_offload=offload, cpu_offload_params=offload, zero_init=True
            )
            return float(gpu)
        if stage in (1, 2):
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

            _, gpu = estimate_zero2_model_states_mem_needs(n_params, ranks, 1, cpu_offload=offload)
            return float(gpu)
    except Exception:  # an informational column: a DeepSpeed API change must not stop the run
        return None
    return None


def comm_bytes(summary: dict[str, Any]) -> float:
    return float(summary.get("comm_bytes_per_step", 0.0))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", help="cluster file to predict against (default: calibrate this machine)")
    parser.add_argument("--model", help="dstk model file or preset (default: a 63M GPT-2; --quick: 1M)")
    parser.add_argument(
        "--micro-batches", help="comma-separated micro-batch sizes (default 2,4,8; --quick 4)"
    )
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write (default benchmarks/results)"
    )
    args = parser.parse_args()
    import yaml

    model = QUICK_MODEL if args.quick else FULL_MODEL
    if args.model:
        from toolkit.plan.load import load_model

        model = load_model(args.model).model_dump(mode="json")
    stages = (
        [(0, "none"), (3, "none")]
        if args.quick
        else [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (3, "cpu")]
    )
    micros = (
        [int(m) for m in args.micro_batches.split(",")]
        if args.micro_batches
        else [4]
        if args.quick
        else [2, 4, 8]
    )
    # the median of the 6 steps after the trainer's 2 warm-up steps: of 4, one disturbed step moved a row 30 %
    steps = args.steps or (3 if args.quick else 8)
    global_batch = 2 * max(micros)
    env = bench_env()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        model_file = t / "model.yaml"
        model_file.write_text(yaml.safe_dump(model))
        cluster = cluster_for(t, args.cluster, env)
        data = prepare_data(t, model, 600 if args.quick else 3000)
        from toolkit.host.local import load_cluster
        from toolkit.plan.load import load_model

        n_params = count_params(load_model(str(model_file))).total
        for stage, offload in stages:
            for micro in micros:
                name = f"z{stage}{'-off' if offload != 'none' else ''}-m{micro}"
                layout = ["--zero-stage", str(stage), "--offload-optimizer", offload]
                layout += ["--offload-param", offload if stage == 3 else "none", "--micro-batch", str(micro)]
                layout += [
                    "--global-batch",
                    str(global_batch),
                    "--recompute",
                    "selective",
                    "--warmup-steps",
                    "1",
                    # a short run at GPT-3's peak rate with one warm-up step diverges by chance (final losses
                    # 6.7–10.3 across stages); at 1e-4 every stage trains the same model alike
                    "--lr",
                    "1e-4",
                ]
                s = train(t / name, model_file, cluster, data, steps, layout, env)
                p = s["predicted"]
                # on the CPU accelerator "device" and "host" are the same RAM: offloaded states count in RSS
                host = p["cpu_memory_per_node_bytes"] / 2 if accelerator_of(cluster) == "cpu" else 0.0
                measured_states = max(
                    s["model_state_bytes"].get("after_backward") or s["model_state_bytes"]["after_step"]
                )
                row = {
                    "stage": stage,
                    "offload": offload,
                    "micro_batch": micro,
                    "global_batch": global_batch,
                    "step_time_s": s["step_time_s"],
                    "predicted_step_time_s": p["step_time_s"],
                    "tokens_per_s": s["tokens_per_s"],
                    "predicted_tokens_per_s": p["tokens_per_s"],
                    "model_states_bytes": measured_states,
                    "predicted_model_states_bytes": p["engine_model_states_bytes"]["total"] + host,
                    "peak_memory_bytes": max(s["peak_memory_bytes"]),
                    "predicted_total_bytes": p["memory_per_gpu_bytes"]["total"] + host,
                    "comm_bytes_per_step": comm_bytes(s),
                    "deepspeed_estimator_bytes": deepspeed_estimate(n_params, stage, offload != "none", 2),
                    "final_loss": s["losses"][-1],
                }
                row["step_time_ratio"] = row["step_time_s"] / row["predicted_step_time_s"]
                row["model_states_ratio"] = row["model_states_bytes"] / row["predicted_model_states_bytes"]
                row["memory_ratio"] = row["peak_memory_bytes"] / row["predicted_total_bytes"]
                rows.append(row)
                print(
                    f"{name:>10}: step {row['step_time_s']:.3f} s (pred {row['predicted_step_time_s']:.3f}, "
                    f"×{row['step_time_ratio']:.2f}); peak {row['peak_memory_bytes'] / 2**30:.2f} GiB "
                    f"(pred {row['predicted_total_bytes'] / 2**30:.2f}, ×{row['memory_ratio']:.2f}); states "
                    f"×{row['model_states_ratio']:.3f}",
                    flush=True,
                )
        plan = json.loads(
            dstk(
                "plan",
                "--model",
                str(model_file),
                "--cluster",
                cluster,
                "--global-batch",
                str(global_batch),
                "--tp",
                "1",
                "--pp",
                "1",
                "--recompute",
                "selective",
                "--json",
            ).stdout
        )
        cluster_text = yaml.safe_dump(load_cluster(cluster).model_dump(mode="json"), sort_keys=False)
    chosen = plan["layout"]
    picked = [
        r
        for r in rows
        if r["stage"] == chosen["zero_stage"]
        and r["micro_batch"] == chosen["micro_batch_size"]
        and r["offload"] == chosen["offload_optimizer"]
    ]
    best = max(rows, key=lambda r: r["tokens_per_s"])
    pick = {
        "layout": f"ZeRO-{chosen['zero_stage']} micro {chosen['micro_batch_size']} offload "
        f"{chosen['offload_optimizer']}",
        "measured_tokens_per_s": picked[0]["tokens_per_s"] if picked else None,
        "best_layout": f"ZeRO-{best['stage']} micro {best['micro_batch']} offload {best['offload']}",
        "best_tokens_per_s": best["tokens_per_s"],
    }
    pick["fraction_of_best"] = pick["measured_tokens_per_s"] / best["tokens_per_s"] if picked else None
    z0 = [r for r in rows if r["stage"] == 0 and r["offload"] == "none"]
    z3 = [r for r in rows if r["stage"] == 3 and r["offload"] == "none"]
    states_ratio = z3[0]["model_states_bytes"] / z0[0]["model_states_bytes"] if z0 and z3 else None
    write_outputs(rows, pick, states_ratio, model, cluster_text, args)
    return 0


def write_outputs(
    rows: list[dict[str, Any]],
    pick: dict[str, Any],
    states_ratio: float | None,
    model: dict[str, Any],
    cluster_text: str,
    args: argparse.Namespace,
) -> None:
    tag = "zero_stages_quick" if args.quick else "zero_stages"
    out_dir = args.out_dir
    paths = output_paths(tag, out_dir)
    write_csv(paths["csv"], rows, COLUMNS)
    worst_time = max(rows, key=lambda r: max(r["step_time_ratio"], 1 / r["step_time_ratio"]))
    worst_mem = max(rows, key=lambda r: abs(r["memory_ratio"] - 1))
    record = {
        "rows": rows,
        "plan_pick": pick,
        "zero3_over_zero0_model_states": states_ratio,
        "model": model,
        "cluster": cluster_text,
        "worst_step_time_ratio": worst_time["step_time_ratio"],
        "worst_memory_ratio": worst_mem["memory_ratio"],
    }
    write_record(paths["json"], record)
    lines = [
        f"# ZeRO stages, measured vs predicted ({model['name']}, 2 ranks)",
        "",
        f"Command: `{command_line()}`",
        "",
        "| stage | offload | micro | step s | pred | ×  | tokens/s | states MB | pred | × | peak GiB | pred | × |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['stage']} | {r['offload']} | {r['micro_batch']} | {r['step_time_s']:.3f} | {r['predicted_step_time_s']:.3f} "
            f"| {r['step_time_ratio']:.2f} | {r['tokens_per_s']:,.0f} | {r['model_states_bytes'] / 1e6:.1f} | "
            f"{r['predicted_model_states_bytes'] / 1e6:.1f} | {r['model_states_ratio']:.3f} | {r['peak_memory_bytes'] / 2**30:.2f} "
            f"| {r['predicted_total_bytes'] / 2**30:.2f} | {r['memory_ratio']:.2f} |"
        )
    lines += [
        "",
        f"- ZeRO-3 / ZeRO-0 model states per rank: {states_ratio:.4f} (1/N = 0.5)" if states_ratio else "",
        f"- Worst step-time ratio (measured/predicted): {worst_time['step_time_ratio']:.2f}; worst memory ratio: "
        f"{worst_mem['memory_ratio']:.2f}",
        f"- dstk plan picked {pick['layout']} (no trial runs): {pick['fraction_of_best']:.1%} of the best measured "
        f"({pick['best_layout']})"
        if pick["fraction_of_best"]
        else f"- dstk plan picked {pick['layout']}, not in the grid",
        f"- Charts: `{paths['png'].name}`",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(rows, paths["png"])
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        "\n".join([f"Z{r['stage']}"] + (["off"] if r["offload"] != "none" else []) + [f"m{r['micro_batch']}"])
        for r in rows
    ]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    axes[0].bar(
        [i - 0.2 for i in x], [r["peak_memory_bytes"] / 2**30 for r in rows], 0.4, label="measured peak"
    )
    axes[0].bar(
        [i + 0.2 for i in x], [r["predicted_total_bytes"] / 2**30 for r in rows], 0.4, label="predicted"
    )
    axes[0].set_title("memory per rank (GiB)")
    axes[1].bar([i - 0.2 for i in x], [r["tokens_per_s"] for r in rows], 0.4, label="measured")
    axes[1].bar([i + 0.2 for i in x], [r["predicted_tokens_per_s"] for r in rows], 0.4, label="predicted")
    axes[1].set_title("tokens/s")
    for ax in axes[:2]:
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.legend()
    axes[2].scatter([r["predicted_step_time_s"] for r in rows], [r["step_time_s"] for r in rows])
    lim = max(max(r["step_time_s"], r["predicted_step_time_s"]) for r in rows) * 1.1
    axes[2].plot([0, lim], [0, lim], "k--", linewidth=0.8)
    axes[2].set_xlabel("predicted step time (s)")
    axes[2].set_ylabel("measured step time (s)")
    axes[2].set_title("step time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
