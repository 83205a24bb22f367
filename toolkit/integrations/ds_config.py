"""Layout → the complete DeepSpeed config dict. The one place the DeepSpeed JSON is built.

Every value is derived from the model, the cluster, the resolved layout or a published recipe
(:mod:`toolkit.plan.recipes`); bucket and prefetch sizes come from :mod:`toolkit.plan.zero_knobs`, the same numbers the
memory estimate assumed. Facts about DeepSpeed 0.19.8 this relies on:
- the batch check is `train_batch_size == micro × accumulation × world / sequence_parallel_size`; AutoTP ranks are
  *not* divided out (`deepspeed/__init__.py` builds the config before the TP groups exist), so with
  `tensor_parallel.autotp_size = t` the config must count every TP rank: train_batch_size = global × t;
- DeepSpeed ignores unknown top-level keys, so the config carries a `dstk` block for `dstk train`: the resolved
  layout and model name it was planned for (recomputation, the predicted-vs-measured report) and, since
  DeepSpeed dropped its 1-bit optimizers (issue #8489), dstk's own optimizer, which `dstk train` passes to
  `deepspeed.initialize` as a client optimizer;
- with CPU offload the engine swaps Adam for DeepSpeedCPUAdam (a JIT-built op); without offload on the CPU
  accelerator `torch_adam` avoids building fused Adam.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolkit.integrations.dstk_block import DSTK_KEY, read_dstk_block
from toolkit.plan import recipes
from toolkit.plan.cost.estimate import Estimate
from toolkit.plan.layout import Layout, engine_precision
from toolkit.plan.params import count_params
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.zero_knobs import OPTIMIZER_SWAP_BUFFERS, PARAM_SWAP_BUFFERS, derive_zero_knobs


class ConfigOptions(BaseModel):
    """What a generated config needs beyond the layout: optimisation recipe, logging, paths."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    lr: float | None = Field(default=None, gt=0)
    """Peak learning rate (default: GPT-3's for the model size)."""
    train_steps: int = Field(default=10_000, gt=0)
    """Optimizer steps the schedule spans (warm-up + cosine decay)."""
    warmup_steps: int | None = Field(default=None, gt=0)
    """Linear warm-up steps (default: GPT-3's 375M tokens, at most a tenth of the run)."""
    weight_decay: float = Field(default=recipes.WEIGHT_DECAY, ge=0)
    """AdamW weight decay."""
    gradient_clipping: float = Field(default=recipes.GRADIENT_CLIPPING, ge=0)
    """Global gradient-norm clipping threshold."""
    log_dir: str = "logs"
    """Where TensorBoard and CSV monitors write; `dstk train` puts a relative path under its --run-dir (DeepSpeed
    alone resolves it against the working directory)."""
    job_name: str = "dstk"
    """Monitor job name."""
    wandb: bool = False
    """Enable DeepSpeed's wandb monitor (offline unless the user has configured wandb)."""
    comms_logger: bool = False
    """Enable DeepSpeed's communication logger (volumes and latencies per collective). It synchronizes the
    device after every collective. Off, the config has no `comms_logger` key at all: DeepSpeed switches the
    logger on for any such key, whatever its `enabled` says."""
    flops_profiler: bool = False
    """Enable DeepSpeed's FLOPs profiler at step 10."""
    steps_per_print: int = Field(default=10, gt=0)
    """How often the engine prints its own progress line."""
    nvme_path: str = "/local_nvme"
    """Directory on local NVMe for ZeRO-Infinity swap files."""
    freeze_step: int | None = Field(default=None, gt=0)
    """1-bit Adam / 0/1 Adam full-precision warm-up steps (default: 20 % of train_steps, Tang et al. 2021)."""


def _precision_block(layout: Layout) -> dict[str, Any]:
    """The engine's 16-bit block. fp8 trains in bf16 (DeepSpeed's JSON has no FP8 key): the FP8 GEMMs are the
    linear layers' own (torchao.float8 in dstk train, Transformer Engine under Megatron), and the `dstk` block's
    layout says fp8."""
    precision = engine_precision(layout.precision)
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    if precision == "fp16":
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


def _zero_block(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, opts: ConfigOptions
) -> dict[str, Any]:
    knobs = derive_zero_knobs(model, layout)
    zero: dict[str, Any] = {"stage": layout.zero_stage}
    if layout.zero_stage == 0:
        return zero
    zero.update(
        overlap_comm=knobs.overlap_comm,
        contiguous_gradients=knobs.contiguous_gradients,
        reduce_scatter=True,
        reduce_bucket_size=knobs.reduce_bucket_size,
    )
    if layout.zero_stage in (1, 2):
        zero["allgather_bucket_size"] = knobs.allgather_bucket_size
    if layout.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=knobs.stage3_prefetch_bucket_size,
            stage3_param_persistence_threshold=knobs.stage3_param_persistence_threshold,
            stage3_max_live_parameters=knobs.stage3_max_live_parameters,
            stage3_max_reuse_distance=knobs.stage3_max_reuse_distance,
            stage3_gather_16bit_weights_on_model_save=True,
            sub_group_size=knobs.sub_group_size,
        )
    if layout.offload_optimizer != "none":
        block: dict[str, Any] = {"device": layout.offload_optimizer, "pin_memory": True}
        if layout.offload_optimizer == "nvme":
            block.update(nvme_path=opts.nvme_path, buffer_count=OPTIMIZER_SWAP_BUFFERS, fast_init=False)
        zero["offload_optimizer"] = block
    if layout.offload_param != "none":
        block = {"device": layout.offload_param, "pin_memory": True}
        if layout.offload_param == "nvme":
            # one swap buffer per partition of the largest tensor; max_in_cpu 0, or DeepSpeed keeps every
            # parameter of a rank owning under 1e9 in host memory and NVMe holds nothing (stage3.py:888-1003)
            block.update(
                nvme_path=opts.nvme_path,
                buffer_count=PARAM_SWAP_BUFFERS,
                buffer_size=knobs.nvme_param_buffer_size,
                max_in_cpu=knobs.nvme_max_in_cpu,
            )
        zero["offload_param"] = block
    if layout.zeropp:
        zero.update(
            zero_hpz_partition_size=hpz_partition_size(cluster, layout),
            zero_quantized_weights=True,
            zero_quantized_gradients=True,
        )
    return zero


def hpz_partition_size(cluster: ClusterSpec, layout: Layout) -> int:
    """ZeRO++'s secondary weight partition spans the data-parallel ranks of one node (Wang et al. 2023, §3.2)."""
    return max(1, min(layout.dp, cluster.gpus_per_node // (layout.tp * layout.sp)))


def _optimizer_blocks(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, opts: ConfigOptions
) -> dict[str, Any]:
    lr = opts.lr or recipes.peak_learning_rate(count_params(model).total)
    tokens_per_step = layout.global_batch_size * model.seq_length
    warmup = opts.warmup_steps or recipes.warmup_steps(tokens_per_step, opts.train_steps)
    scheduler = {
        "type": "WarmupCosineLR",
        "params": {
            "total_num_steps": opts.train_steps,
            "warmup_num_steps": warmup,
            "warmup_type": "linear",
            "warmup_min_ratio": 0.0,
            "cos_min_ratio": recipes.MIN_LR_RATIO,
        },
    }
    adam = {
        "lr": lr,
        "betas": list(recipes.ADAM_BETAS),
        "eps": recipes.ADAM_EPS,
        "weight_decay": opts.weight_decay,
    }
    if layout.optimizer != "adamw":
        freeze = opts.freeze_step or max(1, opts.train_steps // 5)
        dstk_optimizer = {"type": layout.optimizer, "params": {**adam, "freeze_step": freeze}}
        return {DSTK_KEY: {"optimizer": dstk_optimizer}, "scheduler": scheduler}
    if cluster.accelerator == "cpu" and layout.offload_optimizer == "none":
        adam["torch_adam"] = True  # no fused-Adam JIT build on the CPU accelerator
    return {"optimizer": {"type": "AdamW", "params": adam}, "scheduler": scheduler}


def _logging_blocks(opts: ConfigOptions) -> dict[str, Any]:
    out: dict[str, Any] = {
        "steps_per_print": opts.steps_per_print,
        "wall_clock_breakdown": False,
        "tensorboard": {
            "enabled": True,
            "output_path": f"{opts.log_dir}/tensorboard",
            "job_name": opts.job_name,
        },
        "csv_monitor": {"enabled": True, "output_path": f"{opts.log_dir}/csv", "job_name": opts.job_name},
        "wandb": {"enabled": opts.wandb, "project": "dstk"},
        "flops_profiler": {
            "enabled": opts.flops_profiler,
            "profile_step": 10,
            "module_depth": -1,
            "top_modules": 1,
            "detailed": False,
            "output_file": None,
        },
    }
    if opts.comms_logger:  # DeepSpeed turns it on by the key's presence alone (integrations.ds_input)
        out["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    return out


def build_ds_config(
    model: ModelSpec, cluster: ClusterSpec, priced: Estimate, opts: ConfigOptions | None = None
) -> dict[str, Any]:
    """The complete DeepSpeed config for the layout `priced` describes (see the module docstring for the
    DeepSpeed facts used). It takes the estimate its caller already made, not the bare layout: the checkpoint
    interval in the `dstk` block comes from the predicted step time, and pricing a layout twice per command
    was the cost model's only second run."""
    opts = opts or ConfigOptions()
    layout = priced.layout
    batch_ranks = layout.tp  # AutoTP peers count in DeepSpeed's batch check (module docstring)
    cfg: dict[str, Any] = {
        "train_batch_size": layout.global_batch_size * batch_ranks,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
        "gradient_clipping": opts.gradient_clipping,
        "zero_optimization": _zero_block(model, cluster, layout, opts),
        "checkpoint": {"tag_validation": "WARN", "load_universal": False, "use_node_local_storage": False},
        **_precision_block(layout),
        **_optimizer_blocks(model, cluster, layout, opts),
        **_logging_blocks(opts),
    }
    ckpt = priced.checkpoint_plan()
    cfg[DSTK_KEY] = {
        "model": model.name,
        "layout": layout.model_dump(),
        "checkpoint_interval_steps": ckpt.interval_steps,
        "checkpoint": {
            "asynchronous": ckpt.asynchronous,
            "snapshot_interval_steps": ckpt.snapshot_interval_steps,
        },
        **cfg.get(DSTK_KEY, {}),
    }
    if layout.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": layout.tp}
    # expert parallelism: DeepSpeed's AutoEP where it runs the family's HF blocks (ArchitectureFacts.expert_parallel);
    # otherwise dstk builds DeepSpeed MoE layers with ep_size in code, from dense models (toolkit/parallel/moe.py)
    # and from HF's own sparse blocks (toolkit/parallel/hf_moe.py), and the config needs no section
    if layout.ep > 1 and model.family.expert_parallel == "autoep":
        cfg["expert_parallel"] = autoep_block(model, layout.ep)
    if layout.sp > 1:
        cfg["sequence_parallel_size"] = layout.sp
    if layout.pp > 1:
        cfg["pipeline"] = {
            "stages": layout.pp,
            "partition": "parameters",
            "seed_layers": False,
            "activation_checkpoint_interval": 1 if layout.recompute == "full" else 0,
        }
    if layout.recompute != "none":
        cfg["activation_checkpointing"] = {
            # DeepSpeed moves checkpoints to the host only on the partitioning path: cpu_checkpointing alone
            # empties the saved input on a synchronized (CPU) accelerator (checkpointing.py:484-495); with tp=1
            # partitioning is a clone, so nothing is lost by turning it on
            "partition_activations": layout.tp > 1 or layout.offload_activations,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": layout.offload_activations,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    if "nvme" in (layout.offload_optimizer, layout.offload_param):
        # DeepSpeed 0.19.8's keys (runtime/swap_tensor/aio_config.py); the older `thread_count` is ignored
        cfg["aio"] = {
            "block_size": 1048576,
            "queue_depth": 8,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
        }
    return cfg


def autoep_block(model: ModelSpec, ep: int) -> dict[str, Any]:
    """DeepSpeed AutoEP's `expert_parallel` section (deepspeed/module_inject/auto_ep_config.py): its preset where
    it has one for the model type (DeepSeek-V2/V3, found by `model_type`), its custom keys otherwise (Llama 4),
    with the router's top-k."""
    keys = dict(model.family.autoep_keys or {})
    if "moe_layer_pattern" in keys:  # the custom preset reads the top-k from here
        keys["top_k"] = model.moe_top_k
    return {"enabled": True, "autoep_size": ep, **keys}


def rebatch(cfg: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """`cfg` for another world size (`dstk launch --elastic`): `layout`'s batch keys — the same global batch,
    the micro-batch and accumulation for its data-parallel degree — and, in a config dstk wrote, `layout` in
    the `dstk` block; every other key as it was."""
    out = {
        **cfg,
        "train_batch_size": layout.global_batch_size * layout.tp,  # AutoTP peers count (build_ds_config)
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.gradient_accumulation_steps,
    }
    block = cfg.get(DSTK_KEY)
    if isinstance(block, dict) and block.get("layout") is not None:
        out[DSTK_KEY] = {**block, "layout": layout.model_dump()}
    return out


def dumps(cfg: dict[str, Any]) -> str:
    """Sorted keys, 2-space indent, trailing newline: generated files diff cleanly."""
    return json.dumps(cfg, sort_keys=True, indent=2) + "\n"


def write(cfg: dict[str, Any], path: Path) -> None:
    """Write atomically, so a failed run never leaves half a config behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dumps(cfg), encoding="utf-8")
    tmp.replace(path)


def recipe_line(ds_config: dict[str, Any]) -> str:
    """One line saying which published recipe the generated optimizer and schedule follow, with the values."""
    dstk_optimizer = read_dstk_block(ds_config).optimizer
    opt = (ds_config.get("optimizer") or {}).get("params") or (
        dstk_optimizer.params.model_dump(exclude_none=True) if dstk_optimizer else {}
    )
    sched = (ds_config.get("scheduler") or {}).get("params", {})
    clip = ds_config.get("gradient_clipping")
    betas = opt.get("betas", recipes.ADAM_BETAS)
    return (
        f"AdamW β=({betas[0]}, {betas[1]}), ε={opt.get('eps', recipes.ADAM_EPS):g}, weight decay "
        f"{opt.get('weight_decay', recipes.WEIGHT_DECAY):g}, clipping {clip}; peak LR {opt.get('lr', 0):.3g} "
        f"(GPT-3 Table 2.1 for the size); linear warm-up {sched.get('warmup_num_steps')} steps "
        f"({recipes.WARMUP_TOKENS / 1e6:.0f}M tokens, at most a tenth of the run) then cosine to "
        f"{sched.get('cos_min_ratio', recipes.MIN_LR_RATIO):g}× over {sched.get('total_num_steps')} steps "
        "(Brown et al. 2020 App. B; Touvron et al. 2023 §2.2)"
    )
