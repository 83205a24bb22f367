"""What a training run will cost: time, GPU-hours, energy and money for a token budget, plus the memory and
scaling figures of `dstk plan --report` (pure; matplotlib is imported only to draw the PNGs).

Training compute is the plan's model FLOPs per token times the tokens D: (6·N + 12·L·H·Q·T)·D, the PaLM
convention behind the plan's MFU (toolkit.plan.cost.flops), so one MFU describes both. Its 6·N·D part is
Kaplan et al. 2020's C ≈ 6·N·D — for GPT-3 175B on 300B tokens 3.14e23 FLOPs, as Brown et al. 2020 (Table
D.1) report; attention adds 2.8 % at 2,048 tokens. With `--mfu` the time is that compute over the cluster's
peak at that utilisation, C / (GPUs · peak · MFU); without it, the time comes from the plan's predicted
tokens/s, and the MFU shown is the plan's own. Energy = GPUs · gpu_power_w · hours · PUE / 1000 kWh.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.query import PlanQuery

DEFAULT_PUE = 1.1
"""Power usage effectiveness (facility energy / IT energy). 1.10 is what Patterson et al. 2021, "Carbon
Emissions and Large Neural Network Training" (arXiv:2104.10350, Table 4) use for the Microsoft datacenter
that trained GPT-3 (Google's were 1.09–1.12); the industry-wide average is about 1.5–1.6 (Uptime Institute's
annual surveys): pass `--pue` for an ordinary machine room."""

_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT = re.compile(r"(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*([kmbgt]?)", re.IGNORECASE)


def parse_tokens(text: str, flag: str = "--tokens") -> float:
    """A token count written as 300e9, 3e11, 300B, 1.5T, 300_000_000_000 or 300,000,000,000."""
    match = _COUNT.fullmatch(text.strip().replace("_", "").replace(",", ""))
    value = (
        float(match.group(1) + (match.group(2) or "")) * _SCALE[match.group(3).lower()] if match else math.nan
    )
    if not (math.isfinite(value) and value >= 1):
        raise UserError(f"{flag}: {text!r} is not a token count; write e.g. 300e9, 3e11, 300B or 1.5T")
    return value


def parse_mfu(text: str) -> float:
    """Model FLOPs utilisation as a fraction (0.45) or a percentage (45%)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise UserError(f"--mfu: {text!r} must be a fraction in (0, 1], e.g. 0.45 or 45%")
    return value


@dataclass(frozen=True)
class TrainingCost:
    """Time, GPU-hours, energy and cost of training `tokens` tokens on `gpus` accelerators."""

    tokens: float
    flops_per_token: float
    """Model FLOPs per token, 6·N + 12·L·H·Q·T (toolkit.plan.cost.flops): the plan's MFU convention."""
    n_params: float
    """N of 6·N: the parameters a token multiplies by."""
    training_flops: float
    gpus: int
    peak_flops_per_gpu: float
    mfu: float
    """Used (`--mfu`) or implied by the plan's tokens/s (then the plan's own MFU)."""
    time_source: str
    """"mfu" (training FLOPs / (GPUs · peak · MFU)) or "plan" (tokens / the plan's predicted tokens/s)."""
    tokens_per_s: float
    seconds: float
    gpu_power_w: float
    pue: float
    price_per_gpu_hour: float | None

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours

    @property
    def energy_kwh(self) -> float:
        return self.gpus * self.gpu_power_w * self.hours * self.pue / 1000

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "hours": self.hours,
            "days": self.seconds / 86400,
            "gpu_hours": self.gpu_hours,
            "energy_kwh": self.energy_kwh,
            "cost": self.cost,
        }


def training_cost(
    *,
    tokens: float,
    flops_per_token: float,
    n_params: float,
    gpus: int,
    peak_flops_per_gpu: float,
    plan_tokens_per_s: float,
    gpu_power_w: float,
    pue: float = DEFAULT_PUE,
    price_per_gpu_hour: float | None = None,
    mfu: float | None = None,
) -> TrainingCost:
    """The cost of `tokens` (see the module docstring for the two ways the time is found)."""
    flops = flops_per_token * tokens
    if mfu is not None:
        seconds, source = flops / (gpus * peak_flops_per_gpu * mfu), "mfu"
    else:
        seconds, source = tokens / plan_tokens_per_s, "plan"
        mfu = flops / (seconds * gpus * peak_flops_per_gpu)
    return TrainingCost(
        tokens=tokens,
        flops_per_token=flops_per_token,
        n_params=n_params,
        training_flops=flops,
        gpus=gpus,
        peak_flops_per_gpu=peak_flops_per_gpu,
        mfu=mfu,
        time_source=source,
        tokens_per_s=tokens / seconds,
        seconds=seconds,
        gpu_power_w=gpu_power_w,
        pue=pue,
        price_per_gpu_hour=price_per_gpu_hour,
    )


# ---- runner-ups ---------------------------------------------------------------------------------------


def runner_ups(plan: Any, limit: int = 3) -> list[Any]:
    """The fastest distinct fitting alternatives the planner reported (candidates with an estimate)."""
    seen = {plan.best.layout.describe(short=True)}
    out = []
    for cand in sorted(
        (a for a in plan.alternatives if a.estimate is not None), key=lambda a: -a.estimate.tokens_per_s
    ):
        key = cand.layout.describe(short=True)
        if key not in seen:
            seen.add(key)
            out.append(cand)
    return out[:limit]


# ---- scaling over node counts -------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalingRow:
    nodes: int
    gpus: int
    layout: str | None
    tokens_per_s: float | None
    mfu: float | None
    efficiency: float | None
    """(tokens/s per GPU) / (tokens/s per GPU at the smallest node count that fits)."""
    reason: str | None = None


def parse_node_counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise UserError(
            f"--scaling-nodes: {text!r} must be a comma-separated list of node counts, e.g. 8,16,32"
        )
    return counts


def default_node_counts(nodes: int) -> list[int]:
    """A quarter, half, the planned and twice the planned node count (whole nodes only)."""
    return sorted({nodes, nodes * 2} | {nodes // f for f in (2, 4) if nodes % f == 0})


def scaling_rows(
    model: Any,
    cluster: Any,
    query: PlanQuery,
    *,
    node_counts: list[int],
) -> list[ScalingRow]:
    """Re-plan at each node count with the same query, global batch included (strong scaling)."""
    from toolkit.plan.planner import plan

    raw = []
    for n in node_counts:
        sized = cluster.model_copy(update={"nodes": n, "hostnames": None})
        result = plan(model, sized, query)
        raw.append((n, sized.world_size, result))
    base = next(((n, r.best.estimate.tokens_per_s) for n, _, r in raw if r is not None), None)
    rows = []
    for n, gpus, result in raw:
        if result is None or base is None:
            why = f"no layout fits with global batch {query.global_batch_size}"
            rows.append(ScalingRow(n, gpus, None, None, None, None, why))
            continue
        est = result.best.estimate
        eff = (est.tokens_per_s / n) / (base[1] / base[0])
        rows.append(ScalingRow(n, gpus, est.layout.describe(short=True), est.tokens_per_s, est.mfu, eff))
    return rows


# ---- charts -------------------------------------------------------------------------------------------


def write_charts(
    report: Path, bars: list[tuple[str, dict[str, float]]], usable_bytes: float, capacity_bytes: float,
    rows: list[ScalingRow],
) -> dict[str, Path]:  # fmt: skip
    """`REPORT_memory.png` (stacked per-GPU memory of each layout) and `REPORT_scaling.png`, beside the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    gib = float(1 << 30)
    paths = {"memory": report.with_name(f"{report.stem}_memory.png")}
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.7 * len(bars)))
    labels = [label for label, _ in bars][::-1]
    left = [0.0] * len(bars)
    for i, part in enumerate(bars[0][1]):
        widths = [parts[part] / gib for _, parts in bars][::-1]
        ax.barh(labels, widths, left=left, label=part, color=plt.get_cmap("tab10")(i))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.axvline(usable_bytes / gib, color="black", linestyle="--", linewidth=1, label="usable (after margin)")
    ax.axvline(capacity_bytes / gib, color="black", linewidth=1, label="capacity")
    ax.set_xlabel("GiB per GPU (most loaded pipeline stage)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.savefig(paths["memory"], dpi=120, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    fitting = [r for r in rows if r.tokens_per_s]
    if fitting:
        paths["scaling"] = report.with_name(f"{report.stem}_scaling.png")
        fig, ax = plt.subplots(figsize=(7, 4))
        gpus = [r.gpus for r in fitting]
        ax.plot(gpus, [r.tokens_per_s for r in fitting], "o-", label="planned")
        ideal = fitting[0].tokens_per_s / fitting[0].gpus  # type: ignore[operator]
        ax.plot(gpus, [ideal * g for g in gpus], ":", color="gray", label="linear from the smallest")
        for r in fitting:
            ax.annotate(
                f"{r.efficiency:.0%}", (r.gpus, r.tokens_per_s), textcoords="offset points", xytext=(4, -12)
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [f"{g:,}" for g in gpus])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:,.0f}"))
        ax.set_xlabel("GPUs (log scale)")
        ax.set_ylabel("tokens/s")
        ax.set_title("Planned throughput; labels: scaling efficiency", fontsize=9)
        ax.legend(frameon=False)
        fig.savefig(paths["scaling"], dpi=120, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
    return paths
