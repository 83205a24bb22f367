"""What the training loop is given and what it records (toolkit.run.loop), and the reductions over ranks its
metrics use."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.data.dynamic import DynamicOptions
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.run.runtime import Runtime
from toolkit.run.stability import Fault, GuardOptions
from toolkit.run.stragglers import RATIO


@dataclass
class LoopOptions:
    steps: int
    log_every: int = 10
    eval_every: int = 0
    eval_rows: int = 64
    eval_only: bool = False
    """Evaluate the (resumed) model once and stop, training nothing."""
    save_every: int = 0
    seed: int = 0
    progress: bool = True
    fault_after_first_shard_at: int | None = None
    """Test-only: abort inside the save of this step, after DeepSpeed wrote its shards."""
    crash_at_step: int | None = None
    """Test-only: SIGKILL rank `crash_rank` right after this step, as a node failure would — only in a run that
    did not resume, so the restarted job gets past it."""
    crash_rank: int = 0
    crash_during: str = "step"
    """Test-only: "step" (after the step), "persist" (inside the asynchronous persist of that step's
    checkpoint) or "after-snapshot" (once that step's shared-memory snapshot is complete)."""
    slow_snapshot_s: float = 0.0
    """Test-only: each shared-memory snapshot's writer waits this long before it reads the live state, so the
    next optimizer step must wait for it (the pipelined save's gate, toolkit.run.async_ckpt)."""
    async_save: bool = False
    """Checkpoints persist in a writer thread after a copy to host memory (toolkit.run.async_ckpt)."""
    snapshot_every: int = 0
    """Shared-memory snapshots every K steps besides the checkpoints (toolkit.run.tiers); 0: none."""
    guard: GuardOptions | None = None
    """The spike guard; it rolls back to checkpoints, so it needs a Checkpointer."""
    faults: tuple[Fault, ...] = ()
    """Test-only: faults to inject (see toolkit.run.stability.Fault)."""
    straggler_ratio: float = RATIO
    """A rank working this many times as long as the others' median, persistently, is named
    (toolkit.run.stragglers)."""
    on_save_error: str = "stop"
    """A checkpoint that cannot be written (full disk, permissions): "stop" the run cleanly at that save, or
    "continue" training and try again at the next (toolkit.run.save_errors)."""
    new_data: bool = False
    """A resume onto other data than the checkpoint's (--new-data): the data position starts at its first row."""
    batching: DynamicOptions | None = None
    """Token-budget batching and/or the sequence-length curriculum (toolkit.data.dynamic); None: fixed
    micro-batches of the config's size."""


@dataclass
class Record:
    """What the run measured; written to `summary.json` by rank 0."""

    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    model_states: dict[str, list[int]] = field(default_factory=dict)
    aux_losses: list[float] = field(default_factory=list)
    """Weighted router losses added to each micro-batch's loss on this rank (MoE models)."""


def means_over_ranks(values: list[Any], rt: Runtime) -> list[float]:
    """The mean over the ranks of each value (numbers or device scalars), in one all-reduce and one read."""
    import torch
    import torch.distributed as dist

    from toolkit.run.step_sync import device_scalar

    # on the accelerator: NCCL reduces device tensors only ("No backend type associated with device type
    # cpu", seen on an H200); gloo takes CPU tensors, which is what the CPU accelerator's device is
    t = torch.stack([device_scalar(v, rt.device) for v in values])
    dist.all_reduce(t)
    return [float(v) / rt.world_size for v in t.tolist()]


def mean_over_ranks(value: Any, rt: Runtime) -> float:
    return means_over_ranks([value], rt)[0]


def begin_step(trainer: Any, item: Any) -> list[Any]:
    """The micro-batches of a Trainer's next step (toolkit.run.loop). A dynamic step also sets the step's
    learning rate — the schedule's rate × the batch's factor (toolkit.data.dynamic.lr_factor) × the spike
    guard's scale, on every rank alike (the plan is global) — and the tokens the throughput figures count."""
    from toolkit.data.dynamic import scheduled_lrs, set_lrs
    from toolkit.data.loader import Step

    if not isinstance(item, Step):
        return item
    assert trainer.batching is not None
    plan = item.plan
    factor = trainer.batching.lr_factor(plan.tokens)
    guard = trainer.guard.lr_scale if trainer.guard is not None else 1.0
    lrs = scheduled_lrs(trainer.engine.lr_scheduler, trainer._initial_lrs)
    rates = set_lrs(trainer.engine.optimizer.param_groups, lrs, factor * guard)
    trainer.meter.tokens_per_step = plan.tokens
    trainer._step_values = {
        "lr": rates[0],
        "lr_factor": factor,
        "tokens": plan.tokens,
        "sequences": plan.rows,
        "seq_length": plan.length,
        "padding_fraction": plan.padding_fraction,
    }
    return item.micro_batches


LEAN_STEPS = 2
"""Steps run with large tensors mmapped (RSS = live memory) before heap reuse is allowed; also the steps the
step-time median leaves out (the first pays JIT and lazy optimizer-state creation, both pay page faults)."""


def gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


@dataclass
class TrainRun:
    model: ModelSpec
    config: dict[str, Any]
    data: Path | None
    run_dir: Path
    checkpoint_dir: Path | None
    resume: str
    init_from: Path | None
    cluster: ClusterSpec | None
    keep_last: int
    loop: LoopOptions
    lora: str | None = None
    """LoRA spec (`r=16,alpha=32`): adapters train, the base stays frozen; from --lora or the config's plan."""
    overwrite_checkpoints: bool = False
    """--overwrite-checkpoints: rank 0 removes the checkpoint folder's earlier checkpoints before step 1."""
