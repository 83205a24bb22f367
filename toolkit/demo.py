"""`make demo`: what dstk does, end to end, on this machine.

For now it compares ZeRO stages for two models with the cost model (the run-path issue replaces this with a
real training run through the DeepSpeed engine).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from toolkit.estimate import estimate
from toolkit.layout import LayoutRequest, resolve_layout
from toolkit.load import load_cluster, load_model
from toolkit.report import human_bytes


def _table(model_name: str, cluster_name: str, nodes: int, **layout: object) -> Table:
    model, cluster = load_model(model_name), load_cluster(cluster_name, {"nodes": nodes})
    table = Table(title=f"{model_name} on {nodes} × {cluster_name} ({cluster.world_size} ranks)")
    for col in ("ZeRO", "model states", "activations", "total/GPU", "fits", "step s", "tokens/s", "MFU"):
        table.add_column(col, justify="right")
    for stage in range(4):
        e = estimate(
            model, cluster, resolve_layout(model, cluster, LayoutRequest(zero_stage=stage, **layout))
        )
        table.add_row(
            str(stage),
            human_bytes(e.memory.engine.device_bytes),
            human_bytes(e.memory.activations),
            human_bytes(e.memory.total),
            "yes" if e.fits else "no",
            f"{e.time.total_s:.3g}",
            f"{e.tokens_per_s:,.0f}",
            f"{e.mfu:.1%}",
        )
    return table


def main() -> None:
    console = Console()
    console.print(
        _table(
            "llama-7b", "dgx-a100-80g", 2, micro_batch_size=2, global_batch_size=256, recompute="selective"
        )
    )
    console.print(_table("tiny-gpt2", "cpu", 1, micro_batch_size=8))
    console.print(
        "Try: dstk estimate --model gpt-1t --cluster dgx-a100-80g --nodes 384 --tp 8 --pp 64 --zero-stage 1"
    )


if __name__ == "__main__":
    main()
