"""Dynamic batching: token-budget micro-batches, the learning rate scaled to each step's batch, and a
sequence-length curriculum — planned step by step from the loader's position, so resumption stays exact.

Why dstk plans the batches itself rather than calling DeepSpeed's
`get_dataloader_and_lr_scheduler_for_variable_batch_size_deepspeed` (runtime/data_pipeline/data_sampling/
variable_batch_size_and_lr.py, 0.19.8), which the engine never calls on its own although the config parses
`data_efficiency.data_sampling.dynamic_batching`:

- it plans a whole epoch up front from every sample's length held as Python tuples, and its search
  (`batch_by_seqlens`) rescans the rest of the dataset for every micro-batch: measured on this machine,
  1,000 / 2,000 / 4,000 lengths take 0.27 / 1.9 / 14.8 s — cubic, so a million documents would take years;
- its loader is a torch DataLoader over a DistributedSampler with no position: a resumed run starts the
  epoch again, and the plan is the same every epoch (one fixed seed), while dstk's loader resumes from one
  integer and reshuffles each epoch;
- `max_tokens` bounds the sum of the lengths, not the padded tensor a micro-batch becomes (one 500-token and
  nine 50-token sequences "hold" 950 tokens but pad to 5,000), and with its default picking order
  ("dataloader") sequences are grouped in dataset order, so padding is whatever the order gives;
- it counts the batch in sequences relative to `train_batch_size` sequences: a token budget of short
  sequences would multiply the learning rate by their count.

What dstk keeps from it: DeepSpeed's `scale_lr` (the linear/sqrt arithmetic) and its `CurriculumScheduler`
(the `fixed_linear` schedule of the data-efficiency `seqlen` metric).

The plan of a step is a pure function of (position, step): the rows the step reads are the next contiguous run
of the row stream (epoch e = the seeded permutation of the split for seed + e, epochs back to back), as many
as fill exactly `micro_batches` micro-batches. Every rank computes the same global plan and takes its share,
so every rank runs the same number of micro-steps per optimizer step (the engine counts accumulation
boundaries in micro-steps; a rank with one micro-step more would hang the collectives).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # numpy is imported where it is used: `dstk train --help` builds on DynamicOptions
    import numpy as np

LrScaling = Literal["linear", "sqrt", "none"]
DIFFICULTY_STEP = 8
"""Curriculum lengths are multiples of 8 (DeepSpeed's `difficulty_step` advice, for Tensor Cores)."""


class DynamicOptions(BaseModel):
    """What the user asks for (`dstk train` flags, or the config's `dynamic_batching` block)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    token_budget: int | None = Field(default=None, gt=0)
    """Tokens per micro-batch, counted as the padded tensor (sequences × the longest); None: the config's
    micro-batch of sequences."""
    max_sequences: int | None = Field(default=None, gt=0)
    """Most sequences in one micro-batch (DeepSpeed's `max_batch_size`); None: as many as the budget holds."""
    lr_scaling: LrScaling = "sqrt"
    """How the learning rate follows the step's tokens relative to the config's batch of full sequences."""
    curriculum_steps: int = Field(default=0, ge=0)
    """Steps over which the sequence length grows to the full length; 0: no curriculum."""
    curriculum_start: int = Field(default=DIFFICULTY_STEP, ge=1)
    """The sequence length of the first step (raised to a multiple of 8)."""

    @property
    def active(self) -> bool:
        return self.token_budget is not None or self.curriculum_steps > 0


LABELS = {
    "token_budget": "--token-budget (dynamic_batching.max_tokens)",
    "lr_scaling": "--lr-scaling (dynamic_batching.lr_scaling_method)",
    "max_sequences": "dynamic_batching.max_batch_size",
    "curriculum_steps": "--curriculum-steps",
    "curriculum_start": "--curriculum-start",
}


def dynamic_options(config: dict[str, Any], given: dict[str, Any]) -> DynamicOptions | None:
    """The run's dynamic batching: `dstk train` flags (`given`, by field name) over the DeepSpeed config's
    `data_efficiency.data_sampling.dynamic_batching` block, which DeepSpeed parses but its engine never applies
    — dstk does: with `enabled`, `max_tokens` is the token budget, `lr_scaling_method` the rule and
    `max_batch_size` the most sequences per micro-batch. None when nothing asks for dynamic batching."""
    from toolkit.errors import UserError
    from toolkit.plan.load import build

    sampling = (config.get("data_efficiency") or {}).get("data_sampling") or {}
    block = sampling.get("dynamic_batching") or {}
    from_config: dict[str, Any] = {}
    if block.get("enabled"):
        if block.get("max_tokens") is None:
            raise UserError(
                "--config: data_efficiency.data_sampling.dynamic_batching.max_tokens: required when enabled"
            )
        from_config = {
            "token_budget": block["max_tokens"],
            "lr_scaling": block.get("lr_scaling_method"),
            "max_sequences": block.get("max_batch_size"),
        }
    merged = {k: v for k, v in {**from_config, **given}.items() if v is not None}
    options = build(DynamicOptions, merged, "train", labels=LABELS)
    return options if options.active else None


@dataclass(frozen=True)
class Curriculum:
    """Sequence-length warmup (Li, Zhang & He 2022, "The Stability-Efficiency Dilemma: Investigating Sequence
    Length Warmup for Training GPT Models", arXiv:2108.06084): step t trains on sequences truncated to
    `length(t)`, growing linearly from `start` to `full` over `steps` steps.

    Why here and not in DeepSpeed's config: 0.19.8 rejects the top-level `curriculum_learning` block (whose
    engine passed `curriculum_seqlen` to the model's forward; removed, DeepSpeed issue #8489), and applies
    `data_efficiency.data_sampling.curriculum_learning` only inside its own DeepSpeedDataLoader
    (`deepspeed.initialize(training_data=...)` / `engine.deepspeed_io`), never to batches fed to
    `engine(...)`. That loader's DeepSpeedDataSampler needs the DataAnalyzer's index files, draws global
    batches of a fixed number of samples on rank 0 and broadcasts them, selects samples by difficulty rather
    than truncating them (truncation needs a user `post_process_func`), and checkpoints numpy's global RNG
    state while it samples from its own Generator, so a resumed run draws other batches.

    The arithmetic is DeepSpeed's `CurriculumScheduler` with schedule `fixed_linear` (what its
    `data_efficiency.data_sampling.curriculum_learning` `seqlen` metric uses), evaluated at the 0-based step,
    so the first step trains at `start` (rounded up to a multiple of 8) as in Li et al.; dstk adds the snap to
    the full length from step `steps` on, which DeepSpeed's floor to a multiple of `difficulty_step` never
    reaches when the full length is not such a multiple.
    """

    steps: int
    full: int
    start: int = DIFFICULTY_STEP

    def __post_init__(self) -> None:
        from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

        scheduler = CurriculumScheduler(
            {
                "min_difficulty": min(self.start, self.full),
                "max_difficulty": self.full,
                "schedule_type": "fixed_linear",
                "schedule_config": {
                    "total_curriculum_step": self.steps,
                    "difficulty_step": DIFFICULTY_STEP,
                },
            }
        )
        object.__setattr__(self, "_scheduler", scheduler)

    def length(self, step: int) -> int:
        """The sequence length of optimizer step `step` (0-based)."""
        if step >= self.steps:
            return self.full
        return min(int(self._scheduler.get_difficulty(step)), self.full)  # type: ignore[attr-defined]


def lr_factor(tokens: int, reference_tokens: int, rule: LrScaling) -> float:
    """The learning-rate multiplier of a step holding `tokens` real tokens, for a schedule tuned on batches of
    `reference_tokens` (the config's train_batch_size × the data's sequence length).

    linear: Goyal et al. 2017 ("Accurate, Large Minibatch SGD", the linear scaling rule, for SGD); sqrt:
    Krizhevsky 2014 and Hoffer et al. 2017 ("Train longer, generalize better") for SGD, and Malladi et al. 2022
    ("On the SDEs and Scaling Rules for Adaptive Gradient Algorithms") for Adam — dstk's default, as its
    configs use Adam(W). The arithmetic is DeepSpeed's own `scale_lr`. The batch is counted in tokens, not
    sequences: the language-model loss averages over tokens, and with a token budget the number of sequences
    per step swings with their length while the tokens stay near the budget.
    """
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import scale_lr

    return float(scale_lr(reference_tokens, tokens, base_lr=1.0, method=rule))


@dataclass(frozen=True, kw_only=True)
class Batching:
    """The resolved batching of a run: options plus the layout and data facts they act on."""

    micro_batches: int
    """Micro-batches per optimizer step over all data-parallel ranks (dp × gradient accumulation)."""
    gradient_accumulation: int
    seq_length: int
    """The data's full sequence length (the manifest's seq_length)."""
    reference_tokens: int
    """Tokens of the batch the config's learning rate is for: train_batch_size × seq_length."""
    rows_per_micro_batch: int
    """Sequences per micro-batch without a token budget (the config's micro-batch)."""
    token_budget: int | None = None
    max_sequences: int | None = None
    curriculum: Curriculum | None = None
    lr_scaling: LrScaling = "sqrt"
    seed: int = 0

    def length(self, step: int) -> int:
        return self.curriculum.length(step) if self.curriculum else self.seq_length

    def lr_factor(self, tokens: int) -> float:
        return lr_factor(tokens, self.reference_tokens, self.lr_scaling)


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step over all ranks."""

    rows: int
    """Rows of the stream the step consumes (the loader's position advances by this)."""
    groups: list[np.ndarray]
    """Row ids of each micro-batch; data-parallel rank r takes groups[r·gas : (r+1)·gas]."""
    length: int
    """Sequences are truncated to this many tokens (the curriculum's length, or the full length)."""
    tokens: int
    """Real tokens after truncation, all ranks."""
    padded_tokens: int
    """Positions of the padded micro-batch tensors, all ranks."""

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.tokens / self.padded_tokens

    def share(self, dp_rank: int, gradient_accumulation: int) -> list[np.ndarray]:
        return self.groups[dp_rank * gradient_accumulation : (dp_rank + 1) * gradient_accumulation]


class Stream:
    """The rows of a split in training order: epoch e is `order(e)`, epochs back to back, so a position (rows
    consumed) names one place in it and a step may run across an epoch boundary without losing rows."""

    def __init__(self, n_rows: int, order: Callable[[int], np.ndarray]) -> None:
        self.n_rows, self._order = n_rows, order
        self._cache: dict[int, np.ndarray] = {}

    def _epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = self._order(epoch)
        return self._cache[epoch]

    def take(self, start: int, count: int) -> np.ndarray:
        import numpy as np

        parts, pos, end = [], start, start + count
        while pos < end:
            epoch, offset = divmod(pos, self.n_rows)
            n = min(end - pos, self.n_rows - offset)
            parts.append(self._epoch(epoch)[offset : offset + n])
            pos += n
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _cuts(lengths_desc: np.ndarray, budget: int, max_sequences: int | None, limit: int) -> list[int]:
    """Group ends of greedy bucketing over lengths sorted longest first: each micro-batch takes as many of the
    longest remaining sequences as fit `budget` padded to the first (longest) of them. Stops after `limit` + 1
    groups. Greedy is optimal here (an exchange argument: some optimal grouping puts the longest sequences
    with the longest), so the number of groups never falls as sequences are added."""
    cuts, i, n = [], 0, len(lengths_desc)
    while i < n and len(cuts) <= limit:
        take = budget // int(lengths_desc[i])
        if max_sequences is not None:
            take = min(take, max_sequences)
        i = min(n, i + take)
        cuts.append(i)
    return cuts


def _plan_budget(
    stream: Stream, lengths: np.ndarray, position: int, cap: int, b: Batching
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The longest run of the stream from `position` that fills exactly `micro_batches` budgeted micro-batches
    (exponential then binary search over its length; each probe sorts the run)."""
    import numpy as np

    assert b.token_budget is not None and b.token_budget >= cap
    m = b.micro_batches

    def window(n: int) -> tuple[np.ndarray, np.ndarray]:
        rows = stream.take(position, n)
        return rows, np.minimum(lengths[rows], cap)

    def groups_of(n: int) -> int:
        _, lens = window(n)
        return len(_cuts(np.sort(lens)[::-1], b.token_budget, b.max_sequences, m))

    lo = m  # m sequences, one per micro-batch, always fit: every truncated length is <= cap <= budget
    hi = max(lo + 1, m * (b.token_budget // cap))
    while groups_of(hi) <= m:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if groups_of(mid) <= m else (lo, mid)
    rows, lens = window(lo)
    order = np.argsort(-lens, kind="stable")
    cuts = _cuts(lens[order], b.token_budget, b.max_sequences, m)
    assert len(cuts) == m, f"{len(cuts)} micro-batches planned, {m} needed"  # see _cuts: never fewer
    return rows, [rows[order[s:e]] for s, e in zip([0, *cuts[:-1]], cuts, strict=True)]


def plan_step(stream: Stream, lengths: np.ndarray, position: int, step: int, b: Batching) -> StepPlan:
    """The rows and micro-batches of optimizer step `step`, which starts at stream position `position`.

    With a token budget the step takes as many rows as fill `micro_batches` micro-batches of at most
    `token_budget` padded tokens; without one, `micro_batches × rows_per_micro_batch` rows. Either way the rows
    are sorted by (truncated) length and cut into micro-batches of similar lengths — bucketing as in Vaswani et
    al. 2017 §5.1, "sentence pairs were batched together by approximate sequence length" — and the
    micro-batches are dealt to the ranks in a seeded random order, so no rank always gets the longest.
    """
    import numpy as np

    cap = b.length(step)
    if b.token_budget is not None:
        rows, groups = _plan_budget(stream, lengths, position, cap, b)
    else:
        rows = stream.take(position, b.micro_batches * b.rows_per_micro_batch)
        order = np.argsort(-np.minimum(lengths[rows], cap), kind="stable")
        groups = list(rows[order].reshape(b.micro_batches, b.rows_per_micro_batch))
    deal = np.random.default_rng([b.seed, step]).permutation(len(groups))
    groups = [groups[i] for i in deal]
    truncated = [np.minimum(lengths[g], cap) for g in groups]
    return StepPlan(
        rows=len(rows),
        groups=groups,
        length=cap,
        tokens=int(sum(t.sum() for t in truncated)),
        padded_tokens=int(sum(len(t) * t.max() for t in truncated)),
    )


def scheduled_lrs(scheduler: Any, initial: list[float]) -> list[float]:
    """The rates the LR schedule gives the next optimizer step, before any scaling. DeepSpeed's schedulers
    compute absolute rates from their step count (`get_lr()`), so scaling the optimizer's rates never
    compounds; before their first step, or without a scheduler, the rates the optimizer started with."""
    if scheduler is None or getattr(scheduler, "last_batch_iteration", 0) < 0:
        return list(initial)
    return list(scheduler.get_lr())


def set_lrs(param_groups: list[dict[str, Any]], lrs: list[float], factor: float) -> list[float]:
    """Give each parameter group its scheduled rate × `factor`; returns the rates set."""
    rates = [lr * factor for lr in lrs]
    for group, rate in zip(param_groups, rates, strict=True):
        group["lr"] = rate
    return rates


def resolve(
    options: DynamicOptions,
    *,
    seq_length: int,
    dp: int,
    gradient_accumulation: int,
    micro_batch: int,
    pipeline_stages: int,
    seed: int,
) -> Batching:
    """The Batching of a run, or a UserError naming the flag that cannot work with this data and layout."""
    from toolkit.errors import UserError

    flag = "--token-budget" if options.token_budget is not None else "--curriculum-steps"
    if pipeline_stages > 1:
        raise UserError(
            f"{flag}: not with pipeline parallelism (pp={pipeline_stages}): dstk builds its PipelineModule "
            "without dynamic_shape, so DeepSpeed sizes the stage-to-stage buffers once, from the first micro-batch"
        )
    if options.token_budget is not None and options.token_budget < seq_length:
        raise UserError(
            f"--token-budget: {options.token_budget} tokens do not hold one sequence of the data's seq_length "
            f"({seq_length}); give at least {seq_length}"
        )
    if options.curriculum_steps and options.curriculum_start > seq_length:
        raise UserError(
            f"--curriculum-start: {options.curriculum_start} exceeds the data's seq_length ({seq_length})"
        )
    micro_batches = dp * gradient_accumulation
    curriculum = None
    if options.curriculum_steps:
        curriculum = Curriculum(
            steps=options.curriculum_steps, full=seq_length, start=options.curriculum_start
        )
    return Batching(
        micro_batches=micro_batches,
        gradient_accumulation=gradient_accumulation,
        seq_length=seq_length,
        reference_tokens=micro_batches * micro_batch * seq_length,
        rows_per_micro_batch=micro_batch,
        token_budget=options.token_budget,
        max_sequences=options.max_sequences,
        curriculum=curriculum,
        lr_scaling=options.lr_scaling,
        seed=seed,
    )
