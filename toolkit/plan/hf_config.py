"""Translate an HF `config.json` into a :class:`~toolkit.plan.specs.ModelSpec` without importing transformers.

Key names follow the HF config classes (GPT2Config, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
Qwen2MoeConfig, Qwen3MoeConfig, BloomConfig), including their defaults for keys a file leaves out, so the count of the
resulting spec equals the HF model's.
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError

# Training sequence length when the file only gives the position limit: long-context models (Mixtral: 32k)
# are pre-trained on shorter sequences, and a user who means otherwise passes --seq-length.
DEFAULT_MAX_SEQ_LENGTH = 4096

_LLAMA_KEYS = {
    "n_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn_hidden_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
}


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def _model_type(data: dict[str, Any]) -> str:
    if "model_type" in data:
        return str(data["model_type"])
    arch = str(data["architectures"][0]).lower()
    for prefix, name in _CLASS_PREFIXES:
        if arch.startswith(prefix):
            return name
    return arch


# `architectures` class-name prefixes (lower case) → model_type, the first match wins: the MoE prefixes come
# before "qwen2", since Qwen2MoeForCausalLM also starts with it
_CLASS_PREFIXES = (
    ("gpt2", "gpt2"),
    ("llama", "llama"),
    ("mixtral", "mixtral"),
    ("mistral", "mistral"),
    ("qwen2moe", "qwen2_moe"),
    ("qwen3moe", "qwen3_moe"),
    ("qwen2", "qwen2"),
    ("bloom", "bloom"),
)
_LLAMA_FAMILY = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3_moe")
# Qwen2MoeConfig / Qwen3MoeConfig defaults (transformers 5.x) for the MoE keys a file may leave out
_QWEN_MOE_DEFAULTS = {
    "qwen2_moe": dict(
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
    ),
    "qwen3_moe": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
}


def _gpt2(data: dict[str, Any]) -> dict[str, Any]:
    hidden = data.get("n_embd", 768)
    positions = data.get("n_positions", 1024)
    return dict(
        architecture="gpt2",
        n_layers=data.get("n_layer", 12),
        hidden_size=hidden,
        n_heads=data.get("n_head", 12),
        ffn_hidden_size=data.get("n_inner") or 4 * hidden,
        vocab_size=data.get("vocab_size", 50257),
        max_position_embeddings=positions,
        seq_length=positions,
        tied_embeddings=data.get("tie_word_embeddings", True),
        activation=data.get("activation_function", "gelu_new"),
        dropout=any(data.get(k, 0.1) > 0 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
    )


def _bloom(data: dict[str, Any]) -> dict[str, Any]:
    return dict(
        architecture="bloom",
        n_layers=data.get("n_layer", data.get("num_hidden_layers", 2)),
        hidden_size=data.get("hidden_size", data.get("n_embed", 64)),
        n_heads=data.get("n_head", data.get("num_attention_heads", 8)),
        vocab_size=data.get("vocab_size", 250880),
        seq_length=data.get("seq_length", 2048),
        tied_embeddings=data.get("tie_word_embeddings", True),
    )


def _llama_family(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"architecture": model_type}
    for ours, theirs in _LLAMA_KEYS.items():
        if data.get(theirs) is not None:
            spec[ours] = data[theirs]
    spec["tied_embeddings"] = data.get("tie_word_embeddings", False)
    if model_type in ("llama", "mistral", "mixtral"):
        spec["attention_bias"] = data.get("attention_bias", False)
        spec["mlp_bias"] = data.get("mlp_bias", False)
    if model_type == "mixtral":
        spec["num_experts"] = data.get("num_local_experts", 8)
        spec["moe_top_k"] = data.get("num_experts_per_tok", 2)
    if model_type in _QWEN_MOE_DEFAULTS:
        spec.update(_qwen_moe(data, model_type))
    positions = spec.get("max_position_embeddings", 4096)
    spec["seq_length"] = min(positions, DEFAULT_MAX_SEQ_LENGTH)
    return spec


def _qwen_moe(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """Qwen2-MoE / Qwen3-MoE: the sparse block's keys. A block is sparse when `(i + 1) % decoder_sparse_step
    == 0` and i is not in `mlp_only_layers` (modeling_qwen2_moe.py Qwen2MoeDecoderLayer); dstk's
    `moe_layer_interval` is that step, and explicit dense layers are refused rather than miscounted."""
    d = {**_QWEN_MOE_DEFAULTS[model_type], **{k: v for k, v in data.items() if v is not None}}
    if d.get("mlp_only_layers"):
        raise UserError(
            f"mlp_only_layers: {d['mlp_only_layers']} is not supported; dstk models every "
            "decoder_sparse_step-th block as sparse (give an empty list)"
        )
    spec: dict[str, Any] = dict(
        # transformers 5 writes `num_local_experts` (its attribute map's name); the hub's files say num_experts
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


def from_hf_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelSpec fields for an HF config dict; raises UserError for an architecture dstk cannot count."""
    model_type = _model_type(data)
    if model_type == "gpt2":
        spec = _gpt2(data)
    elif model_type == "bloom":
        spec = _bloom(data)
    elif model_type in _LLAMA_FAMILY:
        spec = _llama_family(data, model_type)
    else:
        raise UserError(
            f"{source}: model_type: {model_type!r} is not supported; valid: gpt2, bloom, "
            f"{', '.join(_LLAMA_FAMILY)} (or describe the shape in a dstk YAML file)"
        )
    spec["name"] = (
        str(data.get("_name_or_path") or data.get("name") or model_type).rsplit("/", 1)[-1] or model_type
    )
    return spec


def to_hf_config(spec: Any) -> dict[str, Any]:
    """HF config kwargs (with `model_type`) that build the model `spec` describes, for `AutoConfig.for_model`.

    The inverse of :func:`from_hf_config`; the run path builds its models from this, and a test checks that
    the HF model's `sum(p.numel())` equals `count_params(spec).total` for every preset.
    """
    arch = spec.architecture
    if arch == "gpt2":
        if spec.gated_mlp or spec.norm != "layernorm" or spec.position_embedding != "learned":
            raise UserError(
                f"model {spec.name}: architecture gpt2 needs a plain MLP, LayerNorm and learned positions"
            )
        return dict(
            model_type="gpt2",
            n_layer=spec.n_layers,
            n_embd=spec.hidden_size,
            n_head=spec.n_heads,
            n_inner=spec.ffn_hidden_size,
            vocab_size=spec.vocab_size,
            n_positions=spec.max_position_embeddings,
            tie_word_embeddings=spec.tied_embeddings,
            activation_function=spec.activation,
            bos_token_id=min(50256, spec.vocab_size - 1),
            eos_token_id=min(50256, spec.vocab_size - 1),
            **({} if spec.dropout else dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        )
    if arch == "bloom":
        return dict(
            model_type="bloom",
            n_layer=spec.n_layers,
            hidden_size=spec.hidden_size,
            n_head=spec.n_heads,
            vocab_size=spec.vocab_size,
            tie_word_embeddings=spec.tied_embeddings,
        )
    cfg: dict[str, Any] = dict(
        model_type=arch,
        num_hidden_layers=spec.n_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.ffn_hidden_size,
        vocab_size=spec.vocab_size,
        max_position_embeddings=max(spec.max_position_embeddings, spec.seq_length),
        tie_word_embeddings=spec.tied_embeddings,
    )
    if arch in ("llama", "mistral", "mixtral"):
        cfg.update(attention_bias=spec.attention_bias, mlp_bias=spec.mlp_bias)
    if arch == "mixtral":
        cfg.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.moe_top_k)
    if arch in _QWEN_MOE_DEFAULTS:
        cfg.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.moe_top_k,
            moe_intermediate_size=spec.moe_ffn_hidden_size,
            decoder_sparse_step=spec.moe_layer_interval,
            norm_topk_prob=spec.moe_renormalize,
        )
    if arch == "qwen2_moe":
        cfg.update(
            qkv_bias=spec.attention_bias, shared_expert_intermediate_size=spec.shared_expert_ffn_hidden_size
        )
    if arch == "qwen3_moe":
        cfg.update(attention_bias=spec.attention_bias)
    return cfg
