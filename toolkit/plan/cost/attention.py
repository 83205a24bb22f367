"""The attention core of a block — the scores and their weighted sum, between activations — in time.

A table family's block has one core (its heads, one head width for q/k and v); multi-head latent attention's
q/k heads are wider than its v heads; a traced block has the cores its trace saw (toolkit/plan/traced.py).
Fused kernels (FlashAttention, SDPA) keep the scores on chip; materialized attention moves them through HBM.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.plan.specs import ClusterSpec, ModelSpec

MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti et al., §4.1)


@dataclass(frozen=True)
class Core:
    """One attention core of a block: heads, the q/k and v head widths, the keys a query sees (None: the whole
    sequence), whether it runs fused, and how many a block has (an average over a traced kind's blocks)."""

    heads: int
    qk: int
    v: int
    window: int | None = None
    fused: bool = True
    count: float = 1.0


def attention_cores(model: ModelSpec, moe: bool = False) -> tuple[Core, ...]:
    """The attention cores of a block: a table family's one (its windows are `flops.attended_keys`' per-layer
    concern), a traced kind's as the trace saw them."""
    if model.trace is not None:
        return tuple(
            Core(c.heads, c.qk_head_dim, c.v_head_dim, c.window, c.fused, c.count)
            for c in model.trace.kind(moe).attention
        )
    return (Core(model.n_heads, model.head_dim, model.head_dim),)


def attention_efficiency(cluster: ClusterSpec) -> float:
    return cluster.attention_efficiency or cluster.gpu_matmul_efficiency


def attention_core_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    m: float,
    e: int,
    tp: int,
    peak: float,
    flash: bool,
    moe: bool = False,
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
    way: within 0.95-1.08 of all ten runs). With q/k and v heads of different widths (multi-head latent
    attention) QKᵀ costs 2·s·a·d_qk and AV 2·s·a·d_v per token; a traced block sums its cores.
    """
    return sum(
        core.count
        * _core_s(model, cluster, m, e, core.heads / tp, core.qk, core.v, peak, flash and core.fused)
        for core in attention_cores(model, moe)
    )


def _core_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    m: float,
    e: int,
    heads: float,
    qk: float,
    v: float,
    peak: float,
    flash: bool,
) -> float:
    s = model.seq_length
    flops = 2 * m * s * heads * (qk + v)
    if flash:
        return flops / (peak * attention_efficiency(cluster))
    hbm = cluster.gpu_memory_gb_per_s * 1e9
    scores = m * s * heads  # elements: b·(a/t)·s² for m = b·s tokens
    bmm_bytes = e * (scores + m * heads * (qk + v))
    bmm = max(flops / 2 / (peak * cluster.gpu_matmul_efficiency), bmm_bytes / hbm)
    softmax = 2 * e * scores
    dropout = (2 * e + MASK_BYTES) * scores if model.dropout else 0.0
    return 2 * bmm + (softmax + dropout) / hbm
