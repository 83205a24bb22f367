"""The `dstk` block of a DeepSpeed config dstk wrote — what DeepSpeed does not know and `dstk train` needs (the
layout, dstk's own 1-bit optimizers, the planned checkpoint interval) — typed, and read in one place.
DeepSpeed ignores unknown top-level keys, so the block travels inside the JSON; a config without one is read
by `ds_layout.layout_from_config` from its DeepSpeed keys."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, model_validator

from toolkit.errors import UserError
from toolkit.plan.layout import Layout

DSTK_KEY = "dstk"
_STRICT = ConfigDict(frozen=True, extra="forbid")

Positive = Annotated[StrictInt | StrictFloat, Field(gt=0)]
NonNegative = Annotated[StrictInt | StrictFloat, Field(ge=0)]
Beta = Annotated[StrictInt | StrictFloat, Field(ge=0, lt=1)]
Steps = Annotated[StrictInt, Field(ge=1)]


class _AdamParams(BaseModel):
    """AdamW's hyper-parameters plus the compression's; unset ones take the optimizer's defaults."""

    model_config = _STRICT

    lr: Positive | None = None
    betas: tuple[Beta, Beta] | None = None
    eps: Positive | None = None
    weight_decay: NonNegative | None = None
    scale_block: Annotated[StrictInt, Field(gt=0, multiple_of=8)] | None = None
    """Elements per compression scale (a positive multiple of 8), or null for one scale per chunk."""
    freeze_step: Steps | None = None
    """Warm-up steps of plain Adam before compression (for 0/1 Adam: its `var_freeze_step`)."""


class OneBitAdamParams(_AdamParams):
    pass


class ZeroOneAdamParams(_AdamParams):
    var_freeze_step: Steps | None = None
    var_update_scaler: Steps | None = None
    local_step_scaler: Steps | None = None
    local_step_clipper: Steps | None = None

    @model_validator(mode="after")
    def _one_freeze(self) -> ZeroOneAdamParams:
        if self.freeze_step is not None and self.var_freeze_step is not None:
            raise ValueError("freeze_step: give freeze_step or var_freeze_step, not both")
        return self


class OneBitAdamSpec(BaseModel):
    model_config = _STRICT
    type: Literal["onebit-adam"]
    params: OneBitAdamParams = OneBitAdamParams()


class ZeroOneAdamSpec(BaseModel):
    model_config = _STRICT
    type: Literal["zero-one-adam"]
    params: ZeroOneAdamParams = ZeroOneAdamParams()


DstkOptimizer = Annotated[OneBitAdamSpec | ZeroOneAdamSpec, Field(discriminator="type")]


class CheckpointTiers(BaseModel):
    """How `dstk train` checkpoints by default (toolkit.run.tiers): asynchronous persists and the interval of
    shared-memory snapshots, from the planner (toolkit.plan.checkpoint_interval)."""

    model_config = _STRICT

    asynchronous: bool = False
    """Copy to host memory, persist in a writer thread (`dstk train --async-save`)."""
    snapshot_interval_steps: int = Field(default=0, ge=0)
    """Shared-memory snapshots every K steps (`dstk train --snapshot-every`); 0: none."""


class DstkBlock(BaseModel):
    """What `dstk config` writes under the config's `dstk` key."""

    model_config = _STRICT

    model: str | None = None
    """The model the config was planned for (its name)."""
    layout: Layout | None = None
    """The resolved layout, every field explicit."""
    checkpoint_interval_steps: int = Field(default=0, ge=0)
    """The planner's Young/Daly checkpoint interval, the default of `dstk train --save-every`."""
    checkpoint: CheckpointTiers = Field(default_factory=CheckpointTiers)
    """The planned checkpoint tiers; absent: synchronous checkpoints only."""
    optimizer: DstkOptimizer | None = None
    """dstk's 1-bit Adam / 0/1 Adam (DeepSpeed 0.19.7 removed its own), built by toolkit.parallel.onebit."""


def read_dstk_block(cfg: dict[str, Any]) -> DstkBlock:
    """The config's `dstk` block (empty when absent: a hand-written config), or one line naming the bad field."""
    raw = cfg.get(DSTK_KEY)
    if raw is None:
        return DstkBlock()
    if not isinstance(raw, dict):
        raise UserError(f"{DSTK_KEY}: expected a mapping, got {type(raw).__name__}")
    return _build(raw)


def read_dstk_optimizer(spec: Any) -> OneBitAdamSpec | ZeroOneAdamSpec:
    """A `dstk.optimizer` block on its own (what toolkit.parallel.onebit.build_optimizer takes)."""
    if isinstance(spec, OneBitAdamSpec | ZeroOneAdamSpec):
        return spec
    if not isinstance(spec, dict):
        raise UserError(
            f"{DSTK_KEY}.optimizer: expected a mapping with type and params, got {type(spec).__name__}"
        )
    block = _build({"optimizer": spec})
    assert block.optimizer is not None
    return block.optimizer


_KINDS = {"onebit-adam": OneBitAdamSpec, "zero-one-adam": ZeroOneAdamSpec}
_UNION_MEMBERS = {"int", "float", "constrained-int", "constrained-float", "tuple[...]"}


def _build(raw: dict[str, Any]) -> DstkBlock:
    """DstkBlock from the config's mapping; every problem as `dstk.<key path>: <what is wrong>`, one line."""
    try:
        return DstkBlock.model_validate(raw)
    except ValidationError as exc:
        parts: dict[str, str] = {}
        for err in exc.errors():
            union = any(str(x) in _UNION_MEMBERS for x in err["loc"])
            loc = [str(x) for x in err["loc"] if str(x) not in _UNION_MEMBERS]
            model: type[BaseModel] = DstkBlock
            path = []
            for key in loc:
                if key in _KINDS and path == ["optimizer"]:
                    model = _KINDS[key]
                    continue
                path.append(key)
                field = model.model_fields.get(key)
                inner = getattr(field, "annotation", None) if field else None
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
            if "betas" in path:
                path = path[: path.index("betas") + 1]
            where = ".".join([DSTK_KEY, *path])
            if where in parts:
                continue
            if err["type"] == "union_tag_invalid":
                line = f"{where}.type: {err['ctx']['tag']!r} is not one of {', '.join(_KINDS)}"
            elif path[-1:] == ["betas"]:
                line = f"{where}: expected two numbers in [0, 1) (got {err.get('input')!r})"
            elif union and err["type"] in ("int_type", "float_type"):
                line = f"{where}: expected a number (got {err.get('input')!r})"
            elif err["type"] == "extra_forbidden":
                line = f"{where}: unknown field; valid: {', '.join(model.model_fields)}"
            elif err["type"] == "value_error":
                line = str(err["ctx"]["error"])
                line = line if line.startswith(DSTK_KEY) else f"{where}.{line}"
            else:
                line = f"{where}: {err['msg'].lower()} (got {err.get('input')!r})"
            parts[where] = line
        raise UserError("; ".join(parts.values())) from None
