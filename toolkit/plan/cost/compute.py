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

import math
from dataclasses import dataclass

from toolkit.plan.architectures import ACTIVATIONS
from toolkit.plan.cost.activations import MASK_BYTES
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
RMSNORM_EAGER_KERNELS = 8
ROTARY_EAGER_KERNELS = 5
ROTARY_EAGER_PASSES = 10


def rmsnorm_eager_passes(e: int) -> float:
    """Passes of h elements of `e` bytes that one HF eager RMSNorm makes per token (36h bytes in bf16, 28h in
    fp32), against 2 for a fused norm."""
    return (36 if e == 2 else 28) / e


def kernels_per_block(model: ModelSpec, fused: bool = True, flash: bool = True) -> int:
    """Kernels one block issues in forward; `fused=False` adds HF eager RMSNorm's and rotary's kernels,
    `flash=False` the materialized attention core's (QKᵀ, softmax, dropout, AV instead of one fused kernel)."""
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

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


# Output tiles cuBLAS runs large bf16/fp16 GEMMs with on Ampere/Hopper: the guide lists 256×128 and 128×256 as
# the most efficient, then 128×128 (NVIDIA, "Matrix Multiplication Background User's Guide" §2.3).
GEMM_TILES = ((256, 128), (128, 256), (128, 128))


def quantization_efficiency(m: float, n: float, sm_count: int) -> float:
    """Fraction of the GPU's tile slots an m×n GEMM output keeps busy, for the best of `GEMM_TILES`.

    Tile quantization: the last row/column of tiles is partly empty (m·n over the tiled area). Wave
    quantization: the tiles run in waves of `sm_count`, and the last wave is partly idle (tiles over
    waves·SMs). NVIDIA's guide §3.1-3.2 measures both on A100 (e.g. throughput peaks at N = 1536, 3072, ...
    for M = 2304: 108, 216, ... tiles of 256×128). Large training GEMMs sit near 1; a TP shard of a 1-2k
    hidden size or a short micro-batch loses 10-40 %.
    """
    if m <= 0 or n <= 0:
        return 1.0
    best = 0.0
    for bm, bn in GEMM_TILES:
        tm, tn = math.ceil(m / bm), math.ceil(n / bn)
        tiles = tm * tn
        waves = math.ceil(tiles / sm_count)
        best = max(best, (m * n) / (tm * bm * tn * bn) * tiles / (waves * sm_count))
    return best


def _gemm_s(m: float, k: float, n: float, e: int, peak: float, cluster: ClusterSpec) -> float:
    """One GEMM (m×k)·(k×n): compute-bound at the cluster's matmul efficiency of `peak` (less its tile and wave
    quantization where the SM count is known) or memory-bound on its operands and result."""
    eff = cluster.gpu_matmul_efficiency
    if cluster.gpu_sm_count:
        eff *= quantization_efficiency(m, n, cluster.gpu_sm_count)
    return max(
        2 * m * k * n / (peak * eff), e * (m * k + k * n + m * n) / (cluster.gpu_memory_gb_per_s * 1e9)
    )


def block_forward_s(
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
) -> float:
    """Forward time of one block for `tokens` tokens on one rank (TP shards matrices, SP shards tokens);
    `fused=False` prices HF's eager RMSNorm and rotary embedding op by op."""
    hbm = cluster.gpu_memory_gb_per_s * 1e9
    h = model.hidden_size
    m = tokens / sp
    q_w, kv_w = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    t = _gemm_s(m, h, (q_w + 2 * kv_w) / tp, e, peak, cluster) + _gemm_s(m, q_w / tp, h, e, peak, cluster)
    t += attention_core_s(model, cluster, m, e, tp, peak, flash)
    if moe:
        routed = model.moe_top_k * model.moe_capacity_factor
        ffn, n_in = model.moe_ffn_hidden_size, (2 if model.gated_mlp else 1)
        t += _gemm_s(m * routed, h, n_in * ffn, e, peak, cluster) + _gemm_s(
            m * routed, ffn, h, e, peak, cluster
        )
        t += _gemm_s(m, h, model.num_experts, e, peak, cluster)  # router
        ffn_tp = ffn * routed
        # Qwen2-MoE: a dense MLP beside the experts, and its gate
        shared = model.shared_expert_ffn_hidden_size
        if shared:
            t += _gemm_s(m, h, n_in * shared / tp, e, peak, cluster) + _gemm_s(
                m, shared / tp, h, e, peak, cluster
            )
            t += _gemm_s(m, h, 1, e, peak, cluster)
            ffn_tp += shared / tp
    else:
        ffn, n_in = model.ffn_hidden_size, (2 if model.gated_mlp else 1)
        t += _gemm_s(m, h, n_in * ffn / tp, e, peak, cluster) + _gemm_s(m, ffn / tp, h, e, peak, cluster)
        ffn_tp = ffn / tp
    # memory-bound passes per token: the norms (read+write h; 2, or Gemma's 4), 2 residual adds (read 2h,
    # write h), the activation's kernels (and the gate product)
    norm = 2 if fused or model.norm != "rmsnorm" else rmsnorm_eager_passes(e)
    replicated = model.family.norms_per_block * norm * h + 2 * 3 * h
    act = ACTIVATIONS[model.activation].passes + (3 if model.gated_mlp else 0)
    passes = (replicated / tp if sequence_parallel else replicated) + act * ffn_tp
    if not fused and model.position_embedding == "rope":
        passes += ROTARY_EAGER_PASSES * (q_w + kv_w) / tp
    t += passes * e * m / hbm
    issue = kernels_per_block(model, fused, flash) * cluster.kernel_launch_us * 1e-6
    return t + issue if cluster.accelerator == "cpu" else max(t, issue)


def attention_efficiency(cluster: ClusterSpec) -> float:
    return cluster.attention_efficiency or cluster.gpu_matmul_efficiency


def attention_core_s(
    model: ModelSpec, cluster: ClusterSpec, m: float, e: int, tp: int, peak: float, flash: bool
) -> float:
    """Forward seconds of one block's attention core (QKᵀ, softmax, AV) for `m` tokens on one rank (heads
    split over TP; Ulysses hands a rank m = tokens/sp tokens' worth of the same work).

    4·s·(a·d) FLOPs per token either way (no causal saving counted, the MFU convention). Fused (FlashAttention,
    SDPA) the scores stay on chip: the FLOPs at `attention_efficiency`. Materialized (Megatron-DeepSpeed's
    CoreAttention: `baddbmm`, FusedScaleMaskSoftmax, dropout, `bmm`; eager attention likewise) QKᵀ and AV are
    batched GEMMs, each at the roofline of its FLOPs and its bytes — QKᵀ reads q and k and writes the a·s
    scores per token, AV reads them and v and writes the output — and between them the softmax reads and
    writes the scores, and attention dropout reads them and writes the dropped copy and a byte mask. At 2k
    tokens on an A100 that makes a block of Narayanan et al.'s 1.7B GPT (24 heads of 96) 1.32× slower than
    with fused attention, and one of GPT-3 175B 1.05× (benchmarks/published_runs.py prices their Table 1 this
    way: within 0.95-1.08 of all ten runs).
    """
    s, heads, d = model.seq_length, model.n_heads / tp, model.head_dim
    flops = 4 * m * s * heads * d
    if flash:
        return flops / (peak * attention_efficiency(cluster))
    hbm = cluster.gpu_memory_gb_per_s * 1e9
    scores = m * s * heads  # elements: b·(a/t)·s² for m = b·s tokens
    bmm_bytes = e * (scores + 2 * m * heads * d)
    bmm = max(flops / 2 / (peak * cluster.gpu_matmul_efficiency), bmm_bytes / hbm)
    softmax = 2 * e * scores
    dropout = (2 * e + MASK_BYTES) * scores if model.dropout else 0.0
    return 2 * bmm + (softmax + dropout) / hbm


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
) -> StageCompute:
    """Forward, backward and recomputation seconds of one micro-batch on one rank of a pipeline stage.

    Backward costs two forwards (gradients w.r.t. inputs and weights; Narayanan et al. 2021, §3.1); one when
    the weights are `frozen` (LoRA: input gradients only, the rank-r adapters' own work is negligible). The
    last stage adds the LM head (2·h·V FLOPs per token forward, vocabulary-parallel) and its softmax.
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
    )
    fwd = dense_layers * block_forward_s(model, pc, cluster, moe=False, **common)
    fwd += moe_layers * block_forward_s(model, pc, cluster, moe=True, **common)
    attention_fwd = (dense_layers + moe_layers) * attention_core_s(
        model, cluster, tokens / sp, e, tp, peak, flash
    )
    if last:
        hbm = cluster.gpu_memory_gb_per_s * 1e9
        fwd += _gemm_s(tokens / sp, model.hidden_size, model.vocab_size / tp, e, peak, cluster)
        fwd += (e + 8) * tokens / sp * model.vocab_size / tp / hbm  # upcast + log-softmax of the logits
    recompute_s = fwd if recompute == "full" else attention_fwd if recompute == "selective" else 0.0
    return StageCompute(forward_s=fwd, backward_s=(1 if frozen else 2) * fwd, recompute_s=recompute_s)
