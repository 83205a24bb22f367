"""Human-readable tables of estimates (rich), shared by `estimate`, `plan` and the demo."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from toolkit.plan.params import count_params

if TYPE_CHECKING:
    from toolkit.plan.cost.estimate import Estimate

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


def print_estimate(est: Estimate, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    m, t = est.memory, est.time
    console = Console()
    c = est.cluster
    head = title or f"{est.model.name} ({human_count(count_params(est.model).total)} params)"
    console.print(
        f"[bold]{head}[/bold] on {c.nodes} × {c.name} ({c.world_size} ranks of {c.gpu_memory_gib:g} GiB)"
    )
    console.print(f"layout: {est.layout.describe()}")
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
    from toolkit.plan.checkpoint_interval import plan_for

    ckpt = plan_for(est)  # asynchronous saves hold a host copy per tier in flight, when it fits
    snapshot = human_bytes(ckpt.snapshot_host_bytes) if ckpt.asynchronous else "no room: saves synchronous"
    mem.add_row("host memory per node (checkpoint snapshots)", snapshot)
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
    console.print(f"{verdict}; {mfu_line(est)}")


def mfu_line(est: Estimate) -> str:
    """Throughput in one sentence: model TFLOP/s per GPU and the MFU they make of the precision's peak, and the
    TFLOP/s executed with recomputation (never fewer)."""
    peak = est.peak_flops / 1e12
    return (
        f"{est.tokens_per_s:,.0f} tokens/s; MFU {est.mfu:.1%} = {est.tflops_per_gpu:,.4g} TFLOP/s per GPU of "
        f"model FLOPs / {est.layout.precision} peak {peak:,.4g} TFLOP/s; {est.hardware_tflops_per_gpu:,.4g} "
        "TFLOP/s executed (recomputation included)"
    )


def write_plan_report(path: Path, model: Any, cluster: Any, plan: Any, data: dict[str, Any]) -> None:
    """A Markdown report of a plan: the layout, its memory and time, the reasons and the alternatives; with
    `data["training"]` the cost of the token budget, with `data["scaling"]` the scaling table; and two PNGs
    beside it (per-GPU memory by component of the chosen and runner-up layouts, scaling), linked from it."""
    from toolkit.report.cost import ScalingRow, memory_parts, runner_ups, write_charts

    est = plan.best.estimate
    m, t = est.memory, est.time
    lines = [
        f"# Plan: {model.name} on {cluster.nodes} × {cluster.name}",
        "",
        f"**Layout:** {est.layout.describe()}",
        "",
        f"- {mfu_line(est)}",
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
        lines += ["", *training_lines(data["training"])]
    bars = [(f"chosen: {est.layout.describe(short=True)}", memory_parts(est))]
    bars += [(a.layout.describe(short=True), memory_parts(a.estimate)) for a in runner_ups(plan)]
    rows = data.get("scaling", [])
    path.parent.mkdir(parents=True, exist_ok=True)
    charts = write_charts(path, bars, plan.usable_bytes, est.capacity_bytes, [ScalingRow(**r) for r in rows])
    gib = float(1 << 30)
    lines += [
        "",
        "## Memory per GPU by component (GiB)",
        "",
        f"![memory per GPU by component]({quote(charts['memory'].name)})",
        "",
        "| layout | " + " | ".join(bars[0][1]) + " | total |",
        "|---|" + "---|" * (len(bars[0][1]) + 1),
        *[
            f"| {label} | "
            + " | ".join(f"{v / gib:.1f}" for v in parts.values())
            + f" | {sum(parts.values()) / gib:.1f} |"
            for label, parts in bars
        ],
        "",
        f"Usable: {plan.usable_bytes / gib:.1f} GiB of {est.capacity_bytes / gib:.1f} GiB (the rest is the safety margin).",
    ]
    if rows:
        lines += ["", *scaling_lines(rows, data["layout"]["global_batch_size"], charts.get("scaling"))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def training_lines(tr: dict[str, Any]) -> list[str]:
    """The "Training cost" section (see toolkit.report.cost for the arithmetic and its sources)."""
    how = (
        f"training compute / (GPUs · peak · MFU) with MFU {tr['mfu']:.1%} (`--mfu`)"
        if tr["time_source"] == "mfu"
        else f"tokens / the plan's {tr['tokens_per_s']:,.0f} tokens/s (the plan's MFU, {tr['mfu']:.1%})"
    )
    cost = (
        f"{tr['cost']:,.0f} at {tr['price_per_gpu_hour']:g} per GPU-hour"
        if tr["cost"] is not None
        else "give `--price-per-gpu-hour`"
    )
    return [
        "## Training cost",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| tokens D | {human_count(tr['tokens'])} ({tr['tokens']:.3g}) |",
        f"| training compute (6·N + 12·L·H·Q·T)·D | {tr['training_flops']:.3g} model FLOPs ({tr['flops_per_token']:.4g} per token; N = {human_count(tr['n_params'])} parameters a token multiplies by) |",
        f"| GPUs × peak | {tr['gpus']:,} × {tr['peak_flops_per_gpu'] / 1e12:g} TFLOP/s |",
        f"| time to train | {tr['days']:,.1f} days ({tr['hours']:,.0f} h): {how} |",
        f"| GPU-hours | {tr['gpu_hours']:,.0f} |",
        f"| energy | {tr['energy_kwh'] / 1000:,.1f} MWh = GPUs × {tr['gpu_power_w']:g} W × hours × PUE {tr['pue']:g} |",
        f"| cost | {cost} |",
        "",
        "Time excludes checkpoint saves, restarts after failures and evaluation (see the checkpoint line above).",
    ]


def scaling_lines(rows: list[dict[str, Any]], global_batch: int, chart: Path | None) -> list[str]:
    """The scaling table: the plan re-made at each node count with the same global batch."""
    out = [
        "## Scaling over node counts",
        "",
        f"Re-planned at each node count with the same constraints and global batch ({global_batch}); efficiency "
        "is tokens/s per GPU relative to the smallest node count that fits.",
        "",
    ]
    if chart is not None:
        out += [f"![tokens/s over node counts]({quote(chart.name)})", ""]
    out += ["| nodes | GPUs | layout | tokens/s | MFU | scaling efficiency |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["tokens_per_s"] is None:
            out.append(f"| {r['nodes']} | {r['gpus']:,} | {r['reason']} | – | – | – |")
        else:
            out.append(
                f"| {r['nodes']} | {r['gpus']:,} | {r['layout']} | {r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | "
                f"{r['efficiency']:.1%} |"
            )
    return out
