"""Translate an HF `config.json` into a :class:`~toolkit.plan.specs.ModelSpec` without importing transformers.

Key names follow the HF config classes (GPT2Config, LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config,
Qwen2MoeConfig, Qwen3MoeConfig, Gemma3TextConfig, BloomConfig), including their defaults for keys a file leaves
out, so the count of the resulting spec equals the HF model's. Which `model_type` and class name belong to which
family comes from `plan/architectures.py`; the per-family keys beyond the Llama-style shape are here, in one
reader and one writer function per family.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit.errors import UserError
from toolkit.plan import hf_keys, hf_keys_moe
from toolkit.plan.architectures import ARCHITECTURES
from toolkit.plan.hf_keys_moe import MODEL_TYPE_ALIASES
from toolkit.plan.traced import TraceNeeded, read_trace, spec_fields

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
        model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
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
_READERS = {**hf_keys.READERS, **hf_keys_moe.READERS}
_WRITERS = {**hf_keys.WRITERS, **hf_keys_moe.WRITERS}
_LLAMA_FAMILY = tuple(name for name, f in ARCHITECTURES.items() if f.naming == "llama")


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
    """The Llama-style shape every family with Llama's module names shares, then the family's own keys
    (`plan/hf_keys.py`)."""
    spec: dict[str, Any] = {"architecture": model_type}
    for ours, theirs in _LLAMA_KEYS.items():
        if data.get(theirs) is not None:
            spec[ours] = data[theirs]
    spec["tied_embeddings"] = data.get("tie_word_embeddings", False)
    hidden, heads = spec.get("hidden_size"), spec.get("n_heads")
    if "head_dim" not in spec and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        spec["head_dim"] = hidden // heads  # the config classes' own default, floor division included
    hf_keys.pad_within_vocabulary(data)
    reader = _READERS.get(model_type)
    if reader is not None:
        spec.update(reader(data))
    positions = spec.get("max_position_embeddings", 4096)
    spec["seq_length"] = min(positions, DEFAULT_MAX_SEQ_LENGTH)
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
        spec = _traced(data, source)
    spec["name"] = _name(data, model_type)
    return spec


def _name(data: dict[str, Any], model_type: str) -> str:
    return str(data.get("_name_or_path") or data.get("name") or model_type).rsplit("/", 1)[-1] or model_type


def _traced(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A model type the table has no entry for: its cached trace, or TraceNeeded for the caller to trace it
    (the run half builds the model on the meta device; toolkit/plan/traced.py)."""
    if "model_type" not in data:
        raise UserError(
            f"{source}: architectures: {data['architectures'][0]!r} names no family dstk knows and the file has "
            "no model_type to build it by; add the model_type its repository's config.json gives"
        )
    traced = read_trace(data)
    if traced is None:
        raise TraceNeeded(data, source)
    return spec_fields(traced, _name(data, str(data["model_type"])))


_NOT_BUILT_FROM = (
    "_name_or_path",
    "auto_map",
    "quantization_config",
    "transformers_version",
    "torch_dtype",
    "dtype",
)
"""Keys of a config.json that do not shape the model trained from scratch: its name, a repository's own modeling
code (dstk runs transformers' own), the released weights' quantization and dtype."""


def source_json(data: dict[str, Any]) -> str:
    """The config.json a description was read from, as the run path builds it (canonical JSON)."""
    return json.dumps({k: v for k, v in data.items() if k not in _NOT_BUILT_FROM}, sort_keys=True)


def _still_the_source(spec: Any) -> bool:
    """Whether `spec` still describes the config.json it was read from (a copy with another shape does not)."""
    if spec.hf_config_json is None:
        return False
    fields = from_hf_config(json.loads(spec.hf_config_json), "config.json")
    ignored = ("name", "seq_length", "max_position_embeddings")
    return all(getattr(spec, k) == v for k, v in fields.items() if k not in ignored)


def to_hf_config(spec: Any) -> dict[str, Any]:
    """HF config kwargs (with `model_type`) that build the model `spec` describes, for `AutoConfig.for_model`.

    The inverse of :func:`from_hf_config`; the run path builds its models from this, and a test checks that
    the HF model's `sum(p.numel())` equals `count_params(spec).total` for every preset. A model read from a
    config.json (traced or not) is built from that config, its position limit raised to the training sequence
    where that is longer.
    """
    arch = spec.architecture
    if spec.trace is not None or _still_the_source(spec):
        cfg = dict(spec.trace.hf_config) if spec.trace is not None else json.loads(spec.hf_config_json)
        cfg = {k: v for k, v in cfg.items() if k not in _NOT_BUILT_FROM}
        cfg["model_type"] = MODEL_TYPE_ALIASES.get(str(cfg.get("model_type")), cfg.get("model_type"))
        if isinstance(cfg.get("max_position_embeddings"), int):
            cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], spec.seq_length)
        return cfg
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
    writer = _WRITERS.get(arch)
    if writer is not None:
        cfg.update(writer(spec))
    return cfg
