"""Human-readable tables of estimates (rich), shared by `estimate`, `plan` and the demo."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.estimate import Estimate

GB = 1e9


def human_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def human_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def layout_line(est: Estimate) -> str:
    lay = est.layout
    parts = [f"ZeRO-{lay.zero_stage}", f"tp={lay.tp}", f"pp={lay.pp}", f"dp={lay.dp}"]
    if lay.ep > 1:
        parts.append(f"ep={lay.ep}")
    if lay.sp > 1:
        parts.append(f"sp={lay.sp}")
    parts += [
        f"micro={lay.micro_batch_size}",
        f"accum={lay.gradient_accumulation_steps}",
        f"global={lay.global_batch_size}",
        f"recompute={lay.recompute}",
        lay.precision,
    ]
    if lay.offload_optimizer != "none":
        parts.append(f"offload_optimizer={lay.offload_optimizer}")
    if lay.offload_param != "none":
        parts.append(f"offload_param={lay.offload_param}")
    if lay.optimizer != "adamw":
        parts.append(lay.optimizer)
    return " ".join(parts)


def print_estimate(est: Estimate, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    m, t = est.memory, est.time
    console = Console()
    c = est.cluster
    head = title or f"{est.model.name} ({human_count(est.model.n_params())} params)"
    console.print(
        f"[bold]{head}[/bold] on {c.nodes} × {c.name} ({c.world_size} ranks of {c.gpu_memory_gib:g} GiB)"
    )
    console.print(f"layout: {layout_line(est)}")
    mem = Table(title="Memory per GPU (most loaded pipeline stage)", show_header=True)
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    rows = [
        ("params (ZeRO-paper convention)", m.params),
        ("gradients", m.gradients),
        ("optimizer states", m.optimizer_states),
        ("engine model states (as allocated)", m.engine.device_bytes),
        ("activations", m.activations),
        ("buffers (buckets, ZeRO-3 gathers)", m.buffers),
        ("framework overhead", m.framework_overhead),
        ("total", m.total),
        ("capacity", est.capacity_bytes),
    ]
    for name, value in rows:
        mem.add_row(name, human_bytes(value))
    if m.cpu_per_node:
        mem.add_row("host memory per node (offload)", human_bytes(m.cpu_per_node))
    if m.nvme_per_node:
        mem.add_row("NVMe per node (offload)", human_bytes(m.nvme_per_node))
    console.print(mem)
    tt = Table(title="Step time", show_header=True)
    tt.add_column("part")
    tt.add_column("seconds", justify="right")
    for name, value in (
        ("compute", t.compute_s),
        ("pipeline bubble", t.pipeline_bubble_s),
        ("TP/EP/SP/PP communication", t.model_parallel_comm_s),
        ("data-parallel comm (exposed)", t.data_parallel_comm_s),
        ("optimizer step", t.optimizer_s),
        ("offload transfers (exposed)", t.offload_s),
        ("total", t.total_s),
    ):
        tt.add_row(name, f"{value:.4g}")
    console.print(tt)
    verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
    console.print(
        f"{verdict}; {est.tokens_per_s:,.0f} tokens/s, {est.tflops_per_gpu:.1f} TFLOP/s per GPU "
        f"(model; {est.hardware_tflops_per_gpu:.1f} with recomputation), MFU {est.mfu:.1%}"
    )


def write_plan_report(path: Path, model: Any, cluster: Any, plan: Any, data: dict[str, Any]) -> None:
    """A Markdown report of a plan: the layout, its memory and time, the reasons and the alternatives."""
    est = plan.best.estimate
    m, t = est.memory, est.time
    lines = [
        f"# Plan: {model.name} on {cluster.nodes} × {cluster.name}",
        "",
        f"**Layout:** {layout_line(est)}",
        "",
        f"- tokens/s: {est.tokens_per_s:,.0f}; TFLOP/s per GPU: {est.tflops_per_gpu:.1f}; MFU: {est.mfu:.1%}",
        f"- step time: {t.total_s:.4g} s",
        f"- memory per GPU: {human_bytes(m.total)} of {human_bytes(est.capacity_bytes)}",
        "",
        "| memory part | bytes |",
        "|---|---|",
        *[f"| {k} | {human_bytes(v)} |" for k, v in data["estimate"]["memory_per_gpu_bytes"].items()],
        "",
        "| step-time part | seconds |",
        "|---|---|",
        *[f"| {k} | {v:.4g} |" for k, v in data["estimate"]["step_time_breakdown_s"].items()],
        "",
        "## Why this layout",
        "",
        *[f"- {line}" for line in plan.explanation],
    ]
    if "training" in data:
        tr = data["training"]
        lines += [
            "",
            "## Training",
            "",
            f"- {tr['tokens']:.3g} tokens: {tr['days']:.1f} days, {tr['gpu_hours']:,.0f} GPU-hours",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
