"""LoRA at run time: peft's adapters applied to an HF model before `deepspeed.initialize`, and the adapters
saved from the engine (gathered from ZeRO-3 partitions). What LoRA is and costs: toolkit.plan.lora."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.plan.lora import LoraSpec, targets
from toolkit.plan.specs import ModelSpec


def apply_lora(model: Any, model_spec: ModelSpec, spec: LoraSpec) -> Any:
    """Wrap an HF causal LM with peft's LoRA before `deepspeed.initialize`: the base is frozen
    (`requires_grad=False`, so DeepSpeed builds optimizer groups from the adapters only) and the adapters are
    added as ordinary modules. Under ZeRO-3 the base is already partitioned by `zero.Init`; peft reads the
    real shapes from `ds_shape`, and the engine partitions the new adapter parameters at initialize."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(targets(model_spec, spec)),
        # GPT-2's Conv1D stores weights as (in, out)
        fan_in_fan_out=model_spec.family.conv1d,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    # transformers' loss-type attribute lives on the base model; keep the wrapper's forward quiet too
    peft_model.loss_type = getattr(model, "loss_type", None)
    return peft_model


def adapter_state(engine: Any) -> dict[str, Any]:
    """The adapters' weights as full CPU tensors on every rank (gathered from their ZeRO-3 partitions)."""
    import deepspeed
    from peft import get_peft_model_state_dict

    from toolkit.run.runtime import settle_zero3

    module = engine.module
    adapters = [p for n, p in module.named_parameters() if "lora_" in n]
    zero3 = any(hasattr(p, "ds_id") for p in adapters)
    settle_zero3(engine)
    with deepspeed.zero.GatheredParameters(adapters, enabled=zero3):
        return {k: v.detach().float().cpu().clone() for k, v in get_peft_model_state_dict(module).items()}


def save_adapters(engine: Any, out_dir: Path, is_main: bool) -> None:
    """peft's adapter directory (`adapter_config.json` + `adapter_model.safetensors`), loadable with
    `PeftModel.from_pretrained(base, out_dir)`; all ranks must call it (ZeRO-3 gathers collectively)."""
    state = adapter_state(engine)
    if is_main:
        module = engine.module
        module.save_pretrained(str(out_dir), state_dict=state)
