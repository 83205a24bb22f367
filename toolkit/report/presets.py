"""`dstk presets` as rows and text tables: each model preset's shape and exact parameter counts, each cluster
preset's per-GPU and per-node figures. Rendering only: the figures come from the descriptions."""

from __future__ import annotations

from typing import Any

from toolkit.plan.params import count_params
from toolkit.plan.units import format_count
from toolkit.report.render import text_table


def preset_rows(models: list[Any], clusters: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The `dstk presets --json` document: one row per model and per cluster description."""
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
            "nodes": c.nodes,
            "gpus_per_node": c.gpus_per_node,
            "nvlink_domain_gpus": c.nvlink_domain,
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
    return {"models": model_rows, "clusters": cluster_rows}


def print_presets(rows: dict[str, list[dict[str, Any]]]) -> None:
    model_rows, cluster_rows = rows["models"], rows["clusters"]
    models_table = text_table(
        ("name", "arch", "params", "active", "layers", "hidden", "heads/kv", "vocab", "seq", "experts"),
        [
            (
                r["name"],
                r["architecture"],
                format_count(r["n_params"]),
                format_count(r["n_active_params"]),
                str(r["n_layers"]),
                str(r["hidden_size"]),
                f"{r['n_heads']}/{r['n_kv_heads']}",
                str(r["vocab_size"]),
                str(r["seq_length"]),
                f"{r['num_experts']} top-{r['moe_top_k']}" if r["num_experts"] else "-",
            )
            for r in model_rows
        ],
        left=2,
    )
    clusters_table = text_table(
        (
            "name",
            "accel",
            "nodes",
            "GPUs",
            "GiB",
            "TFLOP/s",
            "intra GB/s",
            "inter GB/s",
            "CPU GiB",
            "NVMe GiB",
            "W",
        ),
        [
            (
                r["name"],
                r["accelerator"],
                str(r["nodes"]),
                str(r["gpus_per_node"])
                + (f" ({r['nvlink_domain_gpus']})" if r["nvlink_domain_gpus"] != r["gpus_per_node"] else ""),
                f"{r['gpu_memory_gib']:g}",
                f"{r['gpu_peak_tflops']:g}",
                f"{r['intra_node_gb_per_s']:g}",
                f"{r['inter_node_gb_per_s']:g}",
                f"{r['cpu_memory_gib']:g}",
                f"{r['nvme_gib']:g}",
                f"{r['gpu_power_w']:g}",
            )
            for r in cluster_rows
        ],
        left=2,
    )
    print("Model presets (--model); params, and active params per token, in K/M/B/T:")
    print("\n".join(models_table))
    print(
        "\nCluster presets (--cluster; --nodes N to scale). GPUs per node (per NVLink domain where it spans"
    )
    print(
        "nodes: an NVL72 rack); per GPU: memory, 16-bit peak, NVLink and network bandwidth, power; per node:"
    )
    print("CPU memory and NVMe:")
    print("\n".join(clusters_table))
