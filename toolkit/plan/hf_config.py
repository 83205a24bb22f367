"""Translate an HF `config.json` into a :class:`~toolkit.plan.specs.ModelSpec` without importing transformers.

Key names follow the HF config classes (GPT2Config, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
Qwen2MoeConfig, Qwen3MoeConfig, Gemma3TextConfig, BloomConfig), including their defaults for keys a file leaves
out, so the count of the resulting spec equals the HF model's. Which `model_type` and class name belong to which
family comes from `plan/architectures.py`; the per-family keys beyond the Llama-style shape are here, in one
reader and one writer function per family.
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError
from toolkit.plan.architectures import ARCHITECTURES

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


def _model_type(data: dict[str, Any], source: str) -> str:
    """The dstk family of an HF config: by `model_type`, else by the class name in `architectures`."""
    if "text_config" in data:  # an image-text model (Gemma 3 4B and up, Llava…) wraps its language model
        raise UserError(
            f"{source}: model_type {data.get('model_type')!r} is an image-text model; dstk plans the language "
            "model: save the file's text_config as its own config.json (its model_type, e.g. gemma3_text) or use "
            "a preset (dstk presets)"
        )
    if "model_type" in data:
        model_type = str(data["model_type"])
        return _FAMILY_BY_MODEL_TYPE.get(model_type, model_type)
    arch = str(data["architectures"][0]).lower()
    for prefix, name in _CLASS_PREFIXES:
        if arch.startswith(prefix):
            return name
    return arch


_FAMILY_BY_MODEL_TYPE = {facts.model_type: name for name, facts in ARCHITECTURES.items()}
# `architectures` class-name prefixes (lower case) → family, longest first: Qwen2MoeForCausalLM also starts
# with "qwen2"
_CLASS_PREFIXES = sorted(
    ((f.hf_prefix.lower(), name) for name, f in ARCHITECTURES.items()), key=lambda p: -len(p[0])
)
_LLAMA_FAMILY = tuple(name for name, f in ARCHITECTURES.items() if f.naming == "llama")
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
    if model_type == "gemma3":
        spec.update(_gemma3(data))
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


def _gemma3(data: dict[str, Any]) -> dict[str, Any]:
    """Gemma3TextConfig's keys beyond the shape (transformers 5.x defaults): tanh-GeLU, a tied head, local
    layers of `sliding_window` keys with every `sliding_window_pattern`-th layer global, or the explicit
    `layer_types` list transformers 5 writes (which must follow such a pattern)."""
    if data.get("use_bidirectional_attention"):
        raise UserError(
            "use_bidirectional_attention: true is an encoder (EmbeddingGemma); dstk trains causal LMs"
        )
    spec: dict[str, Any] = dict(
        activation=data.get("hidden_activation") or data.get("hidden_act") or "gelu_pytorch_tanh",
        tied_embeddings=data.get("tie_word_embeddings", True),
        attention_bias=data.get("attention_bias", False),
        sliding_window=data.get("sliding_window", 4096),
        sliding_window_pattern=data.get("sliding_window_pattern", 6),
    )
    types = data.get("layer_types")
    if types:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        k = full[0] + 1 if full else len(types) + 1
        if [t == "full_attention" for t in types] != [(i + 1) % k == 0 for i in range(len(types))]:
            raise UserError(
                f"layer_types: {types} is not one global layer every k; dstk models Gemma's pattern "
                "(sliding_window_pattern)"
            )
        spec["sliding_window_pattern"] = k
    return spec


def from_hf_config(data: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelSpec fields for an HF config dict; raises UserError for an architecture dstk cannot count."""
    model_type = _model_type(data, source)
    if model_type == "gpt2":
        spec = _gpt2(data)
    elif model_type == "bloom":
        spec = _bloom(data)
    elif model_type in _LLAMA_FAMILY:
        spec = _llama_family(data, model_type)
    else:
        valid = ", ".join(f.model_type for f in ARCHITECTURES.values())
        raise UserError(
            f"{source}: model_type: {model_type!r} is not supported; valid: {valid} (or describe the shape in "
            "a dstk YAML file)"
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
        model_type=spec.family.model_type,
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
    if arch == "gemma3":
        local = spec.sliding_window is not None
        cfg.update(
            hidden_activation=spec.activation,
            attention_bias=spec.attention_bias,
            sliding_window=spec.sliding_window,
            layer_types=[
                "sliding_attention" if local and (i + 1) % spec.sliding_window_pattern else "full_attention"
                for i in range(spec.n_layers)
            ],
        )
    return cfg
