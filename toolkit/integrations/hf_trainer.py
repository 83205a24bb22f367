"""HF Trainer: a DeepSpeed config with `"auto"` exactly where the Trainer fills values from `TrainingArguments`,
and the `TrainingArguments` values that make the Trainer resolve it to dstk's plan.

transformers 5.24 fills the config in `HfTrainerDeepSpeedConfig.trainer_config_process` (when
`TrainingArguments` is built) and `trainer_config_finalize` (in `deepspeed_init`, once the model and the step
count are known). For every key it touches, `fill_match` replaces `"auto"` with the argument's value, and
records a mismatch (a `ValueError` when training starts) if a concrete value differs. Per key, dstk writes:

- `"auto"` where the value comes from a `TrainingArguments` field (:data:`AUTO_FIELDS`): micro batch,
  accumulation, clipping, AdamW's lr/betas/eps/weight decay, the scheduler's total and warm-up steps
  (`num_training_steps` is `max_steps`; warm-up is `max(1, warmup_steps)`), and `fp16/bf16.enabled`. The field's
  value is read from the plan's config, so what HF resolves equals the plan by construction and each number
  lives in one place (the arguments file).
- `train_batch_size` concrete. HF computes it as `world_size × per_device × accumulation`, and the world size
  comes from the launcher, not from `TrainingArguments`; left concrete, it is *checked*, so a launch on the
  wrong number of ranks fails instead of silently training another global batch. (Under ZeRO-3 DeepSpeed's own
  batch assertion in `zero.Init` fires first, with the same effect.) AutoTP counts every TP rank here, as HF does.
- `zero_optimization.reduce_bucket_size`, `stage3_prefetch_bucket_size`, `stage3_param_persistence_threshold`
  concrete: HF fills them from `model.config.hidden_size`, not from the arguments, and the memory estimate
  assumed dstk's values (:mod:`toolkit.plan.zero_knobs`, the same formulas over the planned model).
- `scheduler.params.warmup_min_lr/warmup_max_lr`: HF fills them only where present; `WarmupCosineLR` has
  neither (it scales the optimizer's lr by ratios), so they stay absent and HF adds nothing.

`TrainingArguments` also gets `dataloader_drop_last` (every micro-batch holds the planned number of sequences),
`gradient_checkpointing` for full recomputation (dstk's "selective" is what SDPA attention does by itself, as
in `dstk train`; the old name, because every transformers in the supported range `>=5.17,<6` accepts it, while
5.24 calls it an alias of `activation_checkpointing` that goes only in v6), and `use_cpu` on the CPU
accelerator. A user passes
`TrainingArguments(**json.load(f), deepspeed=path, output_dir=...)` and builds the model afterwards (ZeRO-3
partitions it in `zero.Init` only then).
"""

from __future__ import annotations

import copy
from typing import Any

from toolkit.errors import UserError
from toolkit.integrations.targets import get_path, set_path, without_dstk_block
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ClusterSpec, ModelSpec

AUTO_FIELDS: dict[str, tuple[str, ...]] = {
    "train_micro_batch_size_per_gpu": ("per_device_train_batch_size",),
    "gradient_accumulation_steps": ("gradient_accumulation_steps",),
    "gradient_clipping": ("max_grad_norm",),
    "optimizer.params.lr": ("learning_rate",),
    "optimizer.params.betas": ("adam_beta1", "adam_beta2"),
    "optimizer.params.eps": ("adam_epsilon",),
    "optimizer.params.weight_decay": ("weight_decay",),
    "scheduler.params.total_num_steps": ("max_steps",),
    "scheduler.params.warmup_num_steps": ("warmup_steps",),
    "fp16.enabled": ("fp16",),
    "bf16.enabled": ("bf16",),
}
"""DeepSpeed key → the `TrainingArguments` field(s) `trainer_config_process/finalize` fill it from."""


def check_layout(model: ModelSpec, layout: Layout, flag: str = "--hf-trainer") -> None:
    """Refuse what the Trainer cannot run from a DeepSpeed config alone (one line, naming the fix)."""
    if layout.pp > 1:
        raise UserError(
            f"{flag}: HF Trainer has no DeepSpeed pipeline engine (it wraps one module in deepspeed.initialize); "
            f"use --pp 1, or dstk train / --megatron for pp={layout.pp}"
        )
    if layout.optimizer != "adamw":
        raise UserError(
            f"{flag}: --optimizer {layout.optimizer} is dstk's own client optimizer, which only dstk train hands "
            "to DeepSpeed; use --optimizer adamw"
        )
    if layout.precision == "fp8":
        raise UserError(
            f"{flag}: fp8 is dstk train's torchao.float8 conversion (or Transformer Engine under --megatron); a "
            "DeepSpeed config has no FP8 key for the Trainer to read; use --precision bf16, or dstk train"
        )
    if layout.sp > 1:
        raise UserError(
            f"{flag}: DeepSpeed-Ulysses (sp={layout.sp}) reaches the Trainer only through Accelerate's "
            "ParallelismConfig, which a DeepSpeed config cannot carry; use --sp 1, or dstk train"
        )
    if model.is_moe and not model.family.native_moe:
        raise UserError(
            f"{flag}: {model.name} is a {model.architecture} model made MoE by dstk (DeepSpeed-MoE layers that only "
            "dstk train inserts); the Trainer would train the dense HF model. Use dstk train, or a Mixtral model"
        )


def hf_trainer_files(
    cfg: dict[str, Any], cluster: ClusterSpec, layout: Layout
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DeepSpeed config with "auto" values, `TrainingArguments` keyword arguments) for the plan's `cfg`."""
    out = without_dstk_block(cfg)
    args: dict[str, Any] = {}
    for key, fields in AUTO_FIELDS.items():
        value = get_path(out, key)
        if value is None:  # e.g. no fp16 block in a bf16 plan: HF fills nothing there
            continue
        values = list(value) if len(fields) > 1 else [value]
        args.update(zip(fields, copy.deepcopy(values), strict=True))
        set_path(out, key, "auto")
    for precision in ("fp16", "bf16"):
        args.setdefault(precision, False)
    args["dataloader_drop_last"] = True
    args["gradient_checkpointing"] = layout.recompute == "full"
    if layout.recompute == "full":
        # what the layout was priced as: torch's non-reentrant checkpoint, which stops before each block's
        # down projection, or the reentrant one, which replays whole blocks in every torch dstk supports
        # (checkpoint's own `early_stop` argument needs torch 2.9); transformers 5 gives the first block an
        # input that requires grad, which the reentrant one needs
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": not layout.recompute_stops_early}
    if cluster.accelerator == "cpu":
        args["use_cpu"] = True
    return out, args
