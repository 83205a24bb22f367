"""Human-readable tables of estimates and plans, shared by `estimate`, `plan` and the report.

Figures follow one convention (toolkit.plan.units, stated at the top of the output): memory in GiB, bandwidth
in GB/s, model TFLOP/s and MFU against the peak of the layout's precision with the executed TFLOP/s
(recomputation included) beside them. Every table of parts adds up to its total.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from toolkit.plan.layout import engine_precision
from toolkit.plan.params import count_params
from toolkit.plan.units import GIB, UNITS_NOTE, format_bytes, format_count

if TYPE_CHECKING:
    from rich.console import Console

    from toolkit.plan.cost.estimate import Estimate


def memory_labels(precision: str | None = None) -> dict[str, str]:
    """What each part of `Memory.parts()` (the JSON's `memory_per_gpu_bytes`) is, for people."""
    return {
        "params": f"params ({precision + ' ' if precision else ''}working copy)",
        "fp8_weight_copies": "FP8 weight copies (Transformer Engine)",
        "gradients": "gradients",
        "optimizer_states": "optimizer states (fp32 master, moments)",
        "activations": "activations",
        "buffers": "buffers (buckets, ZeRO-3 gathers)",
        "framework_overhead": "framework overhead (cluster figure)",
        "step_transient_excess": "optimizer step above activations + buffers",
    }


def memory_parts(est: Estimate) -> dict[str, float]:
    """Peak bytes per GPU by component, named for people, summing to `est.memory.total` (`Memory.parts()`,
    as the tables and the JSON show them); one set of names for layouts of different precisions (charts)."""
    labels = memory_labels()
    return {labels[k]: v for k, v in est.memory.parts().items()}


HOST_LABELS = {
    "offloaded_states": "offloaded states and gradient buffers",
    "nvme_swap_buffers": "NVMe swap buffers",
    "activation_checkpoints": "offloaded activation checkpoints",
    "checkpoint_snapshots": "checkpoint snapshots (with --async-save)",
}
"""What each part of `Estimate.host_parts()` (the JSON's `host_memory_per_node_bytes`) is, for people."""


def console() -> Console:
    """A rich console whose free-text lines never wrap mid-record: a terminal folds a long line itself, and
    piped output keeps each line whole for grep (rich would otherwise break lines at 80 columns)."""
    from rich.console import Console

    class _Quiet(Console):
        def on_broken_pipe(self) -> None:
            """rich's own exits with status 1; the reader leaving (`| head`) is no failure, and the CLI ends
            with 0 on BrokenPipeError (toolkit.cli)."""
            raise BrokenPipeError

    return _Quiet(soft_wrap=True)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Plain columns two spaces apart, as wide as their widest cell: nothing is cut at any terminal width or
    when piped. The first `left` columns are left-aligned, the rest (figures) right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def mfu_line(est: Estimate) -> str:
    """Throughput in one sentence: model TFLOP/s per GPU and the MFU they make of the precision's peak, and the
    TFLOP/s executed with recomputation (never fewer)."""
    peak = est.peak_flops / 1e12
    fp8 = (
        " (its linear layers' GEMMs; attention, norms and LM head run at bf16's)"
        if est.layout.fp8_recipe
        else ""
    )
    return (
        f"{est.tokens_per_s:,.0f} tokens/s; MFU {est.mfu:.1%} = {est.tflops_per_gpu:,.4g} TFLOP/s per GPU of "
        f"model FLOPs / {est.layout.precision} peak {peak:,.4g} TFLOP/s{fp8}; {est.hardware_tflops_per_gpu:,.4g} "
        "TFLOP/s executed (recomputation included)"
    )


def print_estimate(est: Estimate, title: str | None = None) -> None:
    from rich.table import Table

    m, t = est.memory, est.time
    out = console()
    c = est.cluster
    head = title or f"{est.model.name} ({format_count(count_params(est.model).total)} params)"
    out.print(
        f"[bold]{head}[/bold] on {c.nodes} × {c.name} ({c.world_size} ranks of {c.gpu_memory_gib:g} GiB)"
    )
    out.print(f"layout: {est.layout.describe()}", highlight=False)
    out.print(f"units: {UNITS_NOTE}", highlight=False)
    phase = "backward" if m.peak_phase == "backward" else "the optimizer step"
    mem = Table(title=f"Memory per GPU (most loaded pipeline stage; peak in {phase})", show_header=True)
    mem.add_column("part")
    mem.add_column("size", justify="right")
    labels = memory_labels(engine_precision(est.layout.precision))
    parts = m.parts()
    for key, value in parts.items():
        if key != "fp8_weight_copies" or value:  # a row of zeros for every layout that is not fp8: noise
            mem.add_row(labels[key], format_bytes(value))
    mem.add_section()
    mem.add_row("total", format_bytes(sum(parts.values())))
    mem.add_row("capacity", format_bytes(est.capacity_bytes))
    out.print(mem)
    out.print(_host_table(est))
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
    ):
        tt.add_row(name, f"{value:.4g}")
    tt.add_section()
    tt.add_row("total", f"{t.total_s:.4g}")
    out.print(tt)
    verdict = "[green]fits[/green]" if est.fits else "[red]does not fit[/red]"
    out.print(f"{verdict}; {mfu_line(est)}")


def _host_table(est: Estimate) -> Any:
    """Host memory (and NVMe) per node: what offload takes, and what asynchronous checkpoint saves would."""
    from rich.table import Table

    from toolkit.plan.cost.memory import HOST_USABLE

    table = Table(title="Host memory per node", show_header=True)
    table.add_column("part")
    table.add_column("size", justify="right")
    parts = est.host_parts()
    for key, value in parts.items():
        if key == "checkpoint_snapshots" and not est.checkpoint_plan().asynchronous:
            table.add_row(HOST_LABELS[key], "no room: saves synchronous")
        elif value or key in ("offloaded_states", "checkpoint_snapshots"):
            table.add_row(HOST_LABELS[key], format_bytes(value))
    table.add_section()
    table.add_row("total", format_bytes(sum(parts.values())))
    cap = est.cluster.cpu_memory_gib * GIB
    table.add_row(f"capacity ({HOST_USABLE:.0%} usable)", format_bytes(cap))
    if est.memory.nvme_per_node:
        table.add_section()
        table.add_row("NVMe per node (offload)", format_bytes(est.memory.nvme_per_node))
        table.add_row("NVMe capacity", format_bytes(est.cluster.nvme_gib * GIB))
    return table


def write_plan_report(path: Path, model: Any, cluster: Any, plan: Any, data: dict[str, Any]) -> None:
    """A Markdown report of a plan: the layout, its memory and time, the reasons and the alternatives; with
    `data["training"]` the cost of the token budget, with `data["scaling"]` the scaling table; and two PNGs
    beside it (per-GPU memory by component of the chosen and runner-up layouts, scaling), linked from it."""
    from toolkit.report.charts import runner_ups, write_charts

    est = plan.best.estimate
    t = est.time
    memory = data["estimate"]["memory_per_gpu_bytes"]
    labels = {**memory_labels(est.layout.precision), "total": f"**total** (peak in {est.memory.peak_phase})"}
    lines = [
        f"# Plan: {model.name} on {cluster.nodes} × {cluster.name}",
        "",
        f"**Layout:** {est.layout.describe()}",
        "",
        f"Units: {UNITS_NOTE}.",
        "",
        f"- {mfu_line(est)}",
        f"- step time: {t.total_s:.4g} s",
        f"- memory per GPU: {format_bytes(memory['total'])} of {format_bytes(est.capacity_bytes)}",
        "",
        "| memory part (per GPU) | size |",
        "|---|---|",
        *[f"| {labels[k]} | {format_bytes(v)} |" for k, v in memory.items()],
        "",
        "| host memory part (per node) | size |",
        "|---|---|",
        *[
            f"| {HOST_LABELS.get(k, '**total**')} | {format_bytes(v)} |"
            for k, v in data["estimate"]["host_memory_per_node_bytes"].items()
        ],
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
    charts = write_charts(path, bars, plan.usable_bytes, est.capacity_bytes, rows)
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
            + " | ".join(f"{v / GIB:.2f}" for v in parts.values())
            + f" | {sum(parts.values()) / GIB:.2f} |"
            for label, parts in bars
        ],
        "",
        f"Usable: {plan.usable_bytes / GIB:.1f} GiB of {est.capacity_bytes / GIB:.1f} GiB (the rest is the safety margin).",
    ]
    if rows:
        lines += ["", *scaling_lines(rows, data["layout"]["global_batch_size"], charts.get("scaling"))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def training_lines(tr: dict[str, Any]) -> list[str]:
    """The "Training cost" section (see toolkit.plan.training_cost for the arithmetic and its sources)."""
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
        f"| tokens D | {format_count(tr['tokens'])} ({tr['tokens']:.3g}) |",
        f"| training compute (6·N + 12·L·H·Q·T)·D | {tr['training_flops']:.3g} model FLOPs ({tr['flops_per_token']:.4g} per token; N = {format_count(tr['n_params'])} parameters a token multiplies by) |",
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


def field_lines(cluster: dict[str, object], sources: dict[str, str]) -> list[str]:
    """One line per field, YAML-like (`key: value  # source`): a value of any length (a dict of bandwidths)
    pushes only its own comment right, never into it; values are padded to the short ones' width."""

    def show(value: object) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
        return str(value)

    values = {k: show(v) for k, v in cluster.items()}
    key_w = max(map(len, values)) + 1
    value_w = max((len(v) for v in values.values() if len(v) <= 28), default=0)
    return [f"  {key + ':':<{key_w}} {v:<{value_w}}  # {sources.get(key, '-')}" for key, v in values.items()]
