"""DeepSpeed configs written for HF Trainer or Accelerate: who fills each `"auto"`, and with what.

transformers (integrations/deepspeed.py: `trainer_config_process`, `trainer_config_finalize`) and Accelerate
(utils/dataclasses.py `DeepSpeedPlugin`, accelerator.py `_prepare_deepspeed`) replace `"auto"` in a fixed set of
fields from the training arguments and the model; DeepSpeed's autotuner searches others. Anywhere else `"auto"`
reaches DeepSpeed as a string, where it is a TypeError or, in `fp16.enabled`, silently true. `fill_auto` says,
for each `"auto"`, who fills it — and fills it as they would where the job's facts are given — so the rest of the
file can be judged before the run. Standard library only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
# Fields the HF Trainer (transformers.integrations.deepspeed: trainer_config_process / _finalize) or Accelerate
# (utils/dataclasses.DeepSpeedPlugin, Accelerator._prepare_deepspeed) fill when they are "auto", and from what.
HF_FILLED: dict[str, str] = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size (--micro-batch)",
    "gradient_accumulation_steps": "gradient_accumulation_steps (--grad-accum)",
    "train_batch_size": "micro-batch × accumulation × data-parallel ranks",
    "gradient_clipping": "max_grad_norm",
    "optimizer.params.lr": "learning_rate",
    "optimizer.params.betas": "adam_beta1, adam_beta2",
    "optimizer.params.eps": "adam_epsilon",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "always 0",
    "scheduler.params.warmup_max_lr": "learning_rate",
    "scheduler.params.warmup_num_steps": "warmup_steps",
    "scheduler.params.total_num_steps": "the number of training steps",
    "fp16.enabled": "--fp16 (--precision)",
    "bf16.enabled": "--bf16 (--precision)",
    "zero_optimization.reduce_bucket_size": "hidden_size² (--model)",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 · hidden_size² (--model)",
    "zero_optimization.stage3_param_persistence_threshold": "10 · hidden_size (--model)",
    "zero_optimization.stage": "Accelerate's zero_stage",
    "zero_optimization.offload_optimizer.device": "Accelerate's offload_optimizer_device",
    "zero_optimization.offload_param.device": "Accelerate's offload_param_device",
    "zero_optimization.offload_optimizer.nvme_path": "Accelerate's offload_optimizer_nvme_path",
    "zero_optimization.offload_param.nvme_path": "Accelerate's offload_param_nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": "Accelerate's zero3_save_16bit_model",
}
# What DeepSpeed's autotuner (autotuning/autotuner.py) searches when autotuning.enabled: the micro-batch
# ("auto" or absent), the accumulation, and a list of ZeRO stages.
AUTOTUNER_FILLED = {
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization.stage",
}


@dataclass(frozen=True)
class RunFacts:
    """What the job will run with, for filling `"auto"` the way HF Trainer/Accelerate would (None: unknown)."""

    micro_batch: int | None = None
    grad_accum: int | None = None
    hidden_size: int | None = None
    precision: str | None = None


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def set_path(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    """`cfg["a"]["b"] = value` for "a.b" (the levels exist); None removes the key."""
    *parents, last = dotted.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value


def autotuning(cfg: dict[str, Any]) -> bool:
    tuning = cfg.get("autotuning")
    return isinstance(tuning, dict) and tuning.get("enabled") is True


def fill_auto(cfg: dict[str, Any], facts: RunFacts) -> tuple[dict[str, Any], list[str], list[str]]:
    """(config with every fillable "auto" replaced, notes saying who fills each, problems for the rest).

    A value the facts give is used as HF would; otherwise a stand-in that DeepSpeed accepts is used so the rest
    of the file can still be checked, and the note says the field is filled at run time. The batch fields
    stay unset here when unknown: `resolve_batch` then derives them as DeepSpeed does."""
    out = copy.deepcopy(cfg)
    notes: list[str] = []
    problems: list[str] = []
    tuner = autotuning(cfg)
    hidden = facts.hidden_size
    given: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": facts.micro_batch,
        "gradient_accumulation_steps": facts.grad_accum,
        "fp16.enabled": None if facts.precision is None else facts.precision == "fp16",
        "bf16.enabled": None if facts.precision is None else facts.precision in ("bf16", "fp8"),
        "zero_optimization.reduce_bucket_size": hidden and hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": hidden and int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": hidden and 10 * hidden,
    }
    stand_in: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "optimizer.params.lr": 1e-4,
        "optimizer.params.betas": [0.9, 0.999],
        "optimizer.params.eps": 1e-8,
        "optimizer.params.weight_decay": 0.0,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": 1e-4,
        "scheduler.params.warmup_num_steps": 1,
        "scheduler.params.total_num_steps": 1000,
        "fp16.enabled": False,
        "bf16.enabled": False,
        "zero_optimization.stage": 2,  # Accelerate's DeepSpeedPlugin default
        "zero_optimization.offload_optimizer.device": "none",
        "zero_optimization.offload_param.device": "none",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    for path, value in list(_leaves(cfg)):
        if tuner and path == "zero_optimization.stage" and isinstance(value, list) and value:
            notes.append(f"{path}: {value} is the autotuner's search space (autotuning.enabled)")
            set_path(out, path, max((v for v in value if isinstance(v, int)), default=0))
            continue
        if value != AUTO:
            continue
        if tuner and path in AUTOTUNER_FILLED:
            notes.append(f'{path}: "auto", searched by DeepSpeed\'s autotuner (autotuning.enabled)')
            set_path(out, path, None)
        elif path in HF_FILLED:
            known = given.get(path)
            if known is not None:
                notes.append(f'{path}: "auto" ← {known} (HF fills it from {HF_FILLED[path]})')
                set_path(out, path, known)
            else:
                notes.append(
                    f'{path}: "auto", filled at run time by HF Trainer/Accelerate ({HF_FILLED[path]})'
                )
                set_path(out, path, stand_in.get(path))
        elif path == "bfloat16.enabled":
            problems.append(
                'bfloat16.enabled: "auto" is not filled: HF Trainer/Accelerate fill bf16.enabled, not the legacy '
                "bfloat16 name, and DeepSpeed reads the string as true; rename the section to bf16"
            )
            set_path(out, path, None)
        else:
            problems.append(
                f'{path}: "auto" is filled by neither HF Trainer nor Accelerate (they fill the batch sizes, '
                "gradient_clipping, optimizer/scheduler params, fp16/bf16.enabled and ZeRO sizes); give a value"
            )
            set_path(out, path, None)
    batch = ("train_batch_size", "train_micro_batch_size_per_gpu")
    if any(cfg.get(k) == AUTO for k in batch) and all(out.get(k) is None for k in batch):
        out["train_micro_batch_size_per_gpu"] = 1  # a stand-in; the notes say who fills it
    return out, notes, problems
