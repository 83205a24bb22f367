"""Each family's HF config keys beyond the Llama-style shape: one reader and one writer per family.

A reader turns a `config.json` (its keys, with the HF config class's defaults for keys it leaves out) into
ModelSpec fields; a writer turns a spec back into config kwargs that build the model it describes
(`AutoConfig.for_model`). `plan/hf_config.py` handles the shape every Llama-style family shares and calls
these by family name. Defaults are the transformers 5.x config classes' (Qwen2MoeConfig, Qwen3MoeConfig,
Qwen3Config, Olmo2Config, Phi3Config, Gemma2Config, Gemma3TextConfig, DeepseekV2Config, DeepseekV3Config,
Glm4MoeConfig, GptOssConfig, Llama4TextConfig); the fine-grained MoE families' are in `hf_keys_moe.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkit.errors import UserError

Reader = Callable[[dict[str, Any]], dict[str, Any]]
Writer = Callable[[Any], dict[str, Any]]

_QWEN_MOE_DEFAULTS = {
    "qwen2_moe": dict(
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
    ),
    "qwen3_moe": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
}
_LOCAL_TYPES = ("sliding_attention", "chunked_attention")


def given(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {**defaults, **{k: v for k, v in data.items() if v is not None}}


def layer_pattern(types: list[str], key: str = "layer_types") -> int:
    """The k of "every k-th layer global, the others local" that an explicit `layer_types` list follows
    (transformers 5 writes the list), or a one-line refusal of a list that follows no such pattern; 0 when
    every layer is local."""
    full = [i for i, t in enumerate(types) if t not in _LOCAL_TYPES]
    if not full:
        return 0
    k = full[0] + 1
    if [t not in _LOCAL_TYPES for t in types] != [(i + 1) % k == 0 for i in range(len(types))]:
        raise UserError(f"{key}: {types} is not one global layer every k; dstk models such a pattern")
    return k


def layer_types(spec: Any, local: str = "sliding_attention") -> list[str]:
    """The `layer_types` list a spec's local layers and pattern write (every layer global without a window)."""
    k = spec.sliding_window_pattern
    windowed = spec.sliding_window is not None
    return [local if windowed and (k == 0 or (i + 1) % k) else "full_attention" for i in range(spec.n_layers)]


def windowed(data: dict[str, Any], window: int | None, pattern: int) -> dict[str, Any]:
    """A local window and its pattern, the config's `layer_types` taking precedence over the class default."""
    types = data.get("layer_types")
    return dict(sliding_window=window, sliding_window_pattern=layer_pattern(types) if types else pattern)


def _qwen_moe(model_type: str) -> Reader:
    def read(data: dict[str, Any]) -> dict[str, Any]:
        """Qwen2-MoE / Qwen3-MoE: a block is sparse when `(i + 1) % decoder_sparse_step == 0` and i is not in
        `mlp_only_layers` (modeling_qwen2_moe.py Qwen2MoeDecoderLayer); explicit dense layers are refused
        rather than miscounted."""
        d = given(data, _QWEN_MOE_DEFAULTS[model_type])
        if d.get("mlp_only_layers"):
            raise UserError(
                f"mlp_only_layers: {d['mlp_only_layers']} is not supported; dstk models every "
                "decoder_sparse_step-th block as sparse (give an empty list)"
            )
        spec: dict[str, Any] = dict(
            # transformers 5 writes `num_local_experts` (its attribute map's name); the hub's files num_experts
            num_experts=d.get("num_local_experts", d["num_experts"]),
            moe_top_k=d["num_experts_per_tok"],
            moe_ffn_hidden_size=d["moe_intermediate_size"],
            moe_layer_interval=d.get("decoder_sparse_step", 1),
            moe_renormalize=d.get("norm_topk_prob", False),
        )
        if model_type == "qwen2_moe":
            spec["attention_bias"] = d.get("qkv_bias", True)
            spec["shared_expert_ffn_hidden_size"] = d["shared_expert_intermediate_size"]
        else:
            spec["attention_bias"] = d.get("attention_bias", False)
        return spec

    return read


def _write_qwen_moe(spec: Any) -> dict[str, Any]:
    return dict(
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.moe_top_k,
        moe_intermediate_size=spec.moe_ffn_hidden_size,
        decoder_sparse_step=spec.moe_layer_interval,
        norm_topk_prob=spec.moe_renormalize,
    )


def _write_qwen2_moe(spec: Any) -> dict[str, Any]:
    return dict(
        _write_qwen_moe(spec),
        qkv_bias=spec.attention_bias,
        shared_expert_intermediate_size=spec.shared_expert_ffn_hidden_size,
    )


def _write_qwen3_moe(spec: Any) -> dict[str, Any]:
    return dict(_write_qwen_moe(spec), attention_bias=spec.attention_bias)


def _read_mixtral(data: dict[str, Any]) -> dict[str, Any]:
    return dict(
        attention_bias=data.get("attention_bias", False),
        mlp_bias=data.get("mlp_bias", False),
        num_experts=data.get("num_local_experts", 8),
        moe_top_k=data.get("num_experts_per_tok", 2),
    )


def _read_llama(data: dict[str, Any]) -> dict[str, Any]:
    return dict(attention_bias=data.get("attention_bias", False), mlp_bias=data.get("mlp_bias", False))


def _write_llama(spec: Any) -> dict[str, Any]:
    cfg = dict(attention_bias=spec.attention_bias, mlp_bias=spec.mlp_bias)
    if spec.is_moe:
        cfg.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.moe_top_k)
    return cfg


def _read_gemma3(data: dict[str, Any]) -> dict[str, Any]:
    """Gemma3TextConfig's keys beyond the shape: tanh-GeLU, a tied head, local layers of `sliding_window` keys
    with every `sliding_window_pattern`-th layer global, or the explicit `layer_types` list transformers 5
    writes (which must follow such a pattern)."""
    if data.get("use_bidirectional_attention"):
        raise UserError(
            "use_bidirectional_attention: true is an encoder (EmbeddingGemma); dstk trains causal LMs"
        )
    return dict(
        activation=data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh",
        tied_embeddings=data.get("tie_word_embeddings", True),
        attention_bias=data.get("attention_bias", False),
        **windowed(data, data.get("sliding_window", 4096), data.get("sliding_window_pattern", 6)),
    )


def _read_gemma2(data: dict[str, Any]) -> dict[str, Any]:
    """Gemma2Config: Gemma 3's block without q/k norms; local and global layers alternate (its logit
    soft-capping changes no size)."""
    return dict(
        activation=data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh",
        tied_embeddings=data.get("tie_word_embeddings", True),
        attention_bias=data.get("attention_bias", False),
        **windowed(data, data.get("sliding_window", 4096), 2),
    )


def _write_gemma(spec: Any) -> dict[str, Any]:
    return dict(
        hidden_activation=spec.activation,
        attention_bias=spec.attention_bias,
        sliding_window=spec.sliding_window,
        layer_types=layer_types(spec),
        pad_token_id=None,
    )


def _read_qwen3(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("use_sliding_window"):
        raise UserError(
            "use_sliding_window: Qwen3's sliding-window layers (max_window_layers) are not modelled; give false"
        )
    return dict(attention_bias=data.get("attention_bias", False))


def _write_bias_only(spec: Any) -> dict[str, Any]:
    return dict(attention_bias=spec.attention_bias, pad_token_id=None)


def pad_within_vocabulary(data: dict[str, Any], default: int | None = None) -> None:
    """transformers' embedding refuses a padding id outside the vocabulary (`Padding_idx must be within
    num_embeddings`): said here, in one line, before any rank builds the model."""
    pad, vocab = data.get("pad_token_id", default), data.get("vocab_size")
    if isinstance(pad, int) and isinstance(vocab, int) and not 0 <= pad < vocab:
        raise UserError(
            f"pad_token_id: {pad} is outside the vocabulary (vocab_size {vocab}); give an id below {vocab} or null"
        )


def _read_phi3(data: dict[str, Any]) -> dict[str, Any]:
    """Phi3Config: fused q/k/v and gate/up projections; a `sliding_window` (Phi-3-mini: 2047) applies to every
    layer; residual and embedding dropout where its probabilities are non-zero. Its `pad_token_id` defaults to
    32000."""
    pad_within_vocabulary(data, 32000)
    drop = any((data.get(k) or 0) > 0 for k in ("resid_pdrop", "embd_pdrop", "attention_dropout"))
    window = data.get("sliding_window")
    return dict(dropout=drop, sliding_window=window, sliding_window_pattern=0 if window else 1)


def _write_phi3(spec: Any) -> dict[str, Any]:
    return dict(sliding_window=spec.sliding_window, pad_token_id=None)


READERS: dict[str, Reader] = {
    "llama": _read_llama,
    "mistral": _read_llama,
    "mixtral": _read_mixtral,
    "qwen2_moe": _qwen_moe("qwen2_moe"),
    "qwen3_moe": _qwen_moe("qwen3_moe"),
    "qwen3": _read_qwen3,
    "olmo2": lambda data: dict(attention_bias=data.get("attention_bias", False)),
    "phi3": _read_phi3,
    "gemma2": _read_gemma2,
    "gemma3": _read_gemma3,
}
"""Family → its reader (families not named here or in `hf_keys_moe.py` read the Llama-style shape alone:
Qwen2)."""

WRITERS: dict[str, Writer] = {
    "llama": _write_llama,
    "mistral": _write_llama,
    "mixtral": _write_llama,
    "qwen2_moe": _write_qwen2_moe,
    "qwen3_moe": _write_qwen3_moe,
    "qwen3": _write_bias_only,
    "olmo2": _write_bias_only,
    "phi3": _write_phi3,
    "gemma2": _write_gemma,
    "gemma3": _write_gemma,
}
