"""The charts of `dstk plan --report` (memory per GPU of the plan and its runner-ups; planned throughput over
node counts) and the choice of runner-ups they show. Rendering only: every figure comes from the plan, its
scaling rows (toolkit.plan.scaling, as the plan document holds them) and its alternatives; matplotlib is imported only to draw the PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


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


def write_charts(
    report: Path, bars: list[tuple[str, dict[str, float]]], usable_bytes: float, capacity_bytes: float,
    rows: list[dict[str, Any]],
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
    fitting = [r for r in rows if r["tokens_per_s"]]
    if fitting:
        paths["scaling"] = report.with_name(f"{report.stem}_scaling.png")
        fig, ax = plt.subplots(figsize=(7, 4))
        gpus = [r["gpus"] for r in fitting]
        ax.plot(gpus, [r["tokens_per_s"] for r in fitting], "o-", label="planned")
        ideal = fitting[0]["tokens_per_s"] / fitting[0]["gpus"]
        ax.plot(gpus, [ideal * g for g in gpus], ":", color="gray", label="linear from the smallest")
        for r in fitting:
            ax.annotate(
                f"{r['efficiency']:.0%}",
                (r["gpus"], r["tokens_per_s"]),
                textcoords="offset points",
                xytext=(4, -12),
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
