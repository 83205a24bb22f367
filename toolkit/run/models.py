"""Build the HF model a model description names, ready for the DeepSpeed engine.

ZeRO-3 models are built the way transformers' own DeepSpeed integration builds them: an `HfDeepSpeedConfig`
kept alive while `from_config`/`from_pretrained` runs makes transformers construct every module inside
`deepspeed.zero.Init`, so parameters are partitioned as they are created and no rank ever holds the whole
model, and it initialises weights under `GatheredParameters`; the process must have called
`toolkit.run.runtime.keep_large_blocks_in_mmap()` early for host memory to follow. (Constructing `GPT2LMHeadModel(config)` inside
a bare `zero.Init` skips HF's weight init: the first loss is ≈ 42 instead of ln(vocab).)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.hf_config import to_hf_config
from toolkit.plan.specs import ModelSpec


def hf_config(spec: ModelSpec) -> Any:
    """The transformers config object for `spec` (attention through SDPA where the family has it)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(**to_hf_config(spec))
    config._attn_implementation = spec.family.attention_implementation
    return config


_SHAPE_KEYS = (
    "model_type",
    "n_layer",
    "n_embd",
    "n_head",
    "n_inner",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)


def check_init_from(spec: ModelSpec, init_from: Path) -> None:
    """--init-from must hold the model --model describes: the plan, the metrics and the config were made for
    the description, and HF would silently build whatever the directory's config.json says."""
    import json

    saved = json.loads((init_from / "config.json").read_text())
    wanted = to_hf_config(spec)
    differ = [
        f"{k}={saved[k]} (--model: {wanted[k]})"
        for k in _SHAPE_KEYS
        if k in saved
        and k in wanted
        and saved[k] is not None
        and wanted[k] is not None
        and saved[k] != wanted[k]
    ]
    if differ:
        raise UserError(
            f"--init-from: {init_from} holds a different model than --model {spec.name}: " + ", ".join(differ)
        )


def build_model(spec: ModelSpec, ds_config: dict[str, Any], init_from: Path | None = None) -> Any:
    """A causal LM for `spec`: random init, or the weights of a local `save_pretrained` directory."""
    import torch
    from transformers import AutoModelForCausalLM

    keepalive = None
    if ds_config.get("zero_optimization", {}).get("stage", 0) == 3:
        from transformers.integrations import HfDeepSpeedConfig

        # transformers holds only a weak reference: the object must live as long as the model
        keepalive = HfDeepSpeedConfig(ds_config)
    dtype = torch.float32  # the engine casts to bf16/fp16 itself and keeps fp32 masters
    if init_from is not None:
        if not (Path(init_from) / "config.json").is_file():
            raise UserError(
                f"--init-from: {init_from} has no config.json (expected a save_pretrained directory)"
            )
        check_init_from(spec, Path(init_from))
        model = AutoModelForCausalLM.from_pretrained(
            init_from, dtype=dtype, attn_implementation=spec.family.attention_implementation
        )
    else:
        model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=dtype)
    model._dstk_hf_deepspeed_config = keepalive
    # transformers infers the loss from the class name; GPT2LMHeadModel has no "ForCausalLM" in it and every
    # rank would warn on every forward
    model.loss_type = "ForCausalLM"
    return model
