"""DeepSpeed's batch arithmetic and the layout a hand-written config describes.

DeepSpeed derives whichever of `train_batch_size`, `train_micro_batch_size_per_gpu` and
`gradient_accumulation_steps` a config leaves out (runtime/config.py `_set_batch_related_parameters`) and then
asserts `train_batch_size == micro × accumulation × data-parallel ranks`. `resolve_batch` does the same for
every combination, naming the fields and a value that works when it fails; `dstk validate`, `dstk train
--config` and `dstk estimate --config` (`estimate_config`) all go through it, so they agree with DeepSpeed and with each other.
Standard library and the plan half only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.errors import UserError
from toolkit.integrations.ds_auto import AUTO, RunFacts, fill_auto, set_path
from toolkit.integrations.ds_input import integral, type_problems
from toolkit.integrations.dstk_block import read_dstk_block
from toolkit.integrations.targets import get_path
from toolkit.plan.layout import Layout, LayoutRequest, data_parallel_size
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.zero_knobs import ZeroKnobs, deepspeed_default_knobs

if TYPE_CHECKING:
    from toolkit.plan.cost.estimate import Estimate


@dataclass(frozen=True)
class Batch:
    train_batch_size: int
    micro_batch: int
    grad_accum: int


def _around(value: int, unit: int) -> str:
    lo = (value // unit) * unit
    return f"{lo} or {lo + unit}" if lo else f"{unit}"


def _quotient(tbs: int, name: str, given: int, dp: int, ranks: str) -> int:
    """The third batch number from train_batch_size and one other, as DeepSpeed divides (floor, twice)."""
    derived = tbs // given // dp
    if derived == 0 or tbs != given * derived * dp:
        raise UserError(
            f"train_batch_size: {tbs} is not a positive multiple of {name} × {ranks}; use train_batch_size "
            f"{_around(tbs, given * dp)}"
        )
    return derived


def resolve_batch(tbs: int | None, mbs: int | None, gas: int | None, dp: int) -> Batch:
    """The three batch numbers DeepSpeed (runtime/config.py `_set_batch_related_parameters` and
    `_batch_assertion`) derives from whichever of them are set, for `dp` data-parallel ranks, or a UserError
    naming the fields and a value that works. Integer division as DeepSpeed does it, so a non-multiple fails
    here exactly where it fails there."""
    ranks = f"{dp} data-parallel rank{'s' if dp > 1 else ''}"
    if tbs is not None and mbs is not None and gas is not None:
        pass
    elif tbs is not None and mbs is not None:
        gas = _quotient(tbs, f"train_micro_batch_size_per_gpu({mbs})", mbs, dp, ranks)
    elif tbs is not None and gas is not None:
        mbs = _quotient(tbs, f"gradient_accumulation_steps({gas})", gas, dp, ranks)
    elif mbs is not None and gas is not None:
        tbs = mbs * gas * dp
    elif tbs is not None:
        gas, mbs = 1, tbs // dp
        if mbs == 0 or tbs != mbs * dp:
            raise UserError(
                f"train_batch_size: {tbs} is not a positive multiple of the {ranks} "
                f"(micro-batch = train_batch_size / ranks without accumulation); use {_around(tbs, dp)}, or "
                "set train_micro_batch_size_per_gpu"
            )
    elif mbs is not None:
        gas, tbs = 1, mbs * dp
    else:
        raise UserError(
            "train_batch_size, train_micro_batch_size_per_gpu: give at least one (DeepSpeed: 'Either "
            "train_batch_size or train_micro_batch_size_per_gpu needs to be provided')"
        )
    if tbs != mbs * gas * dp:
        fix = f"train_batch_size {mbs * gas * dp}"
        if tbs % (mbs * dp) == 0:
            fix += f" or gradient_accumulation_steps {tbs // (mbs * dp)}"
        raise UserError(
            f"train_batch_size: {tbs} != train_micro_batch_size_per_gpu({mbs}) × gradient_accumulation_steps"
            f"({gas}) × {ranks} = {mbs * gas * dp}; use {fix}"
        )
    return Batch(tbs, mbs, gas)


def config_batch(cfg: dict[str, Any], dp: int) -> Batch:
    """`resolve_batch` over a config's own fields (types already checked)."""
    return resolve_batch(
        *(
            None if (v := cfg.get(k)) is None else int(v)
            for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        ),
        dp,
    )


@dataclass(frozen=True)
class ModelParallel:
    """The job's model parallelism, and the data-parallel ranks DeepSpeed's batch fields count.

    `tp`, `pp`, `sp` are what an mpu hands DeepSpeed (Megatron-DeepSpeed's groups, the PipelineModule's
    stages, Ulysses' sequence groups): DeepSpeed counts world / (tp · pp · sp) ranks. `autotp` is the config's
    `tensor_parallel.autotp_size`: DeepSpeed 0.19.8 builds its config before the AutoTP groups exist, so those
    ranks are *not* divided out (`deepspeed/__init__.py`): train_batch_size counts every TP peer."""

    tp: int = 1
    pp: int = 1
    sp: int = 1
    autotp: int = 1

    @classmethod
    def of(
        cls, cfg: dict[str, Any], tp: int | None = None, pp: int | None = None, sp: int | None = None
    ) -> ModelParallel:
        """The flags where given (a Megatron-DeepSpeed job sets TP and PP in its launch arguments, not in the
        JSON), else what the config says (pipeline.stages, sequence_parallel_size, autotp_size)."""

        def read(path: str) -> int:
            value = get_path(cfg, path)
            return int(value) if integral(value) and value > 0 else 1

        return cls(
            tp=tp or 1,
            pp=pp or read("pipeline.stages"),
            sp=sp or read("sequence_parallel_size"),
            autotp=1 if tp else read("tensor_parallel.autotp_size"),
        )

    @property
    def layout_tp(self) -> int:
        return self.tp * self.autotp

    def data_parallel(self, world_size: int) -> int:
        """The ranks DeepSpeed's batch check counts (see the class docstring)."""
        ranks = self.tp * self.pp * self.sp
        if world_size % (ranks * self.autotp):
            raise UserError(
                f"--world-size: {world_size} is not divisible by tp({self.layout_tp}) × pp({self.pp}) × "
                f"sp({self.sp}) = {ranks * self.autotp}"
            )
        return world_size // ranks


# ---- the layout a config describes ------------------------------------------------------------------------------

# A layout field's "auto" (an HF Trainer/Accelerate config): (the flag that gives it, the value HF uses when the
# training arguments leave it at their default, or None when there is no default and the flag is needed).
# TrainingArguments defaults: gradient_accumulation_steps 1, fp16 = bf16 = False; Accelerate offloads nothing
# unless told; train_batch_size is always computed, and only Accelerate fills the stage.
_LAYOUT_AUTOS: dict[str, tuple[str, str, Any]] = {
    "train_micro_batch_size_per_gpu": ("--micro-batch", "micro_batch_size", None),
    "gradient_accumulation_steps": ("--grad-accum", "gradient_accumulation_steps", 1),
    "train_batch_size": ("--global-batch", "global_batch_size", "derived"),
    "zero_optimization.stage": ("--zero-stage", "zero_stage", None),
    "zero_optimization.offload_optimizer.device": ("--offload-optimizer", "offload_optimizer", "none"),
    "zero_optimization.offload_param.device": ("--offload-param", "offload_param", "none"),
    "fp16.enabled": ("--precision", "precision", False),
    "bf16.enabled": ("--precision", "precision", False),
}


PRECISION_AUTO_NOTE = (
    '{flag}: {path} is "auto" (HF Trainer sets it from its --bf16/--fp16 arguments at run time): priced at the '
    "precision the cluster computes fastest; give --precision to price another"
)


def _fill_layout_autos(
    cfg: dict[str, Any], given: dict[str, Any], flag: str, notes: list[str] | None = None
) -> dict[str, Any]:
    """`cfg` with its layout fields' "auto" replaced as HF would: from the flags given, else HF's default. An
    "auto" precision the flags leave open stays open (the cluster's fastest, as `dstk plan` would pick), said in
    `notes`: HF's default (fp32) is rarely what a config that leaves it "auto" runs, and pricing it silently
    made such configs look 10× slower and "not fit"."""
    out = copy.deepcopy(cfg)
    for path, (option, field, default) in _LAYOUT_AUTOS.items():
        if get_path(cfg, path) != AUTO:
            continue
        if field == "precision" and field not in given:
            set_path(out, path, None)
            out.setdefault("_dstk_precision_open", True)
            note = PRECISION_AUTO_NOTE.format(flag=flag, path="the precision")
            if notes is not None and note not in notes:  # bf16.enabled and fp16.enabled: one note
                notes.append(note)
            continue
        value = given.get(field, default)
        if field == "precision" and field in given:
            value = given[field] == path.split(".")[0]
        if value is None:
            raise UserError(
                f'{flag}: {path} is "auto" (filled by HF Trainer/Accelerate at run time); give {option}'
            )
        set_path(out, path, None if value == "derived" else value)
    return out


def _offload(zero: dict[str, Any], key: str) -> str:
    device = (zero.get(key) or {}).get("device") or "none"
    return device if device in ("cpu", "nvme") else "none"


def request_from_config(
    cfg: dict[str, Any],
    world_size: int,
    parallel: ModelParallel | None = None,
    flag: str = "--config",
    given: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> LayoutRequest:
    """Every layout field a config fixes, read as DeepSpeed reads it: the `dstk` block's layout when dstk wrote
    the file, else the DeepSpeed keys (batch derived as DeepSpeed derives it for this world size). `given`: the
    layout flags set on the command line, which fill "auto" fields as the HF Trainer would; `notes` collects
    what was assumed, for the caller to say once."""
    block = read_dstk_block(cfg).layout
    if block is not None:
        if block.world_size != world_size:
            raise UserError(
                f"{flag}: planned for world size {block.world_size} but the job has {world_size} ranks; "
                "regenerate it with dstk config for this cluster"
            )
        fields = LayoutRequest.model_fields
        return LayoutRequest(**{k: v for k, v in block.model_dump().items() if k in fields})
    # the layout's own "auto" fields from the flags; the others (lr, clipping, …) do not change the layout
    cfg, _, unfilled = fill_auto(_fill_layout_autos(cfg, given or {}, flag, notes), RunFacts())
    precision_open = bool(cfg.pop("_dstk_precision_open", False))
    problems = unfilled + type_problems(cfg)
    if problems:
        raise UserError(f"{flag}: {problems[0]}")
    parallel = parallel or ModelParallel.of(cfg)
    try:
        batch = config_batch(cfg, parallel.data_parallel(world_size))
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None
    if batch.train_batch_size % parallel.autotp:
        raise UserError(
            f"{flag}: train_batch_size: {batch.train_batch_size} counts every AutoTP peer, so it must be a multiple "
            f"of tensor_parallel.autotp_size {parallel.autotp}"
        )
    zero = cfg.get("zero_optimization") or {}
    precision = (
        "bf16" if get_path(cfg, "bf16.enabled") else "fp16" if get_path(cfg, "fp16.enabled") else "fp32"
    )
    precision = None if precision_open and precision == "fp32" else precision
    ep = get_path(cfg, "expert_parallel.autoep_size")
    return LayoutRequest(
        zero_stage=int(zero.get("stage", 0)),
        tp=parallel.layout_tp,
        pp=parallel.pp,
        sp=parallel.sp,
        ep=int(ep) if integral(ep) and ep > 0 else 1,
        micro_batch_size=batch.micro_batch,
        gradient_accumulation_steps=batch.grad_accum,
        global_batch_size=batch.train_batch_size // parallel.autotp,  # sequences: TP peers share theirs
        precision=precision,
        # DeepSpeed's activation_checkpointing section configures checkpointing the model code asks for;
        # dstk writes it only when it recomputes every block
        recompute="full" if cfg.get("activation_checkpointing") else "none",
        # the model code that reads that section calls deepspeed.checkpointing.checkpoint, which is reentrant:
        # whole blocks replayed (dstk's own configs carry the layout in their dstk block instead)
        recompute_early_stop=False if cfg.get("activation_checkpointing") else None,
        offload_optimizer=_offload(zero, "offload_optimizer"),
        offload_param=_offload(zero, "offload_param"),
        offload_activations=bool((cfg.get("activation_checkpointing") or {}).get("cpu_checkpointing")),
        zeropp=bool(zero.get("zero_quantized_weights") or zero.get("zero_quantized_gradients")),
    )


def layout_from_config(cfg: dict[str, Any], world_size: int, parallel: ModelParallel | None = None) -> Layout:
    """The resolved layout `dstk train --config` runs: DeepSpeed's own batch semantics, every field explicit."""
    block = read_dstk_block(cfg).layout
    request = request_from_config(cfg, world_size, parallel)
    if block is not None:
        return block
    dp = data_parallel_size(world_size, request.tp, request.pp, request.sp)
    assert request.global_batch_size is not None and request.gradient_accumulation_steps is not None
    return Layout(
        **request.model_dump(exclude={"global_batch_size", "gradient_accumulation_steps", "precision"}),
        precision=request.precision or "fp32",
        dp=dp,
        world_size=world_size,
        global_batch_size=request.global_batch_size,
        gradient_accumulation_steps=request.gradient_accumulation_steps,
    )


def knobs_from_config(
    cfg: dict[str, Any], layout: Layout, written_by_dstk: ZeroKnobs | None = None
) -> ZeroKnobs:
    """The ZeRO sizes the config sets; for the rest, what DeepSpeed uses (runtime/zero/config.py defaults) —
    or, for a config dstk wrote (`written_by_dstk`: the knobs it derived), the values dstk's own estimate
    assumed for the fields it leaves out because the stage does not read them."""
    zero = cfg.get("zero_optimization") or {}
    default = written_by_dstk if written_by_dstk is not None else deepspeed_default_knobs(layout)
    values = {}
    offload_param = zero.get("offload_param") or {}
    nested = {"nvme_param_buffer_size": "buffer_size", "nvme_max_in_cpu": "max_in_cpu"}
    for name, fallback in default.__dict__.items():
        value = offload_param.get(nested[name]) if name in nested else zero.get(name)
        ok = isinstance(value, bool) if isinstance(fallback, bool) else integral(value) and value >= 0
        values[name] = (bool(value) if isinstance(fallback, bool) else int(value)) if ok else fallback
    return ZeroKnobs(**values)


def estimate_config(
    path: Path,
    model: ModelSpec,
    cluster: ClusterSpec,
    flags: LayoutRequest,
    model_parallel: tuple[int | None, ...] = (),
) -> tuple[Estimate, list[str]]:
    """The estimate of an existing DeepSpeed config for `model` on `cluster`: the layout it fixes (flags set in
    `flags` laid over it; `model_parallel` = the TP/PP/SP a Megatron launch sets) with the ZeRO sizes it sets;
    and the notes on what the config left open and the estimate assumed, for the caller to say once."""
    from toolkit.integrations.ds_input import read_ds_config
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.rules import resolve_layout
    from toolkit.plan.zero_knobs import derive_zero_knobs

    cfg = read_ds_config(path)
    given = flags.model_dump(exclude_unset=True)
    notes: list[str] = []
    parallel = ModelParallel.of(cfg, *model_parallel)
    base = request_from_config(cfg, cluster.world_size, parallel, given=given, notes=notes)
    request = LayoutRequest(**{**base.model_dump(exclude_unset=True), **given})
    layout = resolve_layout(model, cluster, request)
    ours = derive_zero_knobs(model, layout) if read_dstk_block(cfg).layout is not None else None
    return estimate(model, cluster, layout, knobs_from_config(cfg, layout, ours)), notes
