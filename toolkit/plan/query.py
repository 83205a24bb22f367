"""What the planner is asked: the dimensions the user pinned, the batch, the memory margin, the rule scopes.

A field left at None is searched; a field with a value is pinned, and the planner considers only layouts with
that value. Typed (instead of a dict of whatever flags were set) so that a misspelt dimension is an error where
the query is made, not a constraint the search silently ignores, and so that `dstk plan`, `dstk config --plan`,
`dstk grow`'s re-plan and the scaling table all ask the planner the same way.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolkit.errors import UserError
from toolkit.plan.fp8_support import block_scaled_refusal, hardware_problem
from toolkit.plan.layout import LayoutRequest, OffloadDevice, Optimizer, Recompute, default_precision
from toolkit.plan.specs import ClusterSpec, Precision

DEFAULT_MARGIN = 0.10
"""Fraction of accelerator memory kept free for allocator fragmentation and transient peaks."""
DEFAULT_SCOPES = ("layout", "deepspeed")
"""Rule scopes of a plan for the DeepSpeed engine; ("layout", "megatron") plans for Megatron-DeepSpeed."""

RECOMPUTE = ("none", "selective", "full")
"""The recomputations the planner searches: `ops` (torchtitan's op-level policy) prices FSDP runs only."""
SEARCHED = (
    "zero_stage",
    "tp",
    "pp",
    "sp",
    "ep",
    "etp",
    "moe_dispatcher",
    "micro_batch_size",
    "recompute",
    "offload_optimizer",
    "offload_param",
    "offload_activations",
    "zeropp",
)
"""The dimensions the planner searches (and explains its choice along), in the order it reports them."""


class PlanQuery(BaseModel):
    """One question to the planner. Every layout dimension is optional: None means "search it"."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    zero_stage: Literal[0, 1, 2, 3] | None = None
    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    sp: int | None = Field(default=None, gt=0)
    ep: int | None = Field(default=None, gt=0)
    etp: int | None = Field(default=None, gt=0)
    """Searched (1 or TP) for Megatron-Core plans of MoE models; DeepSpeed's experts have none."""
    moe_dispatcher: Literal["alltoall", "allgather", "deepep", "hybridep"] | None = None
    """Searched (alltoall or hybridep) for Megatron-Core plans with expert parallelism."""
    micro_batch_size: int | None = Field(default=None, gt=0)
    recompute: Recompute | None = None
    recompute_early_stop: bool | None = None
    """None: what the runtime's checkpoint does (Layout.recompute_stops_early)."""
    offload_optimizer: OffloadDevice | None = None
    offload_param: OffloadDevice | None = None
    offload_activations: bool | None = None
    zeropp: bool | None = None
    precision: Precision | None = None
    """None: the cluster's fastest precision (`default_precision`)."""
    optimizer: Optimizer | None = None
    lora: str | None = None
    fused_kernels: bool | None = None
    """None: fused for Megatron-DeepSpeed plans, eager HF modules for the DeepSpeed engine."""
    flash_attention: bool | None = None
    """None: what the runtime runs (`toolkit.plan.cost.activations.flash_attention`)."""
    tp_sequence_parallel: bool | None = None
    tp_vocab_parallel: bool | None = None
    global_batch_size: int | None = Field(default=None, gt=0)
    """None: GPT-3's batch for the model size (`default_global_batch`)."""
    margin: float = Field(default=DEFAULT_MARGIN, ge=0, lt=1)
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    allow_fp8: bool = Field(
        default=False,
        description="weigh fp8 (the linear layers' GEMMs in FP8, the rest bf16) against the cluster's default "
        "precision and keep it where it is faster and fits; needs FP8 tensor cores (Ada, Hopper and newer) and "
        "no --precision",
    )

    def precisions(self, cluster: ClusterSpec) -> list[Precision]:
        """The precisions the search tries: the pinned one, else the cluster's fastest, and fp8 beside it with
        `allow_fp8` (one line when the flags contradict each other or the cluster has no FP8)."""
        if self.precision is not None:
            if self.allow_fp8:
                raise UserError(f"--allow-fp8: --precision {self.precision} pins the precision; drop one")
            problem = block_scaled_refusal(cluster, self.precision, self.scopes)
            if problem:  # the same for every layout: said once, not per rule of the search
                raise UserError(problem)
            return [self.precision]
        default = default_precision(cluster)
        if not self.allow_fp8:
            return [default]
        problem = hardware_problem(cluster)
        if problem:
            raise UserError(f"--allow-fp8: {problem}")
        return [default, "fp8"]

    @classmethod
    def pinning(cls, request: LayoutRequest, **search: Any) -> PlanQuery:
        """The flags set on `request` (its `model_fields_set`) pinned; everything else searched.

        `gradient_accumulation_steps` is not a dimension of the search: the planner derives it from the
        global batch, the micro-batch and the data-parallel degree of each layout it tries."""
        from toolkit.plan.layout import LAYOUT_FLAGS

        pins = request.model_dump(exclude_unset=True)
        pins.pop("gradient_accumulation_steps", None)
        # knobs that price other stacks' published runs (FSDP, Megatron-Core's overlap, interleaving, block-
        # interval checkpointing): the planner neither searches nor keeps them, so a pin would be dropped
        unplanned = [
            LAYOUT_FLAGS.get(k, k) for k, v in pins.items() if v is not None and k not in cls.model_fields
        ]
        if pins.get("recompute", RECOMPUTE[0]) not in RECOMPUTE:
            unplanned.append(f"--recompute {pins['recompute']}")
        if unplanned:
            raise UserError(
                f"{', '.join(unplanned)}: the planner neither searches nor pins "
                f"{'this knob' if len(unplanned) == 1 else 'these knobs'}; price a layout with "
                f"{'it' if len(unplanned) == 1 else 'them'} with dstk estimate"
            )
        return cls(**{k: v for k, v in pins.items() if v is not None}, **search)

    def pins(self) -> dict[str, Any]:
        """The pinned layout dimensions by field name (what a re-run of the same query must pass as flags)."""
        search = {"global_batch_size", "margin", "scopes", "allow_fp8"}
        return {k: v for k, v in self.model_dump().items() if v is not None and k not in search}

    def options(self, name: str, values: list[Any]) -> list[Any]:
        """`values` for a searched dimension; the one pinned value otherwise."""
        value = getattr(self, name)
        return list(values) if value is None else [value]

    def relaxed_offload(self) -> PlanQuery:
        """This query with the offload dimensions searched again (for "drop the --offload-* flags" hints)."""
        return self.model_copy(
            update={"offload_optimizer": None, "offload_param": None, "offload_activations": None}
        )

    @property
    def offload_allowed(self) -> bool:
        return (
            self.offload_optimizer != "none"
            or self.offload_param != "none"
            or self.offload_activations is not False
        )
