"""Check a DeepSpeed config with DeepSpeed's own config classes for an intended world size, without launching.

`DeepSpeedConfig` reads the world size through `deepspeed.comm.get_world_size()` at construction and silently
assumes 1 when no process group exists; we patch `deepspeed.comm.get_world_size`/`get_rank` for the call, so
its batch arithmetic is checked for the world size the job will really have, and an mpu gives it the
data-parallel size as the engine's TP/PP groups would (world / tp·pp·sp). The file is first made sense of as
`ds_input` describes ("auto" fields, types DeepSpeed reads raw, batch arithmetic with the fix), and judged for
the target accelerator rather than the host (GPUDirect Storage needs CUDA; fp16 is refused on CPU). DeepSpeed does not reject unknown top-level keys, unknown
optimizer/scheduler names, parameter offload below stage 3 or pipelines with ZeRO-2/3 at config time — the
engine fails later, or ignores them — so dstk checks those itself. Every problem is collected; none stops the
others from being found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from toolkit.errors import UserError
from toolkit.integrations.ds_auto import RunFacts, fill_auto
from toolkit.integrations.ds_input import type_problems
from toolkit.integrations.ds_layout import ModelParallel, config_batch
from toolkit.integrations.dstk_block import DSTK_KEY, read_dstk_block
from toolkit.plan.layout import data_parallel_size

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


def _describe(exc: Exception) -> str:
    import pydantic

    if isinstance(exc, pydantic.ValidationError):
        parts = [f"{'.'.join(str(x) for x in e['loc']) or exc.title}: {e['msg']}" for e in exc.errors()]
        return f"{exc.title}: " + "; ".join(parts)
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _unknown_keys(cfg: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings) for top-level keys DeepSpeed does not read: a near miss of a known key is a typo that
    silently loses a setting; anything else (`_comment`, another tool's section) is only ignored."""
    import difflib

    problems, warnings = [], []
    for key in sorted(set(cfg) - KNOWN_TOP_LEVEL):
        close = difflib.get_close_matches(key.strip(), KNOWN_TOP_LEVEL, n=1, cutoff=0.8)
        if close:
            problems.append(
                f"{key}: unknown top-level key; did you mean {close[0]}? (DeepSpeed would ignore it)"
            )
        else:
            warnings.append(f"{key}: not a DeepSpeed key; DeepSpeed ignores it")
    return problems, warnings


def _ignored(cfg: dict[str, Any]) -> list[str]:
    """Settings DeepSpeed accepts and then does not apply: what the file says is not what will run."""
    zero = cfg.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    offload_param = (zero.get("offload_param") or {}).get("device", "none")
    if offload_param not in (None, "none") and stage != 3:
        return [
            f"zero_optimization.offload_param: needs stage 3 (got {stage}); below it DeepSpeed ignores it"
        ]
    return []


def _dstk_checks(cfg: dict[str, Any], parallel: ModelParallel, accelerator: str) -> list[str]:
    """Combinations DeepSpeed accepts at config time but that fail at run time."""
    problems, _ = _unknown_keys(cfg)
    zero = cfg.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0))
    pp = parallel.pp
    if pp > 1 and stage >= 2:
        problems.append(
            f"pipeline: {pp} stages need zero_optimization.stage 0 or 1 (got {stage}); DeepSpeed's "
            "PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'"
        )
    offload_opt = (zero.get("offload_optimizer") or {}).get("device", "none")
    if offload_opt not in (None, "none") and stage == 0:
        problems.append("zero_optimization.offload_optimizer: needs stage 1, 2 or 3 (got 0)")
    try:
        block = read_dstk_block(cfg)
    except UserError as exc:
        problems.append(str(exc))
        block = None
    dstk_optimizer = block.optimizer if block else None
    if block and block.layout and block.layout.precision == "fp8":
        # FP8 lives in the linear layers dstk train converts; the engine itself must run bf16, on CUDA
        if not (cfg.get("bf16") or {}).get("enabled"):
            problems.append(
                f"bf16.enabled: {DSTK_KEY}.layout is fp8, which trains in bf16 around its FP8 GEMMs"
            )
        if accelerator != "cuda":
            problems.append(
                f"{DSTK_KEY}.layout: fp8 needs FP8 tensor cores on CUDA, not the {accelerator} accelerator"
            )
    if dstk_optimizer is not None:
        if stage != 0 or pp > 1:
            problems.append(
                f"{DSTK_KEY}.optimizer: {dstk_optimizer.type} needs zero_optimization.stage 0 and no pipeline"
            )
        if "optimizer" in cfg:
            problems.append(f"optimizer: remove it; {DSTK_KEY}.optimizer already names the optimizer")
    if accelerator == "cpu" and (cfg.get("fp16") or {}).get("enabled"):
        problems.append("fp16.enabled: the CPU accelerator does not support fp16 (use bf16 or fp32)")
    return problems


_ONEBIT_HINT = (
    "dstk has its own: dstk config --optimizer {} writes it into the config's dstk block for dstk train"
)
_REMOVED_ONEBIT = {
    "onebitadam": _ONEBIT_HINT.format("onebit-adam"),
    "zerooneadam": _ONEBIT_HINT.format("zero-one-adam"),
    "onebitlamb": "dstk has no 1-bit LAMB; use --optimizer onebit-adam, or lamb without compression",
}


def _engine_checks(ds_cfg: Any) -> list[str]:
    """Names the engine resolves only in deepspeed.initialize (engine.py), checked here up front."""
    import torch
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    problems = []
    opt = ds_cfg.optimizer_name
    replacement = _REMOVED_ONEBIT.get(str(opt).lower().replace("_", ""))
    if replacement is not None:
        problems.append(
            f"optimizer.type: {opt!r} was removed from DeepSpeed (its 1-bit optimizers are gone since 0.19); "
            + replacement
        )
    elif opt is not None and opt not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, opt, None) is None:
        problems.append(
            f"optimizer.type: {opt!r} is not a DeepSpeed optimizer (valid: {', '.join(DEEPSPEED_OPTIMIZERS)} or a torch.optim class)"
        )
    sched = ds_cfg.scheduler_name
    if sched is not None and not (hasattr(lr_schedules, sched) or hasattr(torch.optim.lr_scheduler, sched)):
        problems.append(f"scheduler.type: {sched!r} is not a DeepSpeed or torch LR scheduler")
    if opt and ds_cfg.optimizer_params and "max_grad_norm" in ds_cfg.optimizer_params:
        problems.append("optimizer.params.max_grad_norm: not supported; use top-level gradient_clipping")
    return problems


# DeepSpeed's own words for the batch problems `ds_layout.resolve_batch` reports with a fix (runtime/config.py)
_BATCH_MESSAGES = (
    "Check batch related parameters",
    "Either train_batch_size or train_micro_batch_size_per_gpu",
    "Gradient accumulation steps:",
    "Micro batch size per gpu:",
    "Train batch size:",
)


@dataclass(frozen=True)
class Problem:
    text: str
    by: Literal["deepspeed", "dstk"]
    """`deepspeed`: DeepSpeed refuses it (its config classes, on the target accelerator); `dstk`: DeepSpeed
    accepts the file, but `deepspeed.initialize` or the engine fails on it later, or silently ignores it."""


@dataclass
class Verdict:
    """Every problem found, and a note for each "auto" (or autotuning) field saying who fills it."""

    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What DeepSpeed accepts and ignores: not a refusal, but the file does not do all it says."""

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.problems]

    def add(self, by: Literal["deepspeed", "dstk"], texts: list[str]) -> None:
        self.problems += [Problem(t, by) for t in texts]


def validate_config(
    cfg: Any,
    world_size: int,
    accelerator: str = "cuda",
    parallel: ModelParallel | None = None,
    facts: RunFacts | None = None,
) -> Verdict:
    """Every problem DeepSpeed (and dstk) finds in `cfg` for a job of `world_size` ranks on `accelerator`.

    `parallel` gives TP/PP/SP when the launch sets them (Megatron-DeepSpeed), else the config's own;
    `facts` fill "auto" fields as HF Trainer/Accelerate would. Problems never stop each other from being found,
    except that wrong types stop the checks that would trip over them."""
    verdict = Verdict()
    if not isinstance(cfg, dict):
        verdict.add("deepspeed", [f"config: expected a JSON object, got {type(cfg).__name__}"])
        return verdict
    _import_deepspeed_quietly()
    from deepspeed.runtime.config import (
        _REMOVED_TOP_LEVEL_CONFIG_KEYS,
        _REMOVED_ZERO_CONFIG_KEYS,
        DeepSpeedConfig,
        DeepSpeedConfigError,
    )

    cfg, verdict.notes, unfilled = fill_auto(
        cfg, facts or RunFacts()
    )  # a copy: DeepSpeedConfig writes into it
    verdict.add("dstk", unfilled)
    removed = [
        f"{k}: {' '.join(str(msg).split())}" for k, msg in _REMOVED_TOP_LEVEL_CONFIG_KEYS.items() if k in cfg
    ]
    for key in _REMOVED_TOP_LEVEL_CONFIG_KEYS:
        cfg.pop(key, None)
    zero = cfg.get("zero_optimization")
    if isinstance(zero, dict):
        for key, msg in _REMOVED_ZERO_CONFIG_KEYS.items():
            if key in zero:
                removed.append(f"zero_optimization.{key}: {' '.join(str(msg).split())}")
                zero.pop(key)
    verdict.add("deepspeed", removed)
    wrong_types = type_problems(cfg)
    verdict.add("deepspeed", wrong_types)
    if wrong_types:
        return verdict
    parallel = parallel or ModelParallel.of(cfg)
    try:
        dp = parallel.data_parallel(world_size)
        config_batch(cfg, dp)
        batch_ok = True
    except UserError as exc:
        verdict.add("deepspeed", [str(exc)])
        dp, batch_ok = max(data_parallel_size(world_size, parallel.tp, parallel.pp, parallel.sp), 1), False
    aio = cfg.get("aio")
    if isinstance(aio, dict) and aio.get("use_gds") and accelerator != "cuda":
        # aio_config.py asserts get_accelerator().device_name() == 'cuda': judged for the target, not the host
        verdict.add(
            "deepspeed", [f"aio.use_gds: GPUDirect Storage needs the cuda accelerator, not {accelerator}"]
        )
    if isinstance(aio, dict) and aio.get("use_gds"):
        aio["use_gds"] = False
    verdict.add("dstk", _dstk_checks(cfg, parallel, accelerator))
    verdict.warnings = _unknown_keys(cfg)[1] + _ignored(cfg)
    ds_cfg = None
    with _world_of(world_size):
        try:
            ds_cfg = DeepSpeedConfig(cfg, mpu=_DataParallelMpu(dp))
        except (DeepSpeedConfigError, AssertionError, ValueError, TypeError, KeyError, AttributeError) as exc:
            message = _describe(exc)
            if batch_ok or not any(m in message for m in _BATCH_MESSAGES):
                verdict.add("deepspeed", [message])  # a batch problem is already reported, with its fix
    if ds_cfg is not None:
        verdict.add("dstk", _engine_checks(ds_cfg))
    return verdict


def problems_without_deepspeed(cfg: dict[str, Any], accelerator: str, parallel: ModelParallel) -> list[str]:
    """What `validate_config` refuses that needs no DeepSpeed import (`dstk estimate --config` may not import
    it): dstk's own checks, and DeepSpeed's rule that fp16 and bf16 are not both on (runtime/config.py
    asserts it). The batch arithmetic is checked where the estimate reads the batch (`config_batch`)."""
    if type_problems(cfg):  # said where the estimate reads the config, with what DeepSpeed needs
        return []
    fp16, bf16 = (cfg.get(key) or {} for key in ("fp16", "bf16"))
    both = isinstance(fp16, dict) and isinstance(bf16, dict) and fp16.get("enabled") is True
    problems = []
    if both and bf16.get("enabled") is True:
        problems.append("fp16.enabled, bf16.enabled: both true; DeepSpeed refuses that (keep one)")
    return problems + _dstk_checks(cfg, parallel, accelerator)
