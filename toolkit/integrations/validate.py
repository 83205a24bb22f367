"""Check a DeepSpeed config with DeepSpeed's own config classes for an intended world size, without launching.

`DeepSpeedConfig` reads the world size through `deepspeed.comm.get_world_size()` at construction and silently
assumes 1 when no process group exists; we patch `deepspeed.comm.get_world_size`/`get_rank` for the call, so
its batch arithmetic is checked for the world size the job will really have (pipeline configs go through a
minimal mpu, as `PipelineModule` provides one). DeepSpeed does not reject unknown top-level keys, unknown
optimizer/scheduler names, parameter offload below stage 3 or pipelines with ZeRO-2/3 at config time — the
engine fails later, or ignores them — so dstk checks those itself. Every problem is collected; none stops the
others from being found.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from toolkit.errors import UserError
from toolkit.integrations.dstk_block import DSTK_KEY, read_dstk_block

# Top-level keys DeepSpeed 0.19.8 reads (runtime/config.py and deepspeed.initialize), plus dstk's own block.
KNOWN_TOP_LEVEL = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "managed_gradient_accumulation",
        "steps_per_print",
        "dump_state",
        "disable_python_gc",
        "disable_allgather",
        "communication_data_type",
        "seq_parallel_communication_data_type",
        "prescale_gradients",
        "gradient_predivide_factor",
        "gradient_allreduce_op",
        "zero_optimization",
        "activation_checkpointing",
        "comms_logger",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "gradient_clipping",
        "fp16",
        "bf16",
        "bfloat16",
        "torch_autocast",
        "optimizer",
        "scheduler",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "flops_profiler",
        "wall_clock_breakdown",
        "memory_breakdown",
        "autotuning",
        "use_data_before_expert_parallelism",
        "hybrid_engine",
        "pipeline",
        "data_efficiency",
        "checkpoint",
        "data_types",
        "aio",
        "dataloader_drop_last",
        "log_level",
        "datastates_ckpt",
        "weight_quantization",
        "compile",
        "timers",
        "tensor_parallel",
        "expert_parallel",
        "sequence_parallel_size",
        "data_parallel_size",
        "vocabulary_size",
        DSTK_KEY,
    }
)


class _DataParallelMpu:
    """What DeepSpeedConfig asks an mpu for (runtime/config.py: `mpu.get_data_parallel_world_size()`)."""

    def __init__(self, dp: int) -> None:
        self._dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self._dp


@contextlib.contextmanager
def _world_of(size: int) -> Iterator[None]:
    import deepspeed.comm as ds_comm

    saved = (ds_comm.get_world_size, ds_comm.get_rank)
    ds_comm.get_world_size = lambda group=None: size
    ds_comm.get_rank = lambda group=None: 0
    try:
        yield
    finally:
        ds_comm.get_world_size, ds_comm.get_rank = saved


class _DropAcceleratorNotice:
    """`import deepspeed` on a machine without GPUs warns "Setting accelerator to CPU" on every run; when dstk
    imports DeepSpeed only to parse a config the accelerator is irrelevant, so that one line is dropped."""

    def filter(self, record: object) -> bool:
        return "Setting accelerator to CPU" not in str(getattr(record, "msg", ""))


def _import_deepspeed_quietly() -> None:
    import logging

    logging.getLogger("DeepSpeed").addFilter(_DropAcceleratorNotice())
    import deepspeed  # noqa: F401


def _batch_problem(cfg: dict[str, Any], world_size: int) -> str | None:
    """DeepSpeed's batch assertion, reworded to name the fields and the fix."""
    tbs, mbs = cfg.get("train_batch_size"), cfg.get("train_micro_batch_size_per_gpu")
    gas = cfg.get("gradient_accumulation_steps")
    if not all(isinstance(x, int) and x > 0 for x in (tbs, mbs, gas)):
        return None
    sp = cfg.get("sequence_parallel_size", 1) or 1
    ranks = world_size // _pipeline_stages(cfg) // sp
    if tbs == mbs * gas * ranks:
        return None
    fix = f"train_batch_size {mbs * gas * ranks}"
    if tbs % (mbs * ranks) == 0:
        fix += f" or gradient_accumulation_steps {tbs // (mbs * ranks)}"
    return (
        f"train_batch_size: {tbs} != train_micro_batch_size_per_gpu({mbs}) × gradient_accumulation_steps({gas}) "
        f"× batch ranks({ranks}) = {mbs * gas * ranks} for world size {world_size}; use {fix}"
    )


def _describe(exc: Exception) -> str:
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        parts = [f"{'.'.join(str(x) for x in e['loc']) or exc.title}: {e['msg']}" for e in exc.errors()]
        return f"{exc.title}: " + "; ".join(parts)
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _pipeline_stages(cfg: dict[str, Any]) -> int:
    stages = cfg.get("pipeline", {}).get("stages", 1) if isinstance(cfg.get("pipeline"), dict) else 1
    return stages if isinstance(stages, int) and stages > 0 else 1


def _dstk_checks(cfg: dict[str, Any], world_size: int, accelerator: str | None) -> list[str]:
    """Combinations DeepSpeed accepts at config time but that fail (or silently do nothing) at run time."""
    problems = [
        f"{k}: unknown top-level key (DeepSpeed would silently ignore it)"
        for k in sorted(set(cfg) - KNOWN_TOP_LEVEL)
    ]
    zero = cfg.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    pp = _pipeline_stages(cfg)
    if pp > 1 and stage >= 2:
        problems.append(
            f"pipeline: {pp} stages need zero_optimization.stage 0 or 1 (got {stage}); DeepSpeed's "
            "PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'"
        )
    offload_param = (
        (zero.get("offload_param") or {}).get("device", "none") if isinstance(zero, dict) else "none"
    )
    if offload_param not in (None, "none") and stage != 3:
        problems.append(
            f"zero_optimization.offload_param: needs stage 3 (got {stage}); below it DeepSpeed ignores it"
        )
    offload_opt = (
        (zero.get("offload_optimizer") or {}).get("device", "none") if isinstance(zero, dict) else "none"
    )
    if offload_opt not in (None, "none") and stage == 0:
        problems.append("zero_optimization.offload_optimizer: needs stage 1, 2 or 3 (got 0)")
    try:
        dstk_optimizer = read_dstk_block(cfg).optimizer
    except UserError as exc:
        problems.append(str(exc))
        dstk_optimizer = None
    if dstk_optimizer is not None:
        if stage != 0 or pp > 1:
            problems.append(
                f"{DSTK_KEY}.optimizer: {dstk_optimizer.type} needs zero_optimization.stage 0 and no pipeline"
            )
        if "optimizer" in cfg:
            problems.append(f"optimizer: remove it; {DSTK_KEY}.optimizer already names the optimizer")
    if accelerator == "cpu" and (cfg.get("fp16") or {}).get("enabled"):
        problems.append("fp16.enabled: the CPU accelerator does not support fp16 (use bf16 or fp32)")
    batch = _batch_problem(cfg, world_size)
    if batch:
        problems.append(batch)
    tp = (cfg.get("tensor_parallel") or {}).get("autotp_size", 0) or 1
    if world_size % (tp * pp):
        problems.append(
            f"world size {world_size} is not divisible by autotp_size({tp}) × pipeline stages({pp})"
        )
    return problems


def _engine_checks(ds_cfg: Any) -> list[str]:
    """Names the engine resolves only in deepspeed.initialize (engine.py), checked here up front."""
    import torch
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    problems = []
    opt = ds_cfg.optimizer_name
    if opt is not None and opt not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, opt, None) is None:
        problems.append(
            f"optimizer.type: {opt!r} is not a DeepSpeed optimizer (valid: {', '.join(DEEPSPEED_OPTIMIZERS)} or a torch.optim class)"
        )
    sched = ds_cfg.scheduler_name
    if sched is not None and not (hasattr(lr_schedules, sched) or hasattr(torch.optim.lr_scheduler, sched)):
        problems.append(f"scheduler.type: {sched!r} is not a DeepSpeed or torch LR scheduler")
    if opt and ds_cfg.optimizer_params and "max_grad_norm" in ds_cfg.optimizer_params:
        problems.append("optimizer.params.max_grad_norm: not supported; use top-level gradient_clipping")
    return problems


def validate_config(cfg: Any, world_size: int, accelerator: str | None = None) -> list[str]:
    """Every problem DeepSpeed (and dstk) finds in `cfg` for a job of `world_size` ranks; [] when it is good."""
    if not isinstance(cfg, dict):
        return [f"config: expected a JSON object, got {type(cfg).__name__}"]
    _import_deepspeed_quietly()
    from deepspeed.runtime.config import (
        _REMOVED_TOP_LEVEL_CONFIG_KEYS,
        _REMOVED_ZERO_CONFIG_KEYS,
        DeepSpeedConfig,
        DeepSpeedConfigError,
    )

    cfg = copy.deepcopy(cfg)  # DeepSpeedConfig writes into nested dicts
    problems = [
        f"{k}: {' '.join(str(msg).split())}" for k, msg in _REMOVED_TOP_LEVEL_CONFIG_KEYS.items() if k in cfg
    ]
    for key in _REMOVED_TOP_LEVEL_CONFIG_KEYS:
        cfg.pop(key, None)
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        for key, msg in _REMOVED_ZERO_CONFIG_KEYS.items():
            if key in zero:
                problems.append(f"zero_optimization.{key}: {' '.join(str(msg).split())}")
                zero.pop(key)
    problems += _dstk_checks(cfg, world_size, accelerator)
    pp = _pipeline_stages(cfg)
    mpu = _DataParallelMpu(world_size // pp) if pp > 1 and world_size % pp == 0 else None
    ds_cfg = None
    with _world_of(world_size):
        try:
            ds_cfg = DeepSpeedConfig(cfg, mpu=mpu)
        except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, KeyError, AttributeError) as exc:
            message = _describe(exc)
            if not ("Check batch related parameters" in message and _batch_problem(cfg, world_size)):
                problems.append(message)  # the batch mismatch is already reported, with its fix
    if ds_cfg is not None:
        problems += _engine_checks(ds_cfg)
    return problems
