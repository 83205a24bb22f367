"""Named layout rules: each says which combination is illegal, why, and what would be valid.

`dstk estimate` and `dstk config` reject a layout that breaks any rule (exit 2, all violations in one line);
the planner uses the same rules to prune its search and to fill `rejected_because`. Rules that mirror a
DeepSpeed check quote the engine's behaviour in the docstring so they can be re-verified when DeepSpeed moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from toolkit.layout import LayoutRequest
from toolkit.specs import ClusterSpec, ModelSpec

Check = Callable[[ModelSpec, ClusterSpec, LayoutRequest, int], "str | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    check: Check


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_divides_heads(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if m.n_heads % r.tp or m.n_kv_heads % r.tp:
        valid = _divisors(math.gcd(m.n_heads, m.n_kv_heads))
        return (
            f"--tp: n_heads({m.n_heads}) and n_kv_heads({m.n_kv_heads}) must be divisible by tp({r.tp}); "
            f"valid: {', '.join(map(str, valid))}"
        )
    return None


def _pp_le_layers(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.pp > m.n_layers:
        return f"--pp: pp({r.pp}) exceeds n_layers({m.n_layers}); each stage needs at least one block"
    return None


def _pipeline_zero(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """DeepSpeed's PipelineEngine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism", deepspeed/runtime/pipe/engine.py): gradients must stay whole across micro-batches."""
    if r.pp > 1 and r.zero_stage > 1:
        return f"--pp: pipeline parallelism (pp={r.pp}) works only with ZeRO stage 0 or 1, not {r.zero_stage}"
    return None


def _param_offload_needs_zero3(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.offload_param != "none" and r.zero_stage != 3:
        return f"--offload-param: parameter offload needs ZeRO stage 3 (got stage {r.zero_stage})"
    return None


def _optimizer_offload_needs_zero(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.offload_optimizer != "none" and r.zero_stage == 0:
        return "--offload-optimizer: optimizer offload needs ZeRO stage 1, 2 or 3 (got stage 0)"
    return None


def _nvme_optimizer_needs_zero3(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """NVMe optimizer swapping exists only in ZeRO-3's optimizer (ZeRO-Infinity); stages 1-2 offload to CPU."""
    if r.offload_optimizer == "nvme" and r.zero_stage != 3:
        return f"--offload-optimizer: nvme needs ZeRO stage 3 (got stage {r.zero_stage}); stages 1-2 offload to cpu"
    return None


def _nvme_present(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if "nvme" in (r.offload_optimizer, r.offload_param) and c.nvme_gib <= 0:
        return f"--offload-*: nvme offload needs local NVMe, but cluster {c.name} has nvme_gib=0"
    return None


def _precision_supported(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.precision and not c.supports(r.precision):
        valid = [p for p in ("bf16", "fp16", "fp32") if c.supports(p)]
        return (
            f"--precision: {r.precision} is not supported on {c.accelerator} accelerators of cluster {c.name}; "
            f"valid: {', '.join(valid)}"
        )
    return None


def _onebit_needs_zero0(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """1-bit Adam and 0/1 Adam compress the whole-gradient all-reduce; ZeRO partitioning and pipeline stages
    replace that all-reduce with reduce-scatter / per-stage groups the compression cannot ride on
    (Tang et al. 2021 §4; DeepSpeed's original OnebitAdam asserted ZeRO stage 0)."""
    if r.optimizer != "adamw" and (r.zero_stage or r.pp > 1 or r.offload_optimizer != "none"):
        return f"--optimizer: {r.optimizer} needs ZeRO stage 0, no pipeline and no offload"
    return None


def _ep_needs_moe(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.ep > 1 and not m.is_moe:
        return f"--ep: expert parallelism (ep={r.ep}) needs an MoE model; {m.name} has num_experts=0"
    return None


def _ep_divides(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if not m.is_moe or r.ep == 1:
        return None
    if m.num_experts % r.ep:
        valid = _divisors(m.num_experts)
        return f"--ep: num_experts({m.num_experts}) must be divisible by ep({r.ep}); valid: {', '.join(map(str, valid))}"
    if dp % r.ep:
        return f"--ep: the data-parallel degree dp({dp}) must be divisible by ep({r.ep})"
    return None


def _sp_divides(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Ulysses scatters attention heads over the sequence-parallel group (Jacobs et al. 2023)."""
    if r.sp == 1:
        return None
    if (m.n_heads // r.tp) % r.sp or m.seq_length % r.sp:
        return (
            f"--sp: heads per TP rank ({m.n_heads // r.tp}) and seq_length({m.seq_length}) must be divisible "
            f"by sp({r.sp})"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule("tp_divides_heads", _tp_divides_heads),
    Rule("pp_le_layers", _pp_le_layers),
    Rule("pipeline_needs_zero_le_1", _pipeline_zero),
    Rule("param_offload_needs_zero3", _param_offload_needs_zero3),
    Rule("optimizer_offload_needs_zero", _optimizer_offload_needs_zero),
    Rule("nvme_optimizer_needs_zero3", _nvme_optimizer_needs_zero3),
    Rule("nvme_needs_local_nvme", _nvme_present),
    Rule("precision_supported", _precision_supported),
    Rule("onebit_needs_zero0", _onebit_needs_zero0),
    Rule("ep_needs_moe", _ep_needs_moe),
    Rule("ep_divides_experts_and_dp", _ep_divides),
    Rule("sp_divides_heads_and_seq", _sp_divides),
)


def violations(model: ModelSpec, cluster: ClusterSpec, request: LayoutRequest, dp: int) -> list[str]:
    """Messages of every rule the request breaks (empty when legal)."""
    return [msg for rule in RULES if (msg := rule.check(model, cluster, request, dp))]


def broken_rules(model: ModelSpec, cluster: ClusterSpec, request: LayoutRequest, dp: int) -> list[str]:
    """Names of the rules the request breaks (the planner's `rejected_because`)."""
    return [rule.name for rule in RULES if rule.check(model, cluster, request, dp)]
