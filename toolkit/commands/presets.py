"""`dstk presets`: the model and cluster presets with their key figures, read from the preset files."""

from __future__ import annotations

import argparse

from toolkit.commands import print_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    from toolkit.plan.load import load_cluster, load_model
    from toolkit.plan.params import count_params
    from toolkit.plan.presets import preset_names

    models = [load_model(name) for name in preset_names("models")]
    clusters = [load_cluster(name) for name in preset_names("clusters")] + [load_cluster("local")]
    model_rows = [
        {
            "name": m.name,
            "architecture": m.architecture,
            "n_params": count_params(m).total,
            "n_active_params": count_params(m).active,
            "n_layers": m.n_layers,
            "hidden_size": m.hidden_size,
            "n_heads": m.n_heads,
            "n_kv_heads": m.n_kv_heads,
            "vocab_size": m.vocab_size,
            "seq_length": m.seq_length,
            "num_experts": m.num_experts,
            "moe_top_k": m.moe_top_k,
        }
        for m in models
    ]
    cluster_rows = [
        {
            "name": c.name,
            "accelerator": c.accelerator,
            "gpus_per_node": c.gpus_per_node,
            "gpu_memory_gib": c.gpu_memory_gib,
            "gpu_peak_tflops": c.gpu_peak_tflops,
            "intra_node_gb_per_s": c.intra_node_gb_per_s,
            "inter_node_gb_per_s": c.inter_node_gb_per_s,
            "cpu_memory_gib": c.cpu_memory_gib,
            "nvme_gib": c.nvme_gib,
            "gpu_power_w": c.gpu_power_w,
        }
        for c in clusters
    ]
    if args.json:
        print_json({"models": model_rows, "clusters": cluster_rows})
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Model presets (--model)")
    for col in (
        "name",
        "arch",
        "params",
        "active",
        "layers",
        "hidden",
        "heads/kv",
        "vocab",
        "seq",
        "experts",
    ):
        table.add_column(col, justify="left" if col in ("name", "arch") else "right")
    for r in model_rows:
        experts = f"{r['num_experts']} top-{r['moe_top_k']}" if r["num_experts"] else "-"
        table.add_row(
            r["name"],
            r["architecture"],
            f"{r['n_params'] / 1e9:,.2f}B",
            f"{r['n_active_params'] / 1e9:,.2f}B",
            str(r["n_layers"]),
            str(r["hidden_size"]),
            f"{r['n_heads']}/{r['n_kv_heads']}",
            str(r["vocab_size"]),
            str(r["seq_length"]),
            experts,
        )
    ctable = Table(title="Cluster presets (--cluster, one node; --nodes N to scale)")
    for col in (
        "name",
        "accel",
        "gpus/node",
        "mem GiB",
        "peak TF",
        "intra GB/s",
        "inter GB/s",
        "CPU GiB",
        "NVMe GiB",
        "W/GPU",
    ):
        ctable.add_column(col, justify="left" if col in ("name", "accel") else "right")
    for r in cluster_rows:
        ctable.add_row(
            r["name"],
            r["accelerator"],
            str(r["gpus_per_node"]),
            f"{r['gpu_memory_gib']:g}",
            f"{r['gpu_peak_tflops']:g}",
            f"{r['intra_node_gb_per_s']:g}",
            f"{r['inter_node_gb_per_s']:g}",
            f"{r['cpu_memory_gib']:g}",
            f"{r['nvme_gib']:g}",
            f"{r['gpu_power_w']:g}",
        )
    console = Console()
    console.print(table)
    console.print(ctable)
    return 0
