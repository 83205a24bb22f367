"""`dstk plan`'s answer on the terminal: the estimate table, the reasons, the comparison with the user's own
config, the recipe, the command that reproduces the numbers, and the optional elastic, training-cost and
scaling lines. Rendering only: every figure comes from the plan document (toolkit.integrations.plan_answer)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from toolkit.plan.units import format_bytes
from toolkit.report.render import print_estimate


def print_plan(
    result: Any, data: dict[str, Any], model_name: str, theirs: Any, config_path: Path | None
) -> None:
    print_estimate(result.best.estimate, title=f"Plan for {model_name}")
    print("\nWhy:")
    for line in result.explanation:
        print(f"  - {line}")
    if theirs is not None and config_path is not None:
        print(f"\n{comparison(config_path, theirs, result.best.estimate)}")
    print(f"\nOptimisation recipe: {data['recipe']}")
    print(f"\nReproduce: {shlex.join(data['estimate_command'])}")
    for line in extra_lines(data):
        print(line)


def extra_lines(data: dict[str, Any]) -> list[str]:
    """The elastic world sizes, the training cost and the scaling rows, when the plan has them."""
    out = []
    for s in data.get("elastic", []):
        if s["refused_because"] is None:
            out.append(
                f"  elastic world size {s['world_size']:>5}: {s['nodes']} × {s['gpus_per_node']}, micro "
                f"{s['micro_batch_size']}, accumulation {s['gradient_accumulation_steps']}, {s['tokens_per_s']:,.0f} tokens/s"
            )
        else:
            out.append(f"  elastic world size {s['world_size']:>5}: refused, {s['refused_because']}")
    if "training" in data:
        t = data["training"]
        how = "at --mfu" if t["time_source"] == "mfu" else "at the planned tokens/s"
        cost = f", cost {t['cost']:,.0f}" if t["cost"] is not None else ""
        out.append(
            f"Training {t['tokens']:.3g} tokens ({t['training_flops']:.3g} model FLOPs, (6·N + 12·L·H·Q·T)·D): "
            f"{t['days']:.1f} days {how} (MFU {t['mfu']:.1%}), {t['gpu_hours']:,.0f} GPU-hours, "
            f"{t['energy_kwh'] / 1000:,.1f} MWh (PUE {t['pue']:g}){cost}"
        )
    for r in data.get("scaling", []):
        if r["tokens_per_s"] is None:
            out.append(f"  scaling {r['nodes']:>5} nodes: {r['reason']}")
        else:
            out.append(
                f"  scaling {r['nodes']:>5} nodes: {r['tokens_per_s']:,.0f} tokens/s, efficiency "
                f"{r['efficiency']:.1%} ({r['layout']})"
            )
    return out


def comparison(path: Path, theirs: Any, ours: Any) -> str:
    """One paragraph: the user's config beside the plan, and what differs between them."""

    def said(e: Any) -> str:
        fits = "" if e.fits else " (does not fit)"
        # an MFU is a share of one precision's peak: name it, or fp32's 68 % reads as better than bf16's 62 %
        return (
            f"{format_bytes(e.memory.total, 1)} per GPU, {e.tokens_per_s:,.0f} tokens/s, MFU {e.mfu:.1%} of "
            f"the {e.layout.precision} peak{fits}"
        )

    mine, plan = theirs.layout.model_dump(), ours.layout.model_dump()
    changed = [f"{k} {mine[k]} → {plan[k]}" for k in mine if mine[k] != plan[k] and k != "dp"]
    speed = ours.tokens_per_s / theirs.tokens_per_s if theirs.tokens_per_s else float("inf")
    return (
        f"Your config ({path.name}): {theirs.layout.describe()}: {said(theirs)}.\n"
        f"dstk's plan: {ours.layout.describe()}: {said(ours)} ({speed:.2f}× the tokens/s); "
        + ("the same layout." if not changed else "it changes " + ", ".join(changed) + " (see Why).")
    )
