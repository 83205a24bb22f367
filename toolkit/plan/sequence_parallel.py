"""DeepSpeed-Ulysses sequence parallelism's rules, kept apart because `dstk train` checks them again
(toolkit.parallel.ulysses): a config dstk did not write never met the planner's rules. They read no cluster.

Pure: the planner and `dstk plan` import this.
"""

from __future__ import annotations

from toolkit.errors import UserError
from toolkit.plan.architectures import supporting
from toolkit.plan.layout import LayoutRequest, batch_arithmetic
from toolkit.plan.specs import ModelSpec


def sp_divides(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """Ulysses scatters attention heads over the sequence-parallel group (Jacobs et al. 2023)."""
    if r.sp == 1:
        return None
    if (m.n_heads // r.tp) % r.sp or m.seq_length % r.sp:
        return (
            f"--sp: heads per TP rank ({m.n_heads // r.tp}) and seq_length({m.seq_length}) must be divisible "
            f"by sp({r.sp})"
        )
    kv = max(m.n_kv_heads // r.tp, 1)
    if kv % r.sp and r.sp % kv:
        # DeepSpeed's UlyssesSPAttentionHF splits the kv heads over the group or replicates them to it
        # (ulysses_sp.py: "KV attention head count ... is not divisible by SP size ... or vice versa")
        return f"--sp: kv heads per TP rank ({kv}) and sp({r.sp}) must divide one another"
    return None


def sp_architecture(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """DeepSpeed-Ulysses' HF path replaces transformers' SDPA attention function (it refuses eager attention,
    which needs a 4-D mask over the whole sequence) and hands back the heads merged; see the architecture
    table's `ulysses` for which families reshape that as it expects."""
    if r.sp > 1 and not m.family.ulysses:
        why = "its attention reshapes Ulysses' output wrongly" if m.family.sdpa else "no SDPA attention"
        return f"--sp: DeepSpeed-Ulysses runs {', '.join(supporting('ulysses'))} models, not {m.family_label} ({why})"
    return None


def sp_dense_data_parallel(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """What dstk's Ulysses path is verified with: dense models over data parallelism and ZeRO, AdamW. AutoTP and
    MoE groups beside the sequence-parallel mpu, and the 1-bit optimizers (which average over every rank), are
    not wired or tested with it."""
    if r.sp > 1 and (r.tp > 1 or m.is_moe or r.optimizer != "adamw"):
        return (
            f"--sp: dstk runs Ulysses for dense models with ZeRO and AdamW; got tp={r.tp}, "
            f"num_experts={m.num_experts}, optimizer={r.optimizer}"
        )
    return None


def sp_divides_accumulation(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """DeepSpeed's `UlyssesSPDataLoaderAdapter` gathers one micro-batch from every rank of a group and the whole
    group trains each in turn, so a data-parallel rank's micro-batches of a step come in groups of sp."""
    if r.sp == 1:
        return None
    try:
        _, accum = batch_arithmetic(
            r.micro_batch_size, dp, r.global_batch_size, r.gradient_accumulation_steps
        )
    except UserError:
        return None  # the batch arithmetic reports itself
    if accum % r.sp:
        return (
            f"--sp: gradient_accumulation_steps({accum}) must be a multiple of sp({r.sp}) (each rank of a "
            f"sequence-parallel group brings accum / sp micro-batches); use --global-batch "
            f"{r.micro_batch_size * dp * r.sp * max(1, accum // r.sp)}"
        )
    return None


ULYSSES_CHECKS = (sp_divides, sp_architecture, sp_dense_data_parallel, sp_divides_accumulation)


def ulysses_problems(model: ModelSpec, request: LayoutRequest, dp: int) -> list[str]:
    """Messages of the Ulysses rules `request` breaks: `dstk train` checks them again (toolkit.parallel.ulysses),
    since a config dstk did not write never met the planner's rules. They read no cluster."""
    return [msg for check in ULYSSES_CHECKS if (msg := check(model, request, dp))]
