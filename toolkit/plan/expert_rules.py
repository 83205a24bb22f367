"""The rules of expert parallelism (`--ep`): which layouts of a Mixture-of-Experts model exist, and which the
DeepSpeed engine can run. Named in `plan/rules.py`'s table like every rule."""

from __future__ import annotations

from toolkit.plan.layout import LayoutRequest
from toolkit.plan.specs import ClusterSpec, ModelSpec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ep_needs_moe(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.ep > 1 and not m.is_moe:
        return f"--ep: expert parallelism (ep={r.ep}) needs an MoE model; {m.name} has num_experts=0"
    return None


def ep_divides(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if not m.is_moe or r.ep == 1:
        return None
    if m.num_experts % r.ep:
        valid = _divisors(m.num_experts)
        return f"--ep: num_experts({m.num_experts}) must be divisible by ep({r.ep}); valid: {', '.join(map(str, valid))}"
    if r.etp is not None:
        # Megatron-Core's expert grid ETP × EP × EDP spans the same ranks as attention's TP × CP × DP
        # (megatron/core/parallel_state.py:871-885 @ d98e8a64: world % (ETP·EP·PP) == 0)
        ranks = r.tp * r.sp * dp
        if ranks % (r.etp * r.ep):
            return (
                f"--ep/--etp: etp({r.etp}) × ep({r.ep}) must divide the stage's tp({r.tp}) × sp({r.sp}) × "
                f"dp({dp}) = {ranks} ranks, over which Megatron-Core folds the experts"
            )
        return None
    if dp % r.ep:
        return (
            f"--ep: the data-parallel degree dp({dp}) must be divisible by ep({r.ep}) (DeepSpeed keeps experts "
            "inside the data-parallel ranks; Megatron-Core folds them over TP × CP × DP: --etp 1, --target megatron-core)"
        )
    return None


def native_moe_zero3(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """dstk's experts are DeepSpeed's own MoE layers — dense GPT-2/Llama made MoE, and HF's sparse blocks
    (Mixtral, ...) with expert parallelism — which the engine refuses at stage 3 ("Native DeepSpeed MoE is not
    supported with ZeRO Stage 3. Use AutoEP or choose ZeRO stage 1/2.", runtime/engine.py). An HF sparse block
    at ep = 1 stays HF's, a ZeRO-3 leaf module."""
    autoep = m.family.expert_parallel == "autoep"
    if m.is_moe and r.zero_stage == 3 and (not m.family.native_moe or (r.ep > 1 and not autoep)):
        what = (
            f"{m.family_label} with experts"
            if not m.family.native_moe
            else f"{m.family_label} with --ep {r.ep}"
        )
        return f"--zero-stage: DeepSpeed MoE layers ({what}) need ZeRO stage 1 or 2, not 3"
    return None


def ep_clip_at_zero0(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """At ZeRO-0 in fp32 DeepSpeed clips by `runtime/utils.py:clip_grad_norm_`, which averages the ranks' norms
    over the data-parallel group "due to the presence of moe params" (utils.py:413-419): with experts sharded
    over EP ranks that is not the norm of the whole gradient, and every clipped step differs from ep = 1
    (measured: 4.6e-4 in the loss after 6 SGD steps on a tiny DeepSeek-V3). The partitioned optimizers of
    ZeRO-1/2/3 compute the norm over expert and data-parallel groups correctly."""
    fp32 = (r.precision or "fp32") == "fp32"
    if r.ep > 1 and r.zero_stage == 0 and fp32:
        return "--ep: expert parallelism at ZeRO stage 0 in fp32 clips gradients by a wrong norm in DeepSpeed 0.19.8; use --zero-stage 1 or 2"
    return None
