"""DeepSpeed-Ulysses sequence parallelism (`--sp N`) for HF models in `dstk train`.

DeepSpeed 0.19.8's HF integration (`deepspeed/runtime/sequence_parallel/ulysses_sp.py`, Jacobs et al. 2023;
the ALST tutorial) does the parallel part, and dstk uses it as it is:

- `UlyssesSPAttentionHF.register_with_transformers` replaces transformers' "sdpa" attention function with one
  that all-to-alls the sequence-sharded q, k, v into head shards, runs sdpa causally over the whole sequence and
  all-to-alls back. It builds the sequence-parallel groups (`sp` contiguous ranks) and returns them as the
  `mpu` that `deepspeed.initialize(mpu=...)` needs: the engine then counts world / sp data-parallel ranks and
  reduces gradients over the sequence-data-parallel group (all ranks).
- `UlyssesSPDataLoaderAdapter` all-gathers one micro-batch from every rank of a group and yields them one after
  the other, each cut into `sp` contiguous slices of the sequence, `labels` replaced by `shift_labels` shifted
  *before* slicing (so the label at a slice boundary is kept).

What dstk adds, and why:

- Data. The adapter trains each rank's micro-batch once, with the whole group. So rank r of a group keeps
  micro-batches r, r + sp, ... of what its data-parallel rank (rank // sp) reads in a step: together the group
  trains exactly the micro-batches, in the same order and grouping, that one data-parallel rank of a run with
  `--sp 1` and the same global batch trains. dstk's loader already gives every rank of a group the same rows
  (`Trainer.dp_rank` divides by sp), so the global batch is read once per step, whatever sp is. A step must
  have a multiple of sp micro-batches per data-parallel rank (rule `sp_divides_accumulation`).
- Loss. Rank r back-propagates `scale · Σ_{tokens in its slice} CE / N`, N the micro-batch's valid tokens over
  the group (all-reduced without gradient). The partial gradients of the group's ranks then add up to the
  gradient of the micro-batch's mean loss, which is what `--sp 1` back-propagates. What the engine does with
  them depends on the ZeRO stage (measured, see `loss_scale`): stages 0-2 divide the reduced gradient by the
  data-parallel size world / sp, so they *add* the group's gradients (scale 1); ZeRO-3's reduce-scatter
  divides by the whole sequence-data-parallel group, so it *averages* them (scale sp). The tutorial's loss (a
  differentiable all_gather of every slice's mean) back-propagates the full loss on every rank: right at
  ZeRO-3, sp × the gradient at stages 0-2, which AdamW almost hides and SGD, clipping and the gradient norm do
  not. The logged loss is the micro-batch's mean (the same value on every rank of a group).
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError
from toolkit.plan.layout import Layout
from toolkit.plan.sequence_parallel import ulysses_problems
from toolkit.plan.specs import ModelSpec

IGNORE = -100
"""The label HF's loss skips (padding, and the last position, which has no next token)."""


def check_supported(
    spec: ModelSpec, layout: Layout, config: dict[str, Any], batching: Any, lora: str | None
) -> None:
    """One-line UserErrors for what dstk's Ulysses path does not run: the planner's rules (a hand-written
    config reaches `dstk train` without them), and what only the run knows."""
    problems = ulysses_problems(spec, layout, layout.dp)
    if layout.pp > 1 or lora:  # the planner's hf_pipeline_is_data_parallel_only and lora_is_data_parallel
        problems.append(f"--sp: not with pipeline stages or LoRA (pp={layout.pp}, lora={lora})")
    zero = config.get("zero_optimization") or {}
    if layout.zero_stage == 3 and zero.get("reduce_scatter") is False:
        # stage3.py: without reduce-scatter a bucket within reduce_bucket_size is all-reduced and divided by
        # world / sp (SP gradients added), a larger one is averaged over the world: no one loss scale is right
        problems.append(
            "--sp: ZeRO-3 with zero_optimization.reduce_scatter false scales gradients per bucket; set it true"
        )
    if zero.get("zero_quantized_gradients"):
        problems.append("--sp: not with ZeRO++'s quantized gradients (their SP averaging is unverified)")
    if batching is not None:
        problems.append(
            "--sp: not with --token-budget/--curriculum-steps (the adapter gathers micro-batches of equal rows)"
        )
    if problems:
        raise UserError("; ".join(problems))


def register(model: Any, layout: Layout) -> Any:
    """Ulysses attention for `model` (built with SDPA, toolkit.run.models) and the sequence-parallel groups;
    returns DeepSpeed's mpu for `deepspeed.initialize(mpu=...)`. Once per process: DeepSpeed asserts the groups
    do not exist yet, and the new attention replaces transformers' "sdpa" entry for every model."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,  # a model object: heads, kv heads and head_dim from its config
        core_attn_implementation=model.config._attn_implementation,
        sequence_parallel_size=layout.sp,
        micro_batch_size=layout.micro_batch_size,
        seq_length_is_variable=True,  # shapes per forward: unpacked data and the eval batches vary in length
    )


def loss_scale(zero_stage: int, sp: int) -> int:
    """How much more than its share of the micro-batch loss each rank back-propagates so that the engine's
    reduction yields the `--sp 1` gradient (DeepSpeed 0.19.8, measured on 2 gloo ranks: step-0 gradients equal
    to 1.5e-7 at stages 0-3).

    Stages 0-2 divide the all-reduced gradients by world / sp (engine.py `_reduce_non_expert_gradients`,
    stage_1_and_2.py `average_tensor` and `allreduce_bucket`: `dp_world_size / sequence_parallel_size`), so
    the group's gradients add: 1. ZeRO-3 with reduce_scatter (dstk's configs; `check_supported` refuses the
    other) divides by the whole sequence-data-parallel group (`reduce_scatter_coalesced`): sp."""
    return sp if zero_stage == 3 else 1


class SequenceParallel:
    """This rank's place in its sequence-parallel group, and the Ulysses micro-batches and losses of a step."""

    def __init__(self, engine: Any, layout: Layout) -> None:
        from deepspeed.utils import groups

        self.engine = engine
        self.size = groups._get_sequence_parallel_world_size()
        self.rank = groups._get_sequence_parallel_rank()
        self.group = groups._get_sequence_parallel_group()
        if self.size != layout.sp:
            raise UserError(
                f"--sp: the engine has sequence-parallel groups of {self.size}, the layout {layout.sp}"
            )
        self.scale = loss_scale(layout.zero_stage, layout.sp)
        self.vocab_size = int(engine.module.config.get_text_config().vocab_size)

    def step_batches(self, micro_batches: list[Any]) -> list[dict[str, Any]]:
        """A step's micro-batches, as Ulysses slices: this rank's share through the adapter, which yields
        every micro-batch of the group (all of the data-parallel rank's) sliced for this rank."""
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter

        if len(micro_batches) % self.size:  # rule sp_divides_accumulation; a hand-written config may not
            raise UserError(
                f"--sp: {len(micro_batches)} micro-batches per data-parallel rank and step are not a multiple of "
                f"sp({self.size}); raise gradient_accumulation_steps (train_batch_size)"
            )
        mine = [self._with_positions(b) for b in micro_batches[self.rank :: self.size]]
        adapter = UlyssesSPDataLoaderAdapter(
            mine, sp_rank=self.rank, sp_group=self.group, sp_world_size=self.size, device=self.engine.device
        )
        return [next(adapter) for _ in micro_batches]

    def _with_positions(self, batch: Any) -> dict[str, Any]:
        """The adapter's input: input_ids, labels and position_ids (it refuses a batch without them; the
        attention all-gathers them to mask causally), right-padded to a multiple of sp with label -100, which
        changes no real position's output in a causal decoder (toolkit.data.loader)."""
        import torch

        ids, labels = batch.input_ids, batch.labels
        pad = -ids.shape[1] % self.size
        if pad:
            ids = torch.nn.functional.pad(ids, (0, pad), value=0)
            labels = torch.nn.functional.pad(labels, (0, pad), value=IGNORE)
        positions = torch.arange(ids.shape[1]).expand_as(ids).contiguous()
        return {"input_ids": ids, "labels": labels, "position_ids": positions}

    def slice_batch(self, batch: Any) -> dict[str, Any]:
        """This rank's slice of a micro-batch every rank of the group holds (evaluation), cut as the adapter
        cuts: labels shifted over the whole sequence first."""
        import torch

        full = self._with_positions(batch)
        shifted = torch.nn.functional.pad(full.pop("labels"), (0, 1), value=IGNORE)[:, 1:]
        full["shift_labels"] = shifted
        chunk = shifted.shape[1] // self.size
        return {k: v[:, chunk * self.rank : chunk * (self.rank + 1)] for k, v in full.items()}

    def _sums(self, sliced: dict[str, Any]) -> tuple[Any, Any]:
        """(this slice's summed token loss, with grad; [group loss sum, group valid tokens], float64)."""
        import torch
        import torch.distributed as dist

        from toolkit.run.step_sync import to_device

        device = self.engine.device
        labels = to_device(sliced["shift_labels"], device)
        logits = self.engine(
            input_ids=to_device(sliced["input_ids"], device),
            position_ids=to_device(sliced["position_ids"], device),
            use_cache=False,
        ).logits
        loss_sum = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, self.vocab_size),
            labels.reshape(-1),
            ignore_index=IGNORE,
            reduction="sum",
        )
        totals = torch.stack([loss_sum.detach().double(), (labels != IGNORE).sum().double()])
        dist.all_reduce(totals, group=self.group)
        return loss_sum, totals

    def loss(self, sliced: dict[str, Any]) -> tuple[Any, Any]:
        """(what this rank back-propagates, the micro-batch's mean loss to log): see the module docstring."""
        loss_sum, totals = self._sums(sliced)
        tokens = totals[1].clamp(min=1)
        return loss_sum * (self.scale / tokens.float()), (totals[0] / tokens).float()

    def eval_sums(self, batch: Any) -> tuple[float, int]:
        """(summed token loss, valid tokens) of a micro-batch over the group, for held-out evaluation."""
        _, totals = self._sums(self.slice_batch(batch))
        return float(totals[0]), int(totals[1])
