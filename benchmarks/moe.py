"""Dense vs Mixture-of-Experts at equal active parameters, each measured beside what `dstk estimate` predicts.

Three runs of the same GPT-2 (6 blocks, hidden 384, 6 heads, seq 128, vocabulary 4096; 12.3M parameters)
on 2 ranks (gloo on CPU, ZeRO-1, bf16), on the same data, seed, batch and learning-rate schedule:
- `dense`: the plain model;
- `moe-ep2`: every block's MLP replaced by DeepSpeed-MoE with 4 experts, top-1 routing, capacity factor 1
  (`num_experts: 4, moe_top_k: 1`), experts sharded by expert parallelism ep = 2 (`dstk config --ep 2`);
  each token passes through one expert the size of the dense MLP, so the active parameters (and FLOPs per
  token) equal the dense model's plus the router, while the total grows 2.7-fold (33.5M);
- `moe-ep1`: the same MoE with every expert on every rank (ep = 1, experts data-parallel), for comparison.
Per run: tokens/s and step time, peak memory per rank (RSS on CPU, max allocated on CUDA), parameters per
rank (dense and expert, counted on the engine's module) and in total and active, each beside the cost
model's prediction (summary.json["predicted"], the same JSON as `dstk estimate --json`); the bytes passed to
collectives per step (DeepSpeed's comms logger: gradient reduce-scatter, parameter all-gather, and for MoE
the expert all-to-alls) beside the predicted communication time; and the language-model loss after N steps
(training loss of the last step, and the held-out loss at the end). Writes CSV, JSON, Markdown and a PNG to
benchmarks/results/.

Usage: python benchmarks/moe.py [--quick] [--cluster C] [--steps N] [--micro-batch 4] [--global-batch 16]
                                [--lr 1e-3] [--out-dir DIR]
       (--quick: a 2-block hidden-128 GPT-2, dense and ep = 2 only, 6 steps: a CI smoke run in about a
        minute; --cluster: a cluster file or preset to predict against, default: `dstk calibrate` first)
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

FULL_MODEL = {
    "name": "gpt2-12m",
    "architecture": "gpt2",
    "n_layers": 6,
    "hidden_size": 384,
    "n_heads": 6,
    "vocab_size": 4096,
    "seq_length": 128,
    "max_position_embeddings": 128,
    "dropout": False,
}
QUICK_MODEL = TINY_GPT2
EXPERTS = {"num_experts": 4, "moe_top_k": 1, "moe_capacity_factor": 1.0}
COLUMNS = [
    "run",
    "num_experts",
    "ep",
    "n_params",
    "predicted_n_params",
    "n_active_params",
    "predicted_n_active_params",
    "params_rank_dense",
    "predicted_params_rank_dense",
    "params_rank_expert",
    "predicted_params_rank_expert",
    "step_time_s",
    "predicted_step_time_s",
    "step_time_ratio",
    "tokens_per_s",
    "predicted_tokens_per_s",
    "tokens_per_s_ratio",
    "peak_memory_bytes",
    "predicted_memory_bytes",
    "memory_ratio",
    "comm_bytes_per_step",
    "predicted_dp_comm_s",
    "predicted_expert_comm_s",
    "final_loss",
    "eval_loss",
    "final_aux_loss",
]


def row_for(name: str, spec: dict[str, Any], ep: int, s: dict[str, Any]) -> dict[str, Any]:
    """One run's measurements beside its prediction.

    Parameters are counted on the engine's module on each rank (experts are the parameters DeepSpeed marks
    as expert parameters); the whole model holds the rank's dense ones once and its experts ep times (each
    rank of an expert-parallel group holds a different num_experts/ep), and a token is active in the dense
    ones plus top-k of the num_experts experts of each MoE block.
    """
    p = s["predicted"]
    held = s["params_on_rank"][0]
    experts = spec.get("num_experts", 0)
    active_experts = held["expert"] * ep * spec.get("moe_top_k", 1) / experts if experts else 0
    bd = p["step_time_breakdown_s"]
    row = {
        "run": name,
        "num_experts": experts,
        "ep": ep,
        "n_params": held["dense"] + ep * held["expert"],
        "predicted_n_params": p["n_params"],
        "n_active_params": held["dense"] + active_experts,
        "predicted_n_active_params": p["n_active_params"],
        "params_rank_dense": held["dense"],
        "predicted_params_rank_dense": p["params_per_rank"]["dense"],
        "params_rank_expert": held["expert"],
        "predicted_params_rank_expert": p["params_per_rank"]["expert"],
        "step_time_s": s["step_time_s"],
        "predicted_step_time_s": p["step_time_s"],
        "tokens_per_s": s["tokens_per_s"],
        "predicted_tokens_per_s": p["tokens_per_s"],
        "peak_memory_bytes": max(s["peak_memory_bytes"]),
        "predicted_memory_bytes": p["memory_per_gpu_bytes"]["total"],
        "comm_bytes_per_step": s["comm_bytes_per_step"],
        "predicted_dp_comm_s": bd["data_parallel_comm"],
        "predicted_expert_comm_s": bd["model_parallel_comm"],
        "final_loss": s["losses"][-1],
        "eval_loss": s["evals"][-1]["loss"] if s["evals"] else None,
        "final_aux_loss": s["aux_losses"][-1] if s["aux_losses"] else 0.0,
        "losses": s["losses"],
    }
    row["step_time_ratio"] = row["step_time_s"] / row["predicted_step_time_s"]
    row["tokens_per_s_ratio"] = row["tokens_per_s"] / row["predicted_tokens_per_s"]
    row["memory_ratio"] = row["peak_memory_bytes"] / row["predicted_memory_bytes"]
    return row


def measure(args: argparse.Namespace, model: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    import yaml

    env = bench_env()
    runs = [("dense", model, 1), ("moe-ep2", {**model, **EXPERTS}, 2)]
    if not args.quick:
        runs.append(("moe-ep1", {**model, **EXPERTS}, 1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        cluster = cluster_for(t, args.cluster, env)
        data = prepare_data(t, model, 600 if args.quick else 3000)
        for name, spec, ep in runs:
            spec = {**spec, "name": f"{model['name']}-{name}"}
            model_file = t / f"{name}.yaml"
            model_file.write_text(yaml.safe_dump(spec))
            layout = ["--zero-stage", "1", "--ep", str(ep), "--micro-batch", str(args.micro_batch)]
            layout += ["--global-batch", str(args.global_batch), "--lr", str(args.lr)]
            layout += ["--warmup-steps", str(max(1, args.steps // 10))]
            s = train(
                t / name,
                model_file,
                cluster,
                data,
                args.steps,
                layout,
                env,
                train_extra=("--eval-every", str(args.steps)),
            )
            rows.append(row_for(name, spec, ep, s))
            r = rows[-1]
            print(
                f"{name:>8}: {r['tokens_per_s']:,.0f} tokens/s (pred {r['predicted_tokens_per_s']:,.0f}, "
                f"×{r['tokens_per_s_ratio']:.2f}); peak {r['peak_memory_bytes'] / 2**30:.2f} GiB (pred "
                f"{r['predicted_memory_bytes'] / 2**30:.2f}); params total {r['n_params'] / 1e6:.2f}M active "
                f"{r['n_active_params'] / 1e6:.2f}M; comm {r['comm_bytes_per_step'] / 1e6:.1f} MB/step; loss "
                f"{r['losses'][0]:.3f} -> {r['final_loss']:.3f}",
                flush=True,
            )
        cluster_text = (t / "dense" / "launch" / "cluster.yaml").read_text()
    return rows, cluster, cluster_text


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", help="cluster file or preset to predict against (default: calibrate)")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per run (default 40; --quick 6)"
    )
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch (default 4)")
    parser.add_argument(
        "--global-batch", type=int, default=None, help="sequences per step (default 16; --quick 8)"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write (default benchmarks/results)"
    )
    args = parser.parse_args()
    args.steps = args.steps or (6 if args.quick else 40)
    args.global_batch = args.global_batch or (8 if args.quick else 16)
    model = QUICK_MODEL if args.quick else FULL_MODEL
    rows, cluster, cluster_text = measure(args, model)
    write_outputs(rows, model, cluster, cluster_text, args)
    return 0


def write_outputs(
    rows: list[dict[str, Any]],
    model: dict[str, Any],
    cluster: str,
    cluster_text: str,
    args: argparse.Namespace,
) -> None:
    tag = "moe_quick" if args.quick else "moe"
    out_dir = args.out_dir
    paths = output_paths(tag, out_dir)
    write_csv(paths["csv"], rows, COLUMNS, extrasaction="ignore")
    dense = rows[0]
    moe = next(r for r in rows if r["run"] == "moe-ep2")
    comparison = {
        "moe_over_dense_tokens_per_s": moe["tokens_per_s"] / dense["tokens_per_s"],
        "predicted_moe_over_dense_tokens_per_s": moe["predicted_tokens_per_s"]
        / dense["predicted_tokens_per_s"],
        "moe_over_dense_total_params": moe["n_params"] / dense["n_params"],
        "moe_over_dense_active_params": moe["n_active_params"] / dense["n_active_params"],
        "moe_minus_dense_final_loss": moe["final_loss"] - dense["final_loss"],
    }
    settings = {k: v for k, v in vars(args).items() if k != "out_dir"}
    record = {
        "rows": rows,
        "comparison": comparison,
        "settings": settings,
        "model": model,
        "experts": EXPERTS,
    }
    record |= {"cluster": cluster, "cluster_resolved": cluster_text}
    write_record(paths["json"], record)
    lines = [
        f"# Dense vs MoE at equal active parameters ({model['name']}, 2 ranks)",
        "",
        f"Command: `{command_line()}` — GPT-2 with "
        f"{model['n_layers']} blocks, hidden {model['hidden_size']}, seq {model['seq_length']}, vocabulary "
        f"{model['vocab_size']}; MoE: every MLP → {EXPERTS['num_experts']} experts, top-{EXPERTS['moe_top_k']}, "
        f"capacity factor {EXPERTS['moe_capacity_factor']}; ZeRO-1, bf16, micro-batch {args.micro_batch}, "
        f"global batch {args.global_batch}, {args.steps} steps, lr {args.lr}; cluster `{Path(cluster).name}`.",
        "",
        "| run | ep | params total M | pred | active M | pred | per rank dense M | pred | expert M | pred "
        "| step s | pred | tokens/s | pred | × | peak GiB | pred | comm MB/step | loss | eval loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ev = f"{r['eval_loss']:.3f}" if r["eval_loss"] is not None else "-"
        lines.append(
            f"| {r['run']} | {r['ep']} | {r['n_params'] / 1e6:.3f} | {r['predicted_n_params'] / 1e6:.3f} "
            f"| {r['n_active_params'] / 1e6:.3f} | {r['predicted_n_active_params'] / 1e6:.3f} "
            f"| {r['params_rank_dense'] / 1e6:.3f} | {r['predicted_params_rank_dense'] / 1e6:.3f} "
            f"| {r['params_rank_expert'] / 1e6:.3f} | {r['predicted_params_rank_expert'] / 1e6:.3f} "
            f"| {r['step_time_s']:.3f} | {r['predicted_step_time_s']:.3f} | {r['tokens_per_s']:,.0f} "
            f"| {r['predicted_tokens_per_s']:,.0f} | {r['tokens_per_s_ratio']:.2f} "
            f"| {r['peak_memory_bytes'] / 2**30:.3f} | {r['predicted_memory_bytes'] / 2**30:.3f} "
            f"| {r['comm_bytes_per_step'] / 1e6:.1f} | {r['final_loss']:.3f} | {ev} |"
        )
    c = comparison
    lines += [
        "",
        f"- MoE (ep = 2) / dense: {c['moe_over_dense_total_params']:.2f}× the parameters, "
        f"{c['moe_over_dense_active_params']:.3f}× the active ones; tokens/s {c['moe_over_dense_tokens_per_s']:.2f}× "
        f"measured, {c['predicted_moe_over_dense_tokens_per_s']:.2f}× predicted.",
        f"- Training loss after {args.steps} steps, MoE − dense: {c['moe_minus_dense_final_loss']:+.3f}.",
        "- comm MB/step: bytes this rank passed to collectives per step (DeepSpeed's comms logger).",
        f"- Chart: `{paths['png'].name}`",
    ]
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(rows, paths["png"])
    print(f"wrote {paths['csv']}, {paths['md']}, {paths['png']}")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["run"] for r in rows]
    x = range(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title, scale in (
        (axes[0], "tokens_per_s", "tokens/s", 1.0),
        (axes[1], "memory", "peak memory per rank (GiB)", 2**30),
    ):
        measured = "peak_memory_bytes" if key == "memory" else key
        predicted = "predicted_memory_bytes" if key == "memory" else f"predicted_{key}"
        ax.bar([i - 0.2 for i in x], [r[measured] / scale for r in rows], 0.4, label="measured")
        ax.bar([i + 0.2 for i in x], [r[predicted] / scale for r in rows], 0.4, label="predicted")
        ax.set_xticks(list(x), names)
        ax.set_title(title)
        ax.legend()
    for r in rows:
        axes[2].plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["run"])
    axes[2].set(xlabel="step", ylabel="training loss (language model)", title="loss")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
