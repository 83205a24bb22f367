"""A block's attention as linear maps: what the parameter count, the cost model and the Megatron arguments read.

Grouped-query attention (every table family but DeepSeek's): q, k and v projections (column-parallel under
tensor parallelism) and the output projection (row-parallel). Multi-head latent attention (DeepSeek-V2/V3,
Kimi K2; DeepSeek-AI 2024, "DeepSeek-V2", §2.1): the query through a low-rank down projection and its
RMSNorm, then up to every head's nope + rope width (or through one projection without `q_lora_rank`); keys
and values through one down projection to the `kv_lora_rank` latent plus a rope key shared by all heads, its
RMSNorm, then up to every head's nope key and value; the output from the value heads. Megatron-Core keeps the
two down projections whole on every tensor-parallel rank (`linear_q_down_proj`, `linear_kv_down_proj` are
built `parallel_mode="duplicated"` in megatron/core/transformer/multi_latent_attention.py) and splits the up
projections by columns and the output by rows, as for any attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolkit.plan.specs import ModelSpec


@dataclass(frozen=True)
class Map:
    """One linear map of the attention: (k × n), and how tensor parallelism splits it."""

    name: str
    k: int
    n: int
    split: Literal["column", "row", "replicated"]

    @property
    def params(self) -> int:
        return self.k * self.n


def attention_maps(spec: ModelSpec) -> tuple[Map, ...]:
    """The linear maps of one block's attention, in the order the HF module registers them (less Phi-3's
    fused q/k/v, which one map of width q + 2·kv stands for in `params`)."""
    h, heads, d, dv = spec.hidden_size, spec.n_heads, spec.head_dim, spec.v_width
    if spec.kv_lora_rank is None:
        q, kv = heads * d, spec.n_kv_heads * d
        return (
            Map("q_proj", h, q, "column"),
            Map("k_proj", h, kv, "column"),
            Map("v_proj", h, kv, "column"),
            Map("o_proj", q, h, "row"),
        )
    rope = spec.qk_rope_head_dim or 0
    if spec.q_lora_rank:
        queries = (
            Map("q_a_proj", h, spec.q_lora_rank, "replicated"),
            Map("q_b_proj", spec.q_lora_rank, heads * d, "column"),
        )
    else:
        queries = (Map("q_proj", h, heads * d, "column"),)
    return (
        *queries,
        Map("kv_a_proj_with_mqa", h, spec.kv_lora_rank + rope, "replicated"),
        Map("kv_b_proj", spec.kv_lora_rank, heads * (d - rope + dv), "column"),
        Map("o_proj", heads * dv, h, "row"),
    )


def latent_norm_params(spec: ModelSpec) -> int:
    """The RMSNorm weights of latent attention's low-rank paths (q_a_layernorm, kv_a_layernorm)."""
    if spec.kv_lora_rank is None:
        return 0
    return (spec.q_lora_rank or 0) + spec.kv_lora_rank


def qk_norm_params(spec: ModelSpec) -> int:
    """q/k RMSNorm weights of one block: per head (Qwen3, Gemma 3: 2·head_dim) or over the whole projection
    (OLMo 2: n_heads·d + n_kv_heads·d)."""
    if not spec.qk_norm:
        return 0
    if spec.family.qk_norm_full:
        return (spec.n_heads + spec.n_kv_heads) * spec.head_dim
    return 2 * spec.head_dim
