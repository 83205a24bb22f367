"""The shape checks of a model description (ModelSpec's validator), each failure one line naming the field, and
the gated MLP width Llama's recipe gives.

Standard library and the family table only: `dstk plan` imports this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.plan.architectures import ARCHITECTURES, TRACED

if TYPE_CHECKING:
    from toolkit.plan.specs import ModelSpec


def llama_ffn_hidden_size(hidden_size: int, multiple_of: int = 256) -> int:
    """SwiGLU width that keeps the MLP's parameters at 8h² (Llama: 2/3 · 4h, rounded up to `multiple_of`).

    Touvron et al. 2023 (LLaMA), §2.2 and the reference code's `FeedForward`.
    """
    inner = int(2 * 4 * hidden_size / 3)
    return multiple_of * ((inner + multiple_of - 1) // multiple_of)


def check_shape(spec: ModelSpec) -> None:
    """Raise ValueError (pydantic turns it into the description's one-line error) for a shape HF cannot build
    or dstk cannot count."""
    if (spec.architecture == TRACED.name) != (spec.trace is not None):
        raise ValueError(
            "architecture: traced is what dstk calls a model read off an HF config.json it has no table entry "
            "for; give the config.json (or its folder) as --model instead"
        )
    if spec.head_dim is None:
        raise ValueError(
            f"n_heads: hidden_size({spec.hidden_size}) is not divisible by n_heads({spec.n_heads}); "
            "give head_dim explicitly or a head count that divides hidden_size"
        )
    if spec.n_heads % spec.n_kv_heads:
        raise ValueError(
            f"n_kv_heads: n_heads({spec.n_heads}) must be a multiple of n_kv_heads({spec.n_kv_heads})"
        )
    if spec.num_experts == 1:
        raise ValueError("num_experts: 1 expert is a dense model; use 0 (dense) or >= 2")
    if spec.num_experts and spec.moe_top_k > spec.num_experts:
        raise ValueError(f"moe_top_k: {spec.moe_top_k} exceeds num_experts({spec.num_experts})")
    if spec.shared_expert_ffn_hidden_size and not (spec.family.shared_expert and spec.is_moe):
        raise ValueError(
            "shared_expert_ffn_hidden_size: only an MoE model of a family with a shared expert "
            f"({', '.join(n for n, f in ARCHITECTURES.items() if f.shared_expert)}) has one"
        )
    if spec.num_experts and spec.moe_layer_interval > spec.n_layers:
        raise ValueError(
            f"moe_layer_interval: {spec.moe_layer_interval} exceeds n_layers({spec.n_layers}); no block would be MoE"
        )
    latent = (spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim)
    if spec.family.latent_attention and (spec.kv_lora_rank is None or spec.qk_rope_head_dim is None):
        raise ValueError(
            f"kv_lora_rank: {spec.architecture} has multi-head latent attention; give kv_lora_rank and "
            "qk_rope_head_dim (DeepSeek-V3: 512 and 64)"
        )
    if not spec.family.latent_attention and any(x is not None for x in latent):
        raise ValueError(
            "kv_lora_rank: q_lora_rank, kv_lora_rank and qk_rope_head_dim describe multi-head latent attention, "
            f"which {spec.family_label} does not have"
        )
    if spec.qk_rope_head_dim is not None and spec.qk_rope_head_dim >= spec.head_dim:
        raise ValueError(
            f"qk_rope_head_dim: {spec.qk_rope_head_dim} must be less than head_dim({spec.head_dim}), the "
            "q/k head's nope + rope width"
        )
    if spec.first_dense_layers and spec.first_dense_layers >= spec.n_layers and spec.is_moe:
        raise ValueError(
            f"first_dense_layers: {spec.first_dense_layers} leaves none of n_layers({spec.n_layers}) MoE"
        )
    if spec.sliding_window is not None and not spec.family.local_attention:
        raise ValueError(
            f"sliding_window: HF's {spec.architecture} attends globally in every layer; local layers exist in "
            f"{', '.join(n for n, f in ARCHITECTURES.items() if f.local_attention)} models"
        )
    if spec.position_embedding == "learned" and spec.max_position_embeddings < spec.seq_length:
        raise ValueError(
            f"seq_length: {spec.seq_length} exceeds max_position_embeddings({spec.max_position_embeddings})"
        )
