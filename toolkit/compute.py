"""Compute time of one micro-batch on one rank: GEMMs, memory-bound kernels, and the kernel-issue floor.

GEMMs run at `gpu_matmul_efficiency` of peak unless their arithmetic intensity puts them under the memory
roofline (Williams et al. 2009): time = max(FLOPs / (peak · eff), bytes / HBM bandwidth). Norms, activations,
residual adds and the softmax are memory-bound: their time is the bytes they read and write over the HBM
bandwidth (forward one pass, backward about two). A block can never run faster than the host can issue its
kernels (`kernel_launch_us` each), which is what bounds small models.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.params import ParamCount
from toolkit.specs import ClusterSpec, ModelSpec

# Kernels one block launches in forward (norms, QKV, attention, projection, residuals, MLP pieces); backward
# launches about twice as many. Counted from HF's GPT-2/Llama eager modules with fused SDPA attention.
KERNELS_PER_BLOCK_FORWARD = 16


@dataclass(frozen=True)
class StageCompute:
    """Seconds per micro-batch on one rank of one pipeline stage."""

    forward_s: float
    backward_s: float
    recompute_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def _gemm_s(m: float, k: float, n: float, e: int, peak: float, eff: float, hbm: float) -> float:
    """One GEMM (m×k)·(k×n): compute-bound at eff·peak or memory-bound on its operands and result."""
    return max(2 * m * k * n / (peak * eff), e * (m * k + k * n + m * n) / hbm)


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
) -> float:
    """Forward time of one block for `tokens` tokens on one rank (TP shards matrices, SP shards tokens)."""
    eff, hbm = cluster.gpu_matmul_efficiency, cluster.gpu_memory_gb_per_s * 1e9
    h, s = model.hidden_size, model.seq_length
    m = tokens / sp
    q_w, kv_w = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    t = _gemm_s(m, h, (q_w + 2 * kv_w) / tp, e, peak, eff, hbm) + _gemm_s(m, q_w / tp, h, e, peak, eff, hbm)
    # attention core QKᵀ and AV: 4·s·(a·d) FLOPs per token, heads split over TP and Ulysses SP
    t += 4 * m * s * q_w / tp / (peak * eff)
    if moe:
        routed = model.moe_top_k * model.moe_capacity_factor
        ffn, n_in = model.moe_ffn_hidden_size, (2 if model.gated_mlp else 1)
        t += _gemm_s(m * routed, h, n_in * ffn, e, peak, eff, hbm) + _gemm_s(
            m * routed, ffn, h, e, peak, eff, hbm
        )
        t += _gemm_s(m, h, model.num_experts, e, peak, eff, hbm)  # router
        ffn_tp = ffn * routed
    else:
        ffn, n_in = model.ffn_hidden_size, (2 if model.gated_mlp else 1)
        t += _gemm_s(m, h, n_in * ffn / tp, e, peak, eff, hbm) + _gemm_s(m, ffn / tp, h, e, peak, eff, hbm)
        ffn_tp = ffn / tp
    # memory-bound passes per token: 2 norms (read+write h), 2 residual adds (read 2h, write h),
    # activation (read+write ffn; gated: read 2·ffn, write ffn), softmax read+write unless fused (flash)
    replicated = 2 * 2 * h + 2 * 3 * h
    passes = (replicated / tp if sequence_parallel else replicated) + (3 if model.gated_mlp else 2) * ffn_tp
    if not flash:
        passes += 2 * model.n_heads * s / tp * (2 if model.dropout else 1)
    t += passes * e * m / hbm
    return max(t, KERNELS_PER_BLOCK_FORWARD * cluster.kernel_launch_us * 1e-6)


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
) -> StageCompute:
    """Forward, backward and recomputation seconds of one micro-batch on one rank of a pipeline stage.

    Backward costs two forwards (gradients w.r.t. inputs and weights; Narayanan et al. 2021, §3.1). The last
    stage adds the LM head (2·h·V FLOPs per token forward, vocabulary-parallel) and its softmax.
    """
    tokens = micro_batch * model.seq_length
    flash = recompute != "none"  # selective recomputation is what fused (flash) attention does
    common = dict(
        tokens=tokens, e=e, tp=tp, sp=sp, sequence_parallel=sequence_parallel, flash=flash, peak=peak
    )
    fwd = dense_layers * block_forward_s(model, pc, cluster, moe=False, **common)
    fwd += moe_layers * block_forward_s(model, pc, cluster, moe=True, **common)
    attention_fwd = (
        (dense_layers + moe_layers) * 4 * tokens / sp * model.seq_length * model.n_heads * model.head_dim
    )
    attention_fwd /= tp * peak * cluster.gpu_matmul_efficiency
    if last:
        eff, hbm = cluster.gpu_matmul_efficiency, cluster.gpu_memory_gb_per_s * 1e9
        fwd += _gemm_s(tokens / sp, model.hidden_size, model.vocab_size / tp, e, peak, eff, hbm)
        fwd += (e + 8) * tokens / sp * model.vocab_size / tp / hbm  # upcast + log-softmax of the logits
    recompute_s = fwd if recompute == "full" else attention_fwd if recompute == "selective" else 0.0
    return StageCompute(forward_s=fwd, backward_s=2 * fwd, recompute_s=recompute_s)
