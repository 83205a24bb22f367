"""Activation recomputation: how each runtime checkpoints a block, and the rules that say what a layout's
recomputation flags can mean.

Full recomputation keeps each block's input and replays its forward in backward. Runtimes differ in what the
replay runs: DeepSpeed's and Megatron's checkpoints are reentrant and replay the whole block; PyTorch's
non-reentrant checkpoint (HF transformers 5, FSDP's checkpoint wrapper) stops once the tensors backward needs
are back (Layout.recompute_stops_early; the cost side is toolkit.plan.cost.compute.early_stop_skips).
torchtitan's op-level policy (`--recompute ops`) saves chosen ops' outputs and replays the rest of each block.
"""

from __future__ import annotations

from toolkit.plan.layout import LayoutRequest
from toolkit.plan.specs import ClusterSpec, ModelSpec


def early_stop_setting(pinned: bool | None, recompute: str, megatron: bool) -> bool | None:
    """The `recompute_early_stop` a layout gets from a request: only full recomputation has one; the user's
    pin (one the target cannot run is refused by its rule, not dropped); else off for Megatron-DeepSpeed,
    whose reentrant checkpoint replays whole layers, fused kernels or not (megatron_recomputes_whole_layers);
    else unset, the runtime's default (Layout.recompute_stops_early). Shared by resolve_layout and the
    planner, which builds its candidates without it."""
    if recompute != "full":
        return None
    if pinned is not None:
        return pinned
    return False if megatron else None


def offload_activations_needs_full(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """cpu_checkpointing moves what `deepspeed.checkpointing.checkpoint` keeps: the block inputs of full
    recomputation; without it there is nothing to move."""
    if r.offload_activations and r.recompute != "full":
        return f"--offload-activations: needs --recompute full (got {r.recompute}); it offloads the checkpointed block inputs"
    return None


def recompute_every_needs_full(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Checkpointing every K-th block is a thinning of full recomputation."""
    if r.recompute_every is not None and r.recompute != "full":
        return f"--recompute-every: checkpoints every K-th block of --recompute full, not --recompute {r.recompute}"
    return None


def recompute_modules_fit(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """`--recompute-modules` refines selective recomputation, and each module must be in the model: latent
    attention for `mla_up_proj`, MoE layers for `moe_act`, shared experts for `shared_experts`."""
    if r.recompute_modules is None:
        return None
    if r.recompute != "selective":
        return f"--recompute-modules: what --recompute selective rebuilds; got --recompute {r.recompute}"
    names = r.recompute_modules.split(",")
    missing = {
        "mla_up_proj": m.kv_lora_rank is None and "multi-latent attention",
        "moe_act": not m.is_moe and "MoE layers",
        "shared_experts": not m.shared_expert_ffn_hidden_size and "shared experts",
    }
    for name in names:
        if missing.get(name):
            return f"--recompute-modules: {name} needs {missing[name]}, which {m.name} does not have"
    return None


def recompute_every_runtime_only(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Block-interval checkpointing is a runtime dstk prices (torchtitan, fms-fsdp) but does not configure."""
    if r.recompute_every is not None and r.recompute_every > 1:
        return "--recompute-every: torchtitan's and fms-fsdp's block-interval checkpointing; DeepSpeed and Megatron checkpoint every block"
    return None


def op_recompute_is_torchtitan_fsdp(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """`--recompute ops` is torchtitan's op-level selective checkpointing, priced as torchtitan applies it to
    a dense model's blocks under PyTorch FSDP (toolkit.plan.cost.activations.op_sac_matmuls), whose q, k and v
    projections are separate matmuls, as in torchtitan's models (a fused QKV, or LoRA's adapter matmuls, count
    differently). Its tensor-
    parallel collectives, MoE grouped GEMMs and pipeline stages fall under other parts of its policy, which
    dstk does not price; DeepSpeed's and Megatron's checkpoints have no op-level policy."""
    if r.recompute != "ops":
        return None
    if r.fsdp is None or r.tp > 1 or r.pp > 1 or r.lora or m.is_moe or m.family.fused_qkv:
        return (
            "--recompute ops: torchtitan's op-level selective checkpointing, priced with --fsdp for dense models "
            f"with separate q/k/v projections, without --tp, --pp or --lora (got fsdp={r.fsdp}, tp={r.tp}, "
            f"pp={r.pp}, lora={r.lora}, num_experts={m.num_experts}, architecture={m.family_label})"
        )
    return None


def early_stop_needs_full(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Early stop says how full recomputation's checkpoint ends a block; nothing else checkpoints blocks."""
    if r.recompute_early_stop is not None and r.recompute != "full":
        flag = "--recompute-early-stop" if r.recompute_early_stop else "--no-recompute-early-stop"
        return f"{flag}: says where --recompute full's checkpoint stops recomputing a block, not --recompute {r.recompute}"
    return None


def early_stop_is_torch_checkpoint(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """dstk train checkpoints pipeline stages (DeepSpeed's PipelineModule, `activation_checkpoint_interval`)
    and offloaded block inputs (`cpu_checkpointing`, read only by `deepspeed.checkpointing.checkpoint`) with
    DeepSpeed's reentrant checkpoint, which always recomputes the whole block; at ZeRO-3 its linear layers are
    DeepSpeed's LinearFunctionForZeroStage3, which torch's checkpoint cannot stop before."""
    if r.recompute_early_stop and (r.pp > 1 or r.offload_activations):
        why = "--pp" if r.pp > 1 else "--offload-activations"
        return (
            f"--recompute-early-stop: with {why} dstk train checkpoints through DeepSpeed's reentrant checkpoint, "
            "which recomputes whole blocks; drop the flag"
        )
    if r.recompute_early_stop and r.zero_stage == 3 and r.fsdp is None:
        return (
            "--recompute-early-stop: at ZeRO-3 DeepSpeed's zero.Init makes every linear layer an autograd.Function "
            "that saves after its GEMM (memory_efficient_linear), so whole blocks are recomputed; drop the flag"
        )
    return None


def megatron_recomputes_whole_layers(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    """Megatron-DeepSpeed checkpoints layers with its own reentrant CheckpointFunction
    (megatron/core/tensor_parallel/random.py) or DeepSpeed's: both replay the whole layer."""
    if r.recompute_early_stop:
        return "--recompute-early-stop: Megatron-DeepSpeed's checkpoint is reentrant and recomputes whole layers; drop the flag"
    return None
