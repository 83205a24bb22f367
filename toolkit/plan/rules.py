"""Named layout rules: each says which combination is illegal, why, and what would be valid.

`dstk estimate` and `dstk config` reject a layout that breaks any rule (exit 2, all violations in one line);
the planner uses the same rules to prune its search and to fill `rejected_because`. Rules that mirror a
DeepSpeed check quote the engine's behaviour in the docstring so they can be re-verified when DeepSpeed moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from toolkit.errors import UserError
from toolkit.plan import core_rules, fp8_support
from toolkit.plan.architectures import supporting
from toolkit.plan.cost.activations import runtime_flash_attention
from toolkit.plan.expert_rules import ep_clip_at_zero0, ep_divides, ep_needs_moe, native_moe_zero3
from toolkit.plan.layout import Layout, LayoutRequest, batch_arithmetic, data_parallel_size, default_precision
from toolkit.plan.recomputation import (
    early_stop_is_torch_checkpoint,
    early_stop_needs_full,
    early_stop_setting,
    megatron_recomputes_whole_layers,
    offload_activations_needs_full,
    op_recompute_is_torchtitan_fsdp,
    recompute_every_needs_full,
    recompute_every_runtime_only,
    recompute_modules_fit,
)
from toolkit.plan.sequence_parallel import (
    sp_architecture,
    sp_dense_data_parallel,
    sp_divides,
    sp_divides_accumulation,
)
from toolkit.plan.specs import LOW_PRECISION_GEMMS, ClusterSpec, ModelSpec

Check = Callable[[ModelSpec, ClusterSpec, LayoutRequest, int], "str | None"]


@dataclass(frozen=True)
class Rule:
    name: str
    check: Check
    scope: str = "layout"
    """"layout": no layout can break it and exist; "deepspeed": what dstk's DeepSpeed run path (HF models in
    the DeepSpeed engine) cannot run here, though another runtime (e.g. Megatron-DeepSpeed) might; "megatron":
    what Megatron-DeepSpeed (`--target megatron`) cannot run; "core": what only Megatron-Core runs (`--target
    megatron-core`); "megatron-core": what Megatron-Core cannot run as dstk configures it; "runs": what no
    runtime dstk configures can run (knobs `dstk estimate` prices for other stacks' published runs)."""


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
    if r.precision and r.precision not in LOW_PRECISION_GEMMS and not c.supports(r.precision):
        valid = ", ".join(p for p in ("bf16", "fp16", "fp32", *LOW_PRECISION_GEMMS) if c.supports(p))
        where = f"{c.accelerator} accelerators of cluster {c.name}"
        return f"--precision: {r.precision} is not supported on {where}; valid: {valid}"
    return None


def _onebit_needs_zero0(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """1-bit Adam and 0/1 Adam compress the whole-gradient all-reduce; ZeRO partitioning and pipeline stages
    replace that all-reduce with reduce-scatter / per-stage groups the compression cannot ride on
    (Tang et al. 2021 §4; DeepSpeed's original OnebitAdam asserted ZeRO stage 0)."""
    if r.optimizer != "adamw" and (r.zero_stage or r.pp > 1 or r.offload_optimizer != "none"):
        return f"--optimizer: {r.optimizer} needs ZeRO stage 0, no pipeline and no offload"
    return None


def _cluster_free(check: Callable[[ModelSpec, LayoutRequest, int], str | None]) -> Check:
    """A rule that reads no cluster, in the rule table's signature."""
    return lambda m, c, r, dp: check(m, r, dp)


def _zeropp_needs_zero3(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.zeropp and r.zero_stage != 3:
        return f"--zeropp: ZeRO++ works on ZeRO stage 3 (got stage {r.zero_stage})"
    return None


def _zeropp_needs_cuda(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """ZeRO++ quantizes with DeepSpeed's CUDA quantizer op; the CPU accelerator has no builder for it."""
    if r.zeropp and c.accelerator != "cuda":
        return f"--zeropp: ZeRO++'s quantization kernels need CUDA; cluster {c.name} is {c.accelerator}"
    return None


def _autotp_architecture(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.tp > 1 and not m.family.autotp:
        return (
            f"--tp: DeepSpeed AutoTP cannot shard {m.family_label} models (supported: "
            f"{', '.join(supporting('autotp'))}); use tp=1 with ZeRO, or Megatron-DeepSpeed (dstk config --megatron)"
        )
    return None


def _traced_runs_as_hf(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """A traced model (no family entry: toolkit/plan/traced.py) runs as transformers builds it: what dstk does
    to a model by its modules' names — moving sparse blocks into DeepSpeed's MoE layer for expert parallelism,
    converting linear layers to FP8, placing LoRA adapters — needs a family it knows."""
    if m.trace is None:
        return None
    asked = [
        f
        for f, on in (("--ep", r.ep > 1), ("--precision fp8", r.precision == "fp8"), ("--lora", r.lora))
        if on
    ]
    if not asked:
        return None
    return (
        f"{'/'.join(asked)}: {m.family_label} has no entry in dstk's family table, so it trains as transformers "
        "builds it (data parallelism, ZeRO 0-3, offload); expert parallelism, FP8 and LoRA need a family dstk "
        f"knows ({', '.join(supporting('native_moe'))} for --ep)"
    )


def _pipeline_architecture(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.pp > 1 and not m.family.pipeline:
        return f"--pp: dstk pipelines {', '.join(supporting('pipeline'))} models, not {m.family_label}"
    return None


def _pipeline_with_tp(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.pp > 1 and (r.tp > 1 or r.sp > 1 or r.ep > 1):
        return "--pp: dstk's HF pipeline runs with data parallelism only (tp=sp=ep=1); 3D layouts need Megatron-DeepSpeed"
    return None


def _lora_targets(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    from toolkit.errors import UserError
    from toolkit.plan.lora import parse_lora, targets

    if r.lora is None:
        return None
    try:
        targets(m, parse_lora(r.lora))
    except UserError as err:
        return str(err)
    return None


def _lora_data_parallel(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """dstk wraps the HF model with peft before `deepspeed.initialize`; AutoTP, the pipeline conversion and
    DeepSpeed-MoE replace modules peft has already wrapped, and the 1-bit optimizers are not wired for it."""
    if r.lora is None:
        return None
    if r.tp * r.pp * r.sp * r.ep > 1 or r.optimizer != "adamw":
        return (
            f"--lora: LoRA runs with data parallelism at any ZeRO stage and AdamW; got tp={r.tp}, pp={r.pp}, "
            f"sp={r.sp}, ep={r.ep}, optimizer={r.optimizer}"
        )
    return None


def _tp_sp_needs_tp(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.tp_sequence_parallel and r.tp == 1:
        return "--tp-sequence-parallel: sequence parallelism shards over the TP group; it needs --tp > 1"
    return None


def _tp_sp_needs_megatron(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """DeepSpeed's AutoTP shards linear layers only; Megatron's sequence parallelism is a Megatron feature."""
    if r.tp_sequence_parallel:
        return "--tp-sequence-parallel: DeepSpeed AutoTP has no Megatron sequence parallelism; use --target megatron"
    return None


def _hf_attention_is_the_runtime(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """dstk's DeepSpeed run path builds HF models with SDPA wherever transformers has it for the family and
    eager attention otherwise (`ModelFamily.attention_implementation`); `--flash-attention` cannot change that."""
    if r.flash_attention is None or r.flash_attention == m.family.sdpa:
        return None
    runs = (
        "SDPA's fused attention"
        if m.family.sdpa
        else "eager attention (transformers has no SDPA path for it)"
    )
    return (
        f"--{'' if r.flash_attention else 'no-'}flash-attention: HF {m.family_label} models in the DeepSpeed engine "
        f"run {runs}; the flag applies to --target megatron"
    )


def _virtual_stages_need_pp(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """An interleaved pipeline gives each of the p ranks v chunks of whole blocks (split evenly, earlier
    chunks taking the remainder, unless `--pipeline-layout` places them)."""
    if r.virtual_stages > 1 and (r.pp == 1 or m.n_layers < r.pp * r.virtual_stages):
        return (
            f"--virtual-stages: {r.virtual_stages} chunks per rank need --pp > 1 and at least one block each: "
            f"n_layers({m.n_layers}) ≥ pp({r.pp}) × virtual stages({r.virtual_stages})"
        )
    return None


def _fsdp_shards_as_zero(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """PyTorch FSDP's sharding strategies map onto ZeRO-2 (SHARD_GRAD_OP) and ZeRO-3 (FULL_SHARD)."""
    if r.fsdp is not None and r.zero_stage not in (2, 3):
        return f"--fsdp: PyTorch FSDP shards as ZeRO-2 (SHARD_GRAD_OP) or ZeRO-3 (FULL_SHARD), not ZeRO-{r.zero_stage}"
    return None


def _backward_prefetch_needs_fsdp(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """The backward prefetch policy is PyTorch FSDP's; DeepSpeed's ZeRO-3 prefetches by its own buckets."""
    if r.fsdp_backward_prefetch is not None and r.fsdp is None:
        return "--fsdp-backward-prefetch: PyTorch FSDP's backward_prefetch; give --fsdp with it"
    return None


def _pytorch_fsdp_only(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """PyTorch FSDP is a runtime dstk prices (published FSDP runs, `dstk estimate`) but does not configure."""
    if r.fsdp is not None:
        return "--fsdp: PyTorch FSDP's runtime; dstk configures DeepSpeed's ZeRO (and Megatron-DeepSpeed), not FSDP"
    return None


RULES: tuple[Rule, ...] = (
    Rule("tp_divides_heads", _tp_divides_heads),
    Rule("virtual_stages_need_pp", _virtual_stages_need_pp),
    Rule("pp_le_layers", _pp_le_layers),
    Rule("pipeline_needs_zero_le_1", _pipeline_zero),
    Rule("param_offload_needs_zero3", _param_offload_needs_zero3),
    Rule("optimizer_offload_needs_zero", _optimizer_offload_needs_zero),
    Rule("nvme_optimizer_needs_zero3", _nvme_optimizer_needs_zero3),
    Rule("nvme_needs_local_nvme", _nvme_present),
    Rule("offload_activations_needs_full_recompute", offload_activations_needs_full),
    Rule("precision_supported", _precision_supported),
    Rule("fp8_needs_hopper_or_ada", fp8_support.needs_fp8_tensor_cores),
    Rule("mxfp8_nvfp4_need_their_tensor_cores", fp8_support.needs_block_scaled_tensor_cores),
    Rule("onebit_needs_zero0", _onebit_needs_zero0),
    Rule("ep_needs_moe", ep_needs_moe),
    Rule("ep_divides_experts_and_dp", ep_divides),
    Rule("sp_divides_heads_and_seq", _cluster_free(sp_divides)),
    Rule("zeropp_needs_zero3", _zeropp_needs_zero3),
    Rule("tp_sequence_parallel_needs_tp", _tp_sp_needs_tp),
    Rule("zeropp_needs_cuda", _zeropp_needs_cuda),
    Rule("autotp_supports_architecture", _autotp_architecture, scope="deepspeed"),
    Rule("pipeline_supports_architecture", _pipeline_architecture, scope="deepspeed"),
    Rule("traced_model_runs_as_hf_builds_it", _traced_runs_as_hf, scope="deepspeed"),
    Rule("hf_pipeline_is_data_parallel_only", _pipeline_with_tp, scope="deepspeed"),
    Rule("native_moe_needs_zero_le_2", native_moe_zero3, scope="deepspeed"),
    Rule("expert_parallel_needs_zero_at_fp32", ep_clip_at_zero0, scope="deepspeed"),
    Rule("tp_sequence_parallel_needs_megatron", _tp_sp_needs_megatron, scope="deepspeed"),
    Rule("hf_attention_is_the_runtime", _hf_attention_is_the_runtime, scope="deepspeed"),
    Rule("megatron_core_runtime_only", core_rules.core_only, scope="core"),
    Rule("mxfp8_nvfp4_are_megatron_core_only", _cluster_free(fp8_support.estimate_only), scope="core"),
    Rule("pipeline_layout_fits", core_rules.layout_fits),
    Rule("etp_and_dispatcher_need_moe", core_rules.etp_needs_moe),
    Rule("ep_comm_overlap_needs", core_rules.ep_overlap_needs),
    Rule("fp8_scaling_needs_transformer_engine", core_rules.fp8_scaling_needs_te),
    Rule("megatron_core_runs_zero1_adamw", core_rules.core_runs, scope="megatron-core"),
    Rule("fsdp_shards_as_zero2_or_3", _fsdp_shards_as_zero),
    Rule("pytorch_fsdp_runtime_only", _pytorch_fsdp_only, scope="runs"),
    Rule("backward_prefetch_needs_fsdp", _backward_prefetch_needs_fsdp),
    Rule("recompute_every_needs_full", recompute_every_needs_full),
    Rule("recompute_modules_fit", recompute_modules_fit),
    Rule("op_recompute_is_torchtitan_fsdp", op_recompute_is_torchtitan_fsdp),
    Rule("recompute_every_runtime_only", recompute_every_runtime_only, scope="runs"),
    Rule("early_stop_needs_full_recompute", early_stop_needs_full),
    Rule("early_stop_is_torch_checkpoint", early_stop_is_torch_checkpoint, scope="deepspeed"),
    Rule("megatron_recomputes_whole_layers", megatron_recomputes_whole_layers, scope="megatron"),
    Rule("lora_targets_exist", _lora_targets),
    Rule("lora_is_data_parallel", _lora_data_parallel, scope="deepspeed"),
    Rule("fp8_converts_hf_linear_layers", _cluster_free(fp8_support.torchao_converts), scope="deepspeed"),
    Rule("fp8_fits_transformer_engine_layer", _cluster_free(fp8_support.te_layer_builds), scope="megatron"),
    Rule("sp_supports_architecture", _cluster_free(sp_architecture), scope="deepspeed"),
    Rule("sp_is_dense_data_parallel", _cluster_free(sp_dense_data_parallel), scope="deepspeed"),
    Rule("sp_divides_accumulation", _cluster_free(sp_divides_accumulation), scope="deepspeed"),
    Rule("megatron_core_kernels_are_fused", core_rules.core_kernels_fused, scope="megatron-core"),
)


def violations(
    model: ModelSpec,
    cluster: ClusterSpec,
    request: LayoutRequest,
    dp: int,
    scopes: tuple[str, ...] = ("layout",),
) -> list[str]:
    """Messages of every rule in `scopes` the request breaks (empty when legal)."""
    return [
        msg for rule in RULES if rule.scope in scopes and (msg := rule.check(model, cluster, request, dp))
    ]


def broken_rules(
    model: ModelSpec,
    cluster: ClusterSpec,
    request: LayoutRequest,
    dp: int,
    scopes: tuple[str, ...] = ("layout",),
) -> list[tuple[str, str]]:
    """(name, message) of the rules in `scopes` the request breaks (the planner's `rejected_because`)."""
    return [
        (rule.name, msg)
        for rule in RULES
        if rule.scope in scopes and (msg := rule.check(model, cluster, request, dp))
    ]


def resolve_layout(
    model: ModelSpec, cluster: ClusterSpec, request: LayoutRequest, scopes: tuple[str, ...] = ("layout",)
) -> Layout:
    """Fill a request's blanks and check it against every rule in `scopes` (see :class:`toolkit.plan.rules.Rule`);
    all violations are reported in one line."""
    world = cluster.world_size
    mp = request.tp * request.pp * request.sp
    if world % mp:
        raise UserError(
            f"--tp/--pp/--sp: world_size({world}) = nodes({cluster.nodes}) × gpus_per_node({cluster.gpus_per_node}) "
            f"is not divisible by tp({request.tp}) × pp({request.pp}) × sp({request.sp}) = {mp}"
        )
    dp = data_parallel_size(world, request.tp, request.pp, request.sp)
    problems = violations(model, cluster, request, dp, scopes)
    if problems:
        raise UserError("; ".join(problems))
    global_batch, accum = batch_arithmetic(
        request.micro_batch_size, dp, request.global_batch_size, request.gradient_accumulation_steps
    )
    fields = request.model_dump()
    megatron = ("megatron" in scopes or "megatron-core" in scopes) and "deepspeed" not in scopes
    fields["recompute_early_stop"] = early_stop_setting(
        request.recompute_early_stop, request.recompute, megatron
    )
    fields.update(
        flash_attention=runtime_flash_attention(
            model, request.flash_attention, request.fused_kernels, request.precision, request.fsdp is not None
        ),
        precision=request.precision or default_precision(cluster),
        dp=dp,
        world_size=world,
        global_batch_size=global_batch,
        gradient_accumulation_steps=accum,
    )
    return Layout(**fields)
