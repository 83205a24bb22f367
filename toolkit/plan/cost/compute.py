"""Compute time of one micro-batch on one rank: GEMMs, memory-bound kernels, and the kernel-issue floor.

GEMMs run at `gpu_matmul_efficiency` of peak unless their arithmetic intensity puts them under the memory
roofline (Williams et al. 2009): time = max(FLOPs / (peak · eff), bytes / HBM bandwidth). Norms, activations,
residual adds and the softmax are memory-bound: their time is the bytes they read and write over the HBM
bandwidth (forward one pass, backward about two), counted op by op as the HF modules run them (GPT-2's
`gelu_new` is eight elementwise kernels). Fused attention runs at its own `attention_efficiency`; attention
that materializes its scores (Megatron's CoreAttention, eager attention) also moves them through HBM.

Issuing kernels costs `kernel_launch_us` each. On a GPU the host issues asynchronously, so a block can never
run faster than its kernels can be issued (what bounds small models); on the CPU accelerator the same thread
issues and computes, so the per-op cost (dispatch plus autograd bookkeeping) adds to the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from toolkit.plan.architectures import ACTIVATIONS
from toolkit.plan.attention_maps import attention_maps
from toolkit.plan.cost.activations import op_sac_matmuls, torchao_linears
from toolkit.plan.cost.attention import attention_core_s
from toolkit.plan.cost.fp8 import CastTraffic, Fp8Gemms, Linear, cast_traffic
from toolkit.plan.cost.gemm import gemm_s, linear_s
from toolkit.plan.cost.moe import ExpertPlacement, permute_bytes, routed_copies
from toolkit.plan.cost.selective import mlp_act_passes, stage_replay_s
from toolkit.plan.cost.traced_blocks import traced_block_time, traced_linears
from toolkit.plan.params import ParamCount
from toolkit.plan.specs import ClusterSpec, ModelSpec

# Kernels one block launches in forward besides its activation function (norms, QKV, attention, projection,
# residuals, MLP matrices); backward launches about twice as many. Counted from HF's GPT-2/Llama eager modules
# with fused SDPA attention.
KERNELS_PER_BLOCK_FORWARD = 15

# The MLP activation's elementwise kernels and tensor passes come from `plan/architectures.py`'s ACTIVATIONS
# (gelu_new: pow, mul, add, mul, tanh, add, mul, mul — eight kernels, 18 passes). A gated MLP (SwiGLU, GeGLU)
# applies the activation to the gate and multiplies by the up projection: one more kernel, 3 more passes.


# HF's eager LlamaRMSNorm (and Qwen2/Mistral's copies): `x.to(fp32)`, `pow(2)`, `mean`, `+ eps`, `rsqrt`, `x *`,
# `.to(dtype)`, `weight *` — eight kernels where Megatron runs one fused kernel (LayerNorm in torch is already
# one). Bytes per token in units of h: read+write of each pass, 36h in bf16 (casts to and from fp32, three
# fp32 passes) and 28h in fp32 (no casts). HF's `apply_rotary_pos_emb`: `q·cos`, `rotate_half` (a negation
# and a concatenation), `·sin`, the sum — five kernels and ten passes of the tensor, for q and for k.
# transformers' modeling_llama.py (LlamaRMSNorm, apply_rotary_pos_emb), counted from the source.
MOE_KERNELS_ROUTING = 12
"""Kernels of Megatron-Core's MoE layer before its host sync, besides the dense block's MLP they replace: the
router GEMM, the score function, top-k and the probabilities' normalization (4), the auxiliary/z losses (4),
the token counts and their all-to-all (2), the permutation (2) — counted from TopKRouter.forward and
MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe @ d98e8a64)."""
MOE_KERNELS_AFTER_SYNC = 12
"""Kernels of Megatron-Core's MoE layer after its host sync, besides the experts' GEMMs: sorting the received
tokens by local expert (2), the activation (1), the unsort (2), the combine all-to-all and its bookkeeping (3),
the unpermutation and weighted sum (3), the output bias/residual (1) — counted from MoEAlltoAllTokenDispatcher
and MoELayer.forward (megatron/core/transformer/moe @ d98e8a64)."""
RMSNORM_EAGER_KERNELS = 8
ROTARY_EAGER_KERNELS = 5
ROTARY_EAGER_PASSES = 10


def rmsnorm_eager_passes(e: int) -> float:
    """Passes of h elements of `e` bytes that one HF eager RMSNorm makes per token (36h bytes in bf16, 28h in
    fp32), against 2 for a fused norm."""
    return (36 if e == 2 else 28) / e


def kernels_per_block(model: ModelSpec, fused: bool = True, flash: bool = True, moe: bool = False) -> float:
    """Kernels one block issues in forward; `fused=False` adds HF eager RMSNorm's and rotary's kernels,
    `flash=False` the materialized attention core's (QKᵀ, softmax, dropout, AV instead of one fused kernel). A
    traced model's are the ops its trace counted."""
    if model.trace is not None:
        return model.trace.kind(moe).kernels
    n = KERNELS_PER_BLOCK_FORWARD + ACTIVATIONS[model.activation].kernels + (1 if model.gated_mlp else 0)
    n += model.family.norms_per_block - 2  # Gemma's post-norms
    if not flash:
        n += 2 + (1 if model.dropout else 0)
    if not fused:
        if model.norm == "rmsnorm":
            n += model.family.norms_per_block * (RMSNORM_EAGER_KERNELS - 1)
        if model.position_embedding == "rope":
            n += 2 * ROTARY_EAGER_KERNELS
    return n


@dataclass(frozen=True)
class StageCompute:
    """Seconds per micro-batch on one rank of one pipeline stage."""

    forward_s: float
    backward_s: float
    recompute_s: float
    per_step_s: float = 0.0
    """Work done once per optimizer step, not per micro-batch (FP8 weight casts of Transformer Engine)."""

    @property
    def total_s(self) -> float:
        """Seconds per micro-batch (`per_step_s` is not in it)."""
        return self.forward_s + self.backward_s + self.recompute_s


def block_linears(
    model: ModelSpec,
    m: float,
    tp: int,
    moe: bool,
    ep: int = 1,
    hf_modules: bool = False,
    experts: ExpertPlacement | None = None,
) -> list[Linear]:
    """The linear layers of one block on one rank for `m` tokens (Ulysses' split already taken): QKV and the
    attention output, then the MLP's maps — or the routed experts' as a grouped GEMM over the num_experts /
    ep experts the rank holds, of the rows `experts` sends them (toolkit/plan/cost/moe.py; default: ep, every
    token of the rank) and ffn / ETP wide, and a shared expert's. Routers and the shared expert's scalar gate
    are not among them (n = experts or 1, priced in bf16 by `block_forward_s`). A traced model's are the
    GEMMs its trace saw against weights, routers included (`traced_linears`). Llama 4's HF block run as HF
    modules without expert parallelism (`hf_modules`, ep = 1) computes every expert on every token."""
    if model.trace is not None:
        return traced_linears(model, m, moe, ep)
    h = model.hidden_size
    if model.kv_lora_rank is not None:
        linears = latent_linears(model, m, tp)
    else:
        q_w, kv_w = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
        qkv, out = (q_w + 2 * kv_w) / tp, q_w / tp
        linears = [
            Linear(m, h, qkv, h * qkv, bool(model.attention_bias)),
            Linear(m, out, h, out * h, bool(model.attention_out_bias)),
        ]
    n_in, bias = (2 if model.gated_mlp else 1), bool(model.mlp_bias)
    if moe:
        p = experts or ExpertPlacement(ep=ep)
        rows = routed_rows(model, m, p, hf_modules)
        ffn, local = model.moe_ffn_hidden_size / p.etp, model.num_experts / p.ep
        grouped = dict(groups=local, in_flight=p.gemm_streams)
        linears += [
            Linear(rows, h, n_in * ffn, local * h * n_in * ffn, bias, **grouped),
            Linear(rows, ffn, h, local * ffn * h, bias, **grouped),
        ]
        shared = model.shared_expert_ffn_hidden_size / tp
        if shared:
            linears += [Linear(m, h, n_in * shared, h * n_in * shared), Linear(m, shared, h, shared * h)]
    else:
        ffn = model.ffn_hidden_size / tp
        linears += [Linear(m, h, n_in * ffn, h * n_in * ffn, bias), Linear(m, ffn, h, ffn * h, bias)]
    return linears


def routed_rows(model: ModelSpec, m: float, p: ExpertPlacement, hf_modules: bool = False) -> float:
    """Rows the rank's experts compute for `m` tokens under placement `p` (moe.expert_rows), every expert on
    every token for Llama 4's HF block without expert parallelism."""
    return m / p.token_split * routed_copies(model, hf_modules and p.ep == 1) * p.imbalance * p.etp


def latent_linears(model: ModelSpec, m: float, tp: int) -> list[Linear]:
    """Multi-head latent attention's linear layers on one TP rank (plan/attention_maps.py): the down
    projections whole, the up projections split by columns, the output by rows."""
    out = []
    for x in attention_maps(model):
        k = x.k / tp if x.split == "row" else x.k
        n = x.n / tp if x.split == "column" else x.n
        out.append(Linear(m, k, n, k * n))
    return out


@dataclass(frozen=True)
class BlockTime:
    """Seconds of one block for one micro-batch on one rank."""

    forward_s: float
    backward_s: float
    per_step_s: float = 0.0
    """FP8 weight casts done once per optimizer step (Transformer Engine's cached weights)."""
    op_sac_s: float = 0.0
    """The replay of torchtitan's op-level selective checkpointing in backward (`--recompute ops`): the
    matmuls its policy does not save, and every memory-bound op of the block (norms, rotary, the MLP's
    activation and gate product, residual adds, FP8 casts), for a dense block."""


def block_time(
    model: ModelSpec,
    pc: ParamCount,
    cluster: ClusterSpec,
    tokens: float,
    e: int,
    tp: int,
    sp: int,
    moe: bool,
    sequence_parallel: bool,
    flash: bool,
    peak: float,
    fused: bool = True,
    frozen: bool = False,
    ep: int = 1,
    fp8: Fp8Gemms | None = None,
    op_replay: bool = False,
    hf_modules: bool = False,
    experts: ExpertPlacement | None = None,
) -> BlockTime:
    """Forward and backward time of one block for `tokens` tokens on one rank (TP shards matrices, SP shards
    tokens); `fused=False` prices HF's eager RMSNorm and rotary embedding op by op. Backward is two forwards
    (gradients w.r.t. inputs and weights; Narayanan et al. 2021, §3.1), one when the weights are `frozen`
    (LoRA: input gradients only); with `fp8` the linear GEMMs run in FP8 and the casts of its recipe are added
    where they happen (toolkit/plan/cost/fp8.py); with `op_replay` also its replay under torchtitan's
    op-level checkpointing (`op_sac_s`, 0 otherwise)."""
    hbm = cluster.gpu_memory_gb_per_s * 1e9
    h = model.hidden_size
    m = tokens / sp
    p = experts or ExpertPlacement(ep=ep)
    linears = block_linears(model, m, tp, moe, ep, hf_modules, p)
    t = sum(linear_s(x, e, peak, cluster, fp8) for x in linears)
    t += attention_core_s(model, cluster, m, e, tp, peak, flash, moe)
    if model.trace is not None:
        return BlockTime(*traced_block_time(model, cluster, m, e, moe, t, frozen))
    if moe:
        t += gemm_s(m / p.token_split, h, model.num_experts, e, peak, cluster)  # router
        shared = model.shared_expert_ffn_hidden_size
        if shared and model.family.shared_expert_gate:
            t += gemm_s(m, h, 1, e, peak, cluster)  # Qwen2-MoE's shared expert's gate
        rows = routed_rows(model, m, p, hf_modules)
        ffn_tp = model.moe_ffn_hidden_size / p.etp * rows / m + shared / tp
        t += permute_bytes(model, m, p, e) / hbm  # sorting the routed copies by expert and back
    else:
        ffn_tp = model.ffn_hidden_size / tp
    # memory-bound passes per token: the norms (read+write h; 2, or Gemma's 4), 2 residual adds (read 2h,
    # write h), the activation's kernels (and the gate product)
    norm = 2 if fused or model.norm != "rmsnorm" else rmsnorm_eager_passes(e)
    replicated = model.family.norms_per_block * norm * h + 2 * 3 * h
    act = mlp_act_passes(model)
    passes = (replicated / tp if sequence_parallel else replicated) + act * ffn_tp
    if not fused and model.position_embedding == "rope":
        rope = model.qk_rope_head_dim or model.head_dim  # latent attention rotates its rope part only
        passes += ROTARY_EAGER_PASSES * (model.n_heads + model.n_kv_heads) * rope / tp
    elementwise = passes * e * m / hbm
    t += elementwise
    kernels = kernels_per_block(model, fused, flash, moe)
    if moe and model.trace is None:
        kernels += moe_kernels(model, p, fp8 is not None)
    issue = kernels * cluster.kernel_launch_us * 1e-6
    casts = cast_traffic(linears, e, fp8.recipe, fp8.compiled) if fp8 else CastTraffic(0, 0, 0, 0)
    launch = cluster.kernel_launch_us * 1e-6
    f_work, f_issue = t + casts.forward_bytes / hbm, issue + casts.forward_kernels * launch
    times = 1 if frozen else 2
    b_work, b_issue = times * t + casts.backward_bytes / hbm, times * issue + casts.backward_kernels * launch
    per_step = casts.per_step_bytes / hbm
    cpu = cluster.accelerator == "cpu"  # the same thread issues and computes
    replay = 0.0
    if op_replay:
        float8 = torchao_linears(fp8.recipe, fp8.compiled) if fp8 else None
        _, replayed = op_sac_matmuls(model, tp, float8)
        sac = sum(linear_s(Linear(m, k, n, k * n), e, peak, cluster, fp8) for k, n in replayed)
        sac += elementwise + casts.forward_bytes / hbm
        replay = sac + f_issue if cpu else max(sac, f_issue)
    if cpu:
        return BlockTime(f_work + f_issue, b_work + b_issue, per_step, replay)
    # a dropless MoE layer syncs its token counts to the host in forward: the host cannot queue past that point,
    # so the layer pays the issue of its first kernel after it on top (module docstring of moe_kernels)
    stall = cluster.kernel_launch_us * 1e-6 if moe else 0.0
    return BlockTime(max(f_work, f_issue) + stall, max(b_work, b_issue), per_step, replay)


def moe_kernels(model: ModelSpec, p: ExpertPlacement, fp8: bool) -> float:
    """Kernels an MoE block's forward issues beyond a dense block's, as Megatron-Core's MoE layer runs them
    (megatron/core/transformer/moe @ d98e8a64, Transformer Engine's GroupedLinear): the router and its routing
    (MOE_KERNELS_ROUTING), the permutation and the exchange of counts before the host sync, the dispatch,
    sort by local expert, activation, unsort, combine and unpermutation after it (MOE_KERNELS_AFTER_SYNC), and
    per local expert one GEMM per linear layer — GroupedLinear issues the experts' GEMMs as separate cuBLAS
    calls — with, in FP8, a quantization of each expert's input too. Dropless routing sizes those GEMMs on the
    host (`m_splits`, a Python list; HF's expert loop indexes by `nonzero`): each layer's forward copies its
    counts to the host, and the host cannot queue the rest of the layer before they arrive. The layer then
    runs as fast as the slower of its GPU work and the host's issue of all of it (the issue floor), the
    backward (which reuses the counts) as a dense block's."""
    per_expert = 2 * (2 if fp8 else 1)
    return MOE_KERNELS_ROUTING + MOE_KERNELS_AFTER_SYNC + per_expert * model.num_experts / p.ep


def early_stop_skips(
    model: ModelSpec, lora: str | None = None, fp8_recipe: str | None = None, compiled: bool = False
) -> bool:
    """Whether a non-reentrant checkpoint that stops early (Layout.recompute_stops_early) leaves a dense
    block's last linear layer out of its recomputation. Autograd saves an op's inputs before it runs the
    kernel, and the pack hook that receives the forward's last saved tensor stops the recomputation there
    (torch.utils.checkpoint, `_StopRecomputationError`): in a pre-norm block that is the down projection's
    input, so its GEMM (and a TP all-reduce after it) never runs again; the residual add after it saves
    nothing. Not where something after that GEMM saves a tensor: hidden dropout (its mask), a LoRA adapter on
    the down projection (`lora`'s targets; its adapter saves its input after the base GEMM ran), or a linear
    layer that is an autograd.Function, whose tensors are saved after its forward (and its GEMM) returns:
    torchao's Float8Linear in eager mode (the "tensorwise" recipe dstk train runs), and DeepSpeed ZeRO-3's
    memory-efficient linear (Layout.recompute_stops_early resolves ZeRO-3 to whole blocks). A torch.compile'd
    block (torchtitan's `--fused-kernels` rows, Float8 included) is assumed to stop early too, not measured:
    its backward graph recomputes only what it needs, which the down projection's output is not.
    tests/test_recompute_early_stop.py counts the GEMMs of HF models' backward, with torch's, DeepSpeed's,
    torchao's and peft's LoRA linear layers, to check this."""
    if model.trace is not None or model.dropout or (fp8_recipe == "tensorwise" and not compiled):
        return False  # a traced block's last op is not known to be its down projection: whole blocks
    if lora is None:
        return True
    from toolkit.plan.lora import block_linears as lora_linears
    from toolkit.plan.lora import parse_lora, targets

    down = (model.ffn_hidden_size, model.hidden_size)
    adapted = set(targets(model, parse_lora(lora)))
    return not any(down in shapes for name, shapes in lora_linears(model).items() if name in adapted)


def stage_compute(
    model: ModelSpec,
    pc: ParamCount,
    cluster: ClusterSpec,
    *,
    micro_batch: int,
    e: int,
    tp: int,
    sp: int,
    dense_layers: int,
    moe_layers: int,
    last: bool,
    recompute: str,
    sequence_parallel: bool,
    peak: float,
    frozen: bool = False,
    fused_kernels: bool = True,
    flash: bool = False,
    ep: int = 1,
    fp8: Fp8Gemms | None = None,
    recompute_every: int = 1,
    early_stop: bool = False,
    hf_modules: bool = False,
    experts: ExpertPlacement | None = None,
    mtp: int = 0,
    modules: frozenset[str] = frozenset({"core_attn"}),
) -> StageCompute:
    """Forward, backward and recomputation seconds of one micro-batch on one rank of a pipeline stage.

    Blocks by `block_time`; the last stage adds the LM head (2·h·V FLOPs per token forward, vocabulary-parallel,
    in the training precision even in fp8) and its softmax, whose backward is two forwards (one `frozen`).
    Full recomputation repeats the forward of the blocks, not the LM head: every runtime checkpoints block by
    block (Megatron's `--recompute-granularity full` the transformer layers, HF's gradient checkpointing each
    decoder layer, llm-foundry's `activation_checkpointing_fn` each MPTBlock, DeepSpeed's checkpointing the
    layers it wraps), and Narayanan et al. 2021's hardware-FLOPs formula (eq. 3) counts the logit layer three
    times, not four. Selective repeats the attention core, or what Megatron-Core's `modules` name
    (`selective_replay_s`); full with `recompute_every` K > 1 repeats the
    forward of the stage's blocks whose count is a multiple of K (blocks // K of them); torchtitan's op-level
    policy (`ops`) replays what it does not save (BlockTime.op_sac_s). With `early_stop`
    (the layout's checkpoint stops early and `early_stop_skips` says it can stop before the down projection)
    the dense blocks' last linear layer is not recomputed. A stage holding `mtp` multi-token-prediction
    layers (with the loss) runs, for each, a block of the last block's kind, the 2h → h projection of its
    concatenated inputs and the LM head again (DeepSeek-V3 report §2.2; Megatron-Core's MultiTokenPredictionLayer).
    """
    tokens = micro_batch * model.seq_length
    common = dict(
        tokens=tokens,
        e=e,
        tp=tp,
        sp=sp,
        sequence_parallel=sequence_parallel,
        flash=flash,
        peak=peak,
        fused=fused_kernels,
        frozen=frozen,
        ep=ep,
        fp8=fp8,
        hf_modules=hf_modules,
        experts=experts,
    )
    fwd = bwd = per_step = op_sac = 0.0
    last_moe = model.moe_layer(model.n_layers - 1)
    dense_layers, moe_layers = dense_layers + (0 if last_moe else mtp), moe_layers + (mtp if last_moe else 0)
    for count, moe in ((dense_layers, False), (moe_layers, True)):
        if count:
            block = block_time(
                model, pc, cluster, moe=moe, op_replay=recompute == "ops" and not moe, **common
            )
            fwd, bwd = fwd + count * block.forward_s, bwd + count * block.backward_s
            per_step += count * block.per_step_s
            op_sac += count * block.op_sac_s
    if last:
        hbm = cluster.gpu_memory_gb_per_s * 1e9
        head = gemm_s(tokens / sp, model.hidden_size, model.vocab_size / tp, e, peak, cluster)
        head += (e + 8) * tokens / sp * model.vocab_size / tp / hbm  # upcast + log-softmax of the logits
        h = model.hidden_size
        head *= 1 + mtp  # each MTP layer's own logits through the shared head
        head += mtp * gemm_s(tokens / sp, 2 * h, h / tp, e, peak, cluster)  # its projection
        fwd, bwd = fwd + head, bwd + (1 if frozen else 2) * head
    blocks = dense_layers + moe_layers
    blocks_fwd = fwd - (head if last else 0.0)
    if early_stop and recompute == "full" and dense_layers:
        tail = block_linears(model, tokens / sp, tp, False, ep)[-1]
        blocks_fwd -= dense_layers * linear_s(tail, e, peak, cluster, fp8)
    layers = {False: dense_layers, True: moe_layers}
    selective = stage_replay_s(model, cluster, modules, tokens / sp, e, tp, peak, flash, fp8, experts, layers)
    recompute_s = {"full": blocks_fwd, "selective": selective, "ops": op_sac}.get(recompute, 0.0)
    if recompute == "full" and recompute_every > 1 and blocks:
        recompute_s = blocks_fwd * (blocks // recompute_every) / blocks
    return StageCompute(forward_s=fwd, backward_s=bwd, recompute_s=recompute_s, per_step_s=per_step)


def slowed_by_collectives(
    model: ModelSpec,
    pc: ParamCount,
    cluster: ClusterSpec,
    stage: dict[str, Any],
    peak: float,
    fp8: Fp8Gemms | None,
    total_s: float,
    held: int | None = None,
) -> float:
    """How much slower a micro-batch of `stage` (stage_compute's keywords; `total_s` its time alone) computes
    while a collective runs beside it: NCCL's kernel holds `collective_sm_count` SMs (one CTA per channel; or
    `held`, what another communication kernel holds: DeepEP's), so the GEMMs and attention run on the rest — at
    their share of the peak and with the rest's wave quantization (a GEMM sized for 132 SMs in one wave needs
    two on 108). 1 where the cluster does not say what NCCL holds (the A100 and CPU presets)."""
    held, sms = held or cluster.collective_sm_count, cluster.gpu_sm_count
    if not held or not sms or held >= sms or cluster.accelerator == "cpu" or total_s <= 0:
        return 1.0
    share = (sms - held) / sms
    rest = cluster.model_copy(update={"gpu_sm_count": sms - held})
    fp8_rest = None if fp8 is None else replace(fp8, peak=fp8.peak * share)
    return stage_compute(model, pc, rest, **stage, peak=peak * share, fp8=fp8_rest).total_s / total_s
