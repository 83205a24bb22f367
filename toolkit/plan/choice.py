"""Which layout the planner keeps, and the reasons it gives: candidates are ranked by predicted tokens/s, the
simplest within `NEAR_TIE` of the best wins, and the explanation sets it against the best layout that differs
in each searched dimension and, with fp8 weighed, against the best of the default precision.

`search` below is the planner's record of one search (`toolkit.plan.planner._Search`: `fitting`, `too_big`,
`usable`, `cluster`, `query`, `precisions`, `searched`, `rule_rejections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.plan.cost.estimate import Estimate
from toolkit.plan.cost.fp8 import TE_TENSORWISE
from toolkit.plan.cost.memory import Memory
from toolkit.plan.layout import Layout
from toolkit.plan.query import RECOMPUTE, SEARCHED
from toolkit.plan.specs import ClusterSpec, Precision
from toolkit.plan.units import format_bytes, format_tflops

NEAR_TIE = 0.02
"""Layouts within 2 % of the best predicted throughput count as ties; the simplest of them wins."""


def precision_reason(cluster: ClusterSpec, precision: Precision) -> str:
    """Why `default_precision` chose `precision` on this cluster, with the throughputs it compared."""

    def rate(p: Precision) -> str:
        return format_tflops(cluster.peak_flops(p))  # one unit in the sentence, however small

    if precision == "fp32":
        if cluster.supports("bf16"):
            slow = "emulated" if cluster.accelerator == "cpu" else "slower"
            return (
                f"fp32 because bf16 is {slow} on this {cluster.accelerator}: {rate('bf16')} bf16 vs "
                f"{rate('fp32')} fp32 per rank"
            )
        return f"fp32 because this {cluster.accelerator} has neither bf16 nor fp16 ({rate('fp32')} per rank)"
    if precision == "fp16":
        return (
            f"fp16 because this {cluster.accelerator} has no bf16 ({rate('fp16')} fp16 vs {rate('fp32')} fp32); "
            "DeepSpeed's dynamic loss scaling keeps it stable"
        )
    return f"bf16 ({rate('bf16')} vs {rate('fp32')} fp32 per rank, half the memory of fp32)"


@dataclass
class Candidate:
    """One layout the planner looked at, with its estimate (or memory only) and why it lost."""

    layout: Layout
    estimate: Estimate | None
    total_bytes: float
    rejected_because: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s if self.estimate else 0.0


def complexity(layout: Layout) -> tuple:
    """Sort key: fewer moving parts first (no offload, fewer model-parallel dimensions, lower ZeRO stage…)."""
    offload = (
        (layout.offload_optimizer != "none") + (layout.offload_param != "none") + layout.offload_activations
    )
    parallel = sum(x > 1 for x in (layout.tp, layout.pp, layout.sp, layout.ep))
    return (
        offload,
        layout.precision == "fp8",  # FP8 numerics only for a real gain
        layout.zeropp,
        parallel,
        layout.pp,
        layout.tp,
        layout.sp,
        layout.zero_stage,
        RECOMPUTE.index(layout.recompute),
        -layout.micro_batch_size,
    )


def pick(fitting: list[Candidate]) -> Candidate:
    top = max(c.tokens_per_s for c in fitting)
    ties = [c for c in fitting if c.tokens_per_s >= (1 - NEAR_TIE) * top]
    return min(ties, key=lambda c: complexity(c.layout))


def counterfactuals(best: Candidate, search: Any) -> list[tuple[str, Candidate]]:
    """For each dimension, the best layout that differs from the winner there (fitting, else smallest), in the
    winner's precision (fp8 against the default precision has a line of its own, `_precision_line`)."""
    out = []
    same = best.layout.precision
    fitting = [c for c in search.fitting if c.layout.precision == same]
    too_big = [c for c in search.too_big if c.layout.precision == same]
    for dim in SEARCHED:
        mine = getattr(best.layout, dim)
        others = [c for c in fitting if getattr(c.layout, dim) != mine]
        if others:
            alt = max(others, key=lambda c: c.tokens_per_s)
            loss = 1 - alt.tokens_per_s / best.tokens_per_s
            why = f"{loss:.1%} fewer tokens/s" if loss > 0 else "within the near-tie band but more complex"
            out.append((dim, Candidate(alt.layout, alt.estimate, alt.total_bytes, why)))
            continue
        big = [c for c in too_big if getattr(c.layout, dim) != mine]
        if big:
            alt = min(big, key=lambda c: c.total_bytes)
            out.append((dim, alt))
    return out


def _memory_line(mem: Memory, search: Any) -> str:
    """The peak per GPU against the usable memory, as parts that add up to it."""
    parts = [
        f"model states {format_bytes(mem.engine.device_bytes, 1)}",
        f"activations {format_bytes(mem.activations, 1)}",
        f"buffers {format_bytes(mem.buffers, 1)}",
        f"framework overhead {format_bytes(mem.framework_overhead, 1)}",
    ]
    if mem.step_transient_excess:
        parts.append(
            f"optimizer step above activations + buffers {format_bytes(mem.step_transient_excess, 1)}"
        )
    return (
        f"Memory per GPU {format_bytes(mem.total, 1)} of {format_bytes(search.usable, 1)} usable "
        f"({search.cluster.gpu_memory_gib:g} GiB less the safety margin): {' + '.join(parts)}."
    )


def explain(best: Candidate, alternatives: list[tuple[str, Candidate]], search: Any) -> list[str]:
    est = best.estimate
    assert est is not None
    mem, t = est.memory, est.time
    lines = [
        f"{best.layout.describe()}: {est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu:.1%}, step {t.total_s:.3g} s; "
        f"best of {len(search.fitting)} fitting layouts ({search.searched} estimated).",
        _memory_line(mem, search),
        f"Step time {t.total_s:.3g} s: compute {t.compute_s:.3g}, pipeline bubble {t.pipeline_bubble_s:.3g}, "
        f"TP/EP/SP/PP comm {t.model_parallel_comm_s:.3g}, exposed data-parallel comm {t.data_parallel_comm_s:.3g}, "
        f"optimizer {t.optimizer_s:.3g}, offload {t.offload_s:.3g}.",
    ]
    for dim, alt in alternatives:
        lines.append(
            f"{dim} = {getattr(alt.layout, dim)} instead: {alt.rejected_because} ({alt.layout.describe()})."
        )
    lines.append(_precision_line(best, search))
    margin = _margin_line(best, search)
    if margin:
        lines.append(margin)
    for name, msg in sorted(search.rule_rejections.items()):
        lines.append(f"Excluded by rule {name}: {msg}.")
    return lines


def _margin_line(best: Candidate, search: Any) -> str | None:
    """The fastest layout that fits the accelerator but not the safety margin, where it beats the winner by
    more than the near-tie band: its speed, its memory, and the `--memory-margin` that would keep it."""
    faster = [
        c for c in getattr(search, "margin_only", []) if c.tokens_per_s > (1 + NEAR_TIE) * best.tokens_per_s
    ]
    if not faster:
        return None
    alt = max(faster, key=lambda c: c.tokens_per_s)
    capacity = search.cluster.gpu_memory_gib * 2**30
    keeps = max(0.0, int((1 - alt.total_bytes / capacity) * 100) / 100)
    return (
        f"Dropped by the safety margin only: {alt.layout.describe()} would run {alt.tokens_per_s / best.tokens_per_s:.2f}× "
        f"as fast ({alt.tokens_per_s:,.0f} tokens/s) at {format_bytes(alt.total_bytes, 1)} of "
        f"{search.cluster.gpu_memory_gib:g} GiB per GPU, inside the accelerator but over the "
        f"{format_bytes(search.usable, 1)} the margin leaves; --memory-margin {keeps:.2f} keeps it (less room "
        "for fragmentation and transient peaks)."
    )


def _precision_line(best: Candidate, search: Any) -> str:
    """Why the winner's precision: as requested, the cluster's fastest, or — with fp8 weighed — the best fp8
    layout against the best of the default precision, in tokens/s and memory per GPU, with what else differs
    between them (the attention kernel; a layout the fp8 runtime cannot run)."""
    precision = best.layout.precision
    if search.query.precision is not None:
        return f"Precision {precision}: as requested."
    default = search.precisions[0]
    reason = f"Precision {precision_reason(search.cluster, default)}."
    if len(search.precisions) == 1:
        return reason
    by = {p: [c for c in search.fitting if c.layout.precision == p] for p in search.precisions}
    if not by["fp8"]:
        big = [c for c in search.too_big if c.layout.precision == "fp8"]
        if big:
            return f"{reason} No fp8 layout fits; the smallest {min(big, key=lambda c: c.total_bytes).rejected_because}."
        return f"{reason} No fp8 layout meets the rules (below)."
    if not by[default]:
        return f"Precision fp8: no layout fits in {default}."
    fp8, other = pick(by["fp8"]), pick(by[default])
    assert fp8.estimate is not None and other.estimate is not None
    recipe = fp8.layout.fp8_recipe
    runtime = f"Transformer Engine, {recipe} scaling" if recipe in TE_TENSORWISE else "torchao.float8"
    extra = fp8.estimate.memory.total - other.estimate.memory.total
    versus = (
        f"{fp8.tokens_per_s / other.tokens_per_s:.2f}× the tokens/s of the best {default} layout (step "
        f"{fp8.estimate.time.total_s:.3g} s against {other.estimate.time.total_s:.3g} s), "
        f"{format_bytes(abs(extra), 1)} {'more' if extra >= 0 else 'less'} per GPU"
    )
    if fp8.layout.flash_attention and not other.layout.flash_attention:
        versus += (
            f"; part of it is {runtime.split(',')[0]}'s fused attention, where the {default} layout runs "
            "unfused attention (--flash-attention prices it fused)"
        )
    if precision == "fp8":
        return (
            f"Precision fp8: {versus}; the linear layers' GEMMs run in FP8 ({runtime}), attention, norms and "
            "the LM head in bf16."
        )
    same = [c for c in by["fp8"] if _same_but_precision(c.layout, other.layout)]
    if not same:
        why = f"the {default} layout cannot run in fp8 here (it breaks a rule below or does not fit)"
    elif same[0].tokens_per_s < other.tokens_per_s:
        ratio = same[0].tokens_per_s / other.tokens_per_s
        why = f"in the {default} layout fp8 makes {ratio:.2f}×: the FP8 casts cost more than its faster GEMMs save"
    else:
        why = "it wins by less than the near-tie band, where the simpler precision stays"
    return f"{reason} fp8 weighed ({runtime}): {versus}; {why}."


def _same_but_precision(a: Layout, b: Layout) -> bool:
    """The same layout but for the precision (and the attention kernel that comes with it)."""
    skip = {"precision", "flash_attention"}
    return {k: v for k, v in a.model_dump().items() if k not in skip} == {
        k: v for k, v in b.model_dump().items() if k not in skip
    }
