"""Spike guard: notice a loss or gradient-norm spike, roll back to the last complete checkpoint, skip the data.

Large runs answer training instability this way rather than hoping to recover in place: PaLM (Chowdhery et
al. 2022, §5.1) restarts "from a checkpoint roughly 100 steps before the spike started" and skips "roughly
200–500 data batches that occurred before and during the spike"; OPT-175B (Zhang et al. 2022, §2.5) restarts
from an earlier checkpoint with a lower learning rate. DeepSpeed has no such switch; this module is dstk's.

Detection (:class:`SpikeDetector`, pure) keeps a robust running baseline per signal — the median and the
median absolute deviation (MAD) of the last `window` accepted values of the loss and of the global gradient
norm. A step is anomalous when a signal exceeds median + k·MAD; `patience` consecutive anomalous steps make a
spike; a non-finite loss or gradient norm is one at once. Anomalous values never enter the baseline, so a slow
drift moves the window along while a spike stands out against it, and a falling loss (below its own median)
never triggers. An anomaly opens an episode that closes after `patience` clear steps; inside it no checkpoint
is written and a spike rolls back to before its first step.

Rollback (in :class:`toolkit.run.loop.Trainer`) loads this run's newest complete checkpoint older than the
episode, moves the data position past every row read since (PaLM's skip), multiplies the learning rate by
`lr_factor`, and logs the event. Damage can hide in a checkpoint written after a quiet spell (Adam's moments
after an unclipped gradient look calm for a few steps): a spike before any newer checkpoint exists therefore
rolls back one checkpoint further. `max_rollbacks` bounds the whole thing.

The gradient norm is DeepSpeed's (`engine.get_global_grad_norm()`, the pre-clipping norm its ZeRO and bf16
optimizers compute). A plain torch optimizer at ZeRO-0 reports none, so dstk computes it after the boundary
backward (the gradients are already averaged over the data-parallel ranks), before `engine.step()` clips and
zeroes them. DeepSpeed 0.19.8's ZeRO-1/2/3 and bf16 optimizers *skip* a step whose gradient norm is not finite
(and report it as inf); ZeRO-0 with a torch optimizer applies it and writes NaN into every weight.

Every rank feeds the detector identical all-reduced values (the step's record, toolkit.run.step_sync) and the
detector is deterministic, so every rank reaches the same verdict without a further collective: a rollback and
a deferred checkpoint are collectives, and a rank that disagreed would hang the job. The window is kept on the
host: its inputs arrive in the one record the loop reads per step anyway, so keeping it on the device would
save no wait.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from toolkit.errors import UserError

MIN_HISTORY = 5
"""Accepted steps a baseline needs before its rule is armed (a MAD of fewer values means little)."""
MAD_FLOOR = 1e-3
"""The MAD is floored at this fraction of the median, so a flat signal does not flag rounding noise."""
SPIKE_SCALE = 1e4
"""The test-only `spike` fault multiplies the step's gradients by this."""


@dataclass(frozen=True, kw_only=True)
class GuardOptions:
    window: int = 50
    """Accepted steps in each running baseline."""
    mads: float = 6.0
    """A value above median + mads·MAD of its baseline is anomalous."""
    patience: int = 3
    """Consecutive anomalous steps that make a spike; a non-finite loss or gradient norm is one at once."""
    lr_factor: float = 1.0
    """Multiplies the learning rate after every rollback (OPT's answer to divergence); 1 keeps it."""
    max_rollbacks: int = 3
    """Rollbacks allowed in one run; the next spike stops it."""

    def __post_init__(self) -> None:
        if self.window < MIN_HISTORY:
            raise UserError(
                f"--spike-window: {self.window} < {MIN_HISTORY} (a baseline needs that many steps)"
            )
        if not self.mads > 0:
            raise UserError(f"--spike-mads: must be positive, got {self.mads}")
        if self.patience < 1:
            raise UserError(f"--spike-steps: must be at least 1, got {self.patience}")
        if not 0 < self.lr_factor <= 1:
            raise UserError(f"--spike-lr-factor: must be in (0, 1], got {self.lr_factor}")
        if self.max_rollbacks < 0:
            raise UserError(f"--max-rollbacks: must not be negative, got {self.max_rollbacks}")


class RobustBaseline:
    """Median and MAD of the last `window` values: a handful of outliers moves neither."""

    def __init__(self, window: int, values: list[float] | None = None) -> None:
        self.values: deque[float] = deque(values or [], maxlen=window)

    def add(self, value: float) -> None:
        self.values.append(value)

    def stats(self) -> tuple[float, float]:
        median = statistics.median(self.values)
        return median, statistics.median(abs(v - median) for v in self.values)

    def limit(self, mads: float) -> float | None:
        """The value above which a new one is anomalous; None while the history is too short."""
        if len(self.values) < MIN_HISTORY:
            return None
        median, mad = self.stats()
        return median + mads * max(mad, MAD_FLOOR * abs(median))


@dataclass(frozen=True)
class Verdict:
    spike: bool
    """Roll back now."""
    suspect: bool
    """An anomaly episode is open: this state must not become a checkpoint."""
    episode_start: int | None = None
    """First anomalous step of the open episode; the rollback target must precede it."""
    reason: str = ""


CLEAR = Verdict(spike=False, suspect=False)


class SpikeDetector:
    """The decision rule alone (no torch, no processes): feed it one step at a time.

    An anomalous step opens an *episode* that stays open until `patience` clear steps in a row have passed.
    While it is open the state is suspect (no checkpoint is taken), and a spike rolls back to before its first
    step: one wild step, a quiet one, then a sustained rise must not leave the rollback target inside the
    damage the wild step did.
    """

    def __init__(self, opts: GuardOptions) -> None:
        self.opts = opts
        self.baselines = {"loss": RobustBaseline(opts.window), "grad_norm": RobustBaseline(opts.window)}
        self.streak = 0
        """Consecutive anomalous steps."""
        self.clear = 0
        """Consecutive clear steps since the episode's last anomaly."""
        self.episode_start: int | None = None

    def observe(self, step: int, loss: float, grad_norm: float | None) -> Verdict:
        values = {"loss": loss, "grad_norm": grad_norm}
        high = []
        for name, value in values.items():
            if value is None:
                continue
            if not math.isfinite(value):
                start = self.episode_start or step
                return Verdict(True, True, start, f"non-finite {name} ({value}) at step {step}")
            limit = self.baselines[name].limit(self.opts.mads)
            if limit is not None and value > limit:
                high.append(f"{name} {value:.4g} > {limit:.4g}")
        if high:
            self.streak, self.clear = self.streak + 1, 0
            self.episode_start = self.episode_start or step
            reason = f"{', '.join(high)} at step {step}, {self.streak} anomalous step(s) in a row"
            return Verdict(self.streak >= self.opts.patience, True, self.episode_start, reason)
        self.streak = 0
        for name, value in values.items():
            if value is not None:
                self.baselines[name].add(value)
        if self.episode_start is not None:
            self.clear += 1
            if self.clear >= self.opts.patience:
                self.reset()
        return Verdict(False, self.episode_start is not None, self.episode_start)

    def reset(self) -> None:
        self.streak, self.clear, self.episode_start = 0, 0, None

    def state(self) -> dict[str, list[float]]:
        return {name: list(b.values) for name, b in self.baselines.items()}

    def load_state(self, state: dict[str, list[float]]) -> None:
        for name, values in state.items():
            self.baselines[name] = RobustBaseline(self.opts.window, values)


# --- test-only fault injection -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A fault the tests inject (`--inject-fault STEP[+]:nan|spike|slow[=S][@RANK][,first-run]`).

    `slow` sleeps half a second (`slow=S`: S seconds) before each step it fires on and changes nothing else:
    a run a test can signal mid-step and still compare, loss for loss, with one that was never slowed.

    `nan` makes the step's loss NaN: its gradients are NaN, clipping cannot help (the norm is NaN), and at
    ZeRO-0 Adam writes NaN into every weight. `spike` multiplies the step's gradients by 1e4 and lets them
    past gradient clipping for that one step. Through clipping (1.0) a scaled gradient is harmless: it is cut
    to the norm of every other step (the test model's norms are ≈1.2, so every step is clipped) and the run
    stays bit-identical to the clean one (measured with torch's AdamW on the test model). Unclipped, it
    poisons Adam's second moment — v grows ×1e8 and decays with β2 = 0.95 over hundreds of steps — so the first
    moment keeps pushing along that one batch's gradient for ~20 steps while every later gradient is damped
    ~2000×: the loss stops falling and the gradient norm climbs to 2–3× its baseline within five steps. On the
    2-rank test run (36 steps, fault at 24) the final held-out loss ends 13 % above the clean run's.

    STEP names the data the fault is tied to: the rows that step STEP of an uninterrupted run consumes, as a
    bad batch would be, so a rollback that skips them escapes it. `STEP+` fires on every step from STEP on,
    whatever the data: a fault no rollback escapes (the budget test).
    """

    step: int
    kind: Literal["nan", "spike", "slow"]
    persistent: bool = False
    rank: int | None = None
    """`slow@RANK`: only that rank sleeps (a straggler, toolkit.run.stragglers); None: every rank."""
    seconds: float = 0.5
    """How long `slow` sleeps before each step."""
    first_run: bool = False
    """`,first-run`: only in a run that did not resume (a job slowed until it is stopped, then resumed fast)."""

    @classmethod
    def parse(cls, given: str) -> Fault:
        text, comma, only = given.partition(",")
        if comma and only != "first-run":
            text = ""  # refused below
        step, _, kind = text.partition(":")
        kind, at, rank = kind.partition("@")
        kind, eq, seconds = kind.partition("=")
        if eq and (kind != "slow" or not seconds.replace(".", "", 1).isdigit()):
            kind = ""  # refused below
        persistent = step.endswith("+")
        step = step.removesuffix("+")
        if (
            kind not in ("nan", "spike", "slow")
            or not step.isdigit()
            or int(step) < 1
            or (at and (kind != "slow" or not rank.isdigit()))
        ):
            raise UserError(
                f"--inject-fault: expected STEP[+]:nan|spike|slow[=S][@RANK][,first-run] with STEP >= 1 (=S, @RANK: slow only), "
                f"got {given!r}"
            )
        wait = float(seconds) if eq else 0.5
        return cls(int(step), kind, persistent, int(rank) if at else None, wait, bool(comma))  # type: ignore[arg-type]

    def fires(self, step: int, start_row: int, global_batch: int) -> bool:
        """Whether it hits the step numbered `step` that starts at data row `start_row`."""
        if self.persistent:
            return step >= self.step
        return start_row == (self.step - 1) * global_batch


def crash_if_asked(opts: Any, step: int, resumed: bool, rank: int) -> None:
    """`--crash-at-step` (test-only): SIGKILL this rank right after `step`, as a node failure would, in a run
    that did not resume (so the restarted job gets past it)."""
    if opts.crash_at_step == step and opts.crash_during == "step" and not resumed and rank == opts.crash_rank:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def corrupt(loss: Any, fault: Fault) -> Any:
    """The loss to back-propagate under `fault`."""
    return loss * (math.nan if fault.kind == "nan" else SPIKE_SCALE)


@contextlib.contextmanager
def unclipped(engine: Any) -> Iterator[None]:
    """Gradient clipping off for one `engine.step()` (test-only). ZeRO-0 reads the engine's config each step;
    the ZeRO and bf16 optimizers keep their own `clip_grad`."""
    config, optimizer = engine._config, engine.optimizer
    saved = config.gradient_clipping, getattr(optimizer, "clip_grad", None)
    config.gradient_clipping = 0.0
    if saved[1] is not None:
        optimizer.clip_grad = 0.0
    try:
        yield
    finally:
        config.gradient_clipping = saved[0]
        if saved[1] is not None:
            optimizer.clip_grad = saved[1]


# --- the engine side -----------------------------------------------------------------------------------------


def engine_reports_grad_norm(engine: Any) -> bool:
    """DeepSpeed's ZeRO and bf16 optimizers compute the global norm; a plain torch optimizer does not."""
    return hasattr(engine.optimizer, "_global_grad_norm")


def engine_grad_norm(engine: Any) -> Any:
    """The engine's pre-clipping global norm of the last step as the engine holds it — a device tensor at
    ZeRO-1/2/3 and in the bf16 optimizer, a number after an overflow, None when it computes none — so reading
    it costs no wait here; DeepSpeed's invalid-norm sentinel (-1) becomes inf where the record is read
    (toolkit.run.step_sync)."""
    return engine.get_global_grad_norm()


def local_grad_norm(engine: Any) -> Any:
    """L2 norm of the module's gradients, after the boundary backward and before `engine.step()`, as a device
    scalar. DeepSpeed's own helper sums over model-parallel ranks (engine.mpu) and marks a non-finite norm
    as -1."""
    from deepspeed.runtime.utils import get_global_norm_of_tensors

    grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return get_global_norm_of_tensors(grads, mpu=engine.mpu)


class SpikeGuard:
    """The detector, the learning-rate scale and the rollback budget of one run."""

    def __init__(self, opts: GuardOptions, engine: Any) -> None:
        self.opts = opts
        self.detector = SpikeDetector(opts)
        self.lr_scale = 1.0
        self.rollbacks = 0
        self.base_lrs = [group["lr"] for group in engine.optimizer.param_groups]
        """The configured rates, for runs without a scheduler to recompute them from."""

    def check(self, step: int, loss: float, grad_norm: float | None) -> Verdict:
        """The verdict for this step. Every rank reaches the same one without a collective: its inputs are the
        all-reduced record every rank reads (toolkit.run.step_sync), and the detector is deterministic."""
        return self.detector.observe(step, loss, grad_norm)

    def after_rollback(self, engine: Any) -> None:
        self.rollbacks += 1
        self.lr_scale *= self.opts.lr_factor
        self.detector.reset()
        self.apply_lr(engine)

    def apply_lr(self, engine: Any) -> None:
        """Scale the rates the scheduler just set (DeepSpeed's schedulers recompute absolute rates from their
        step count, so the scale is applied after every step, and never compounds)."""
        if self.lr_scale == 1.0:
            return
        scheduler = engine.lr_scheduler
        lrs = scheduler.get_lr() if scheduler is not None else self.base_lrs
        for group, lr in zip(engine.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr * self.lr_scale

    def report(self, logger: Any, event: dict[str, Any], skipped_steps: int) -> None:
        """A rollback, to `events.jsonl`, the metrics and monitors (split "guard"), and one line for the user."""
        numbers = {
            "rolled_back_to": event["rolled_back_to"],
            "skipped_steps": skipped_steps,
            "lr_scale": self.lr_scale,
            "rollbacks": self.rollbacks,
        }
        logger.event({**event, **numbers, "action": "rollback"})
        logger.log(event["step"], numbers, prefix="guard")
        logger.rewind(event["rolled_back_to"])
        first, last = event["skipped_rows"]
        logger.message(
            f"spike guard: {event['reason']}; rolled back to step {event['rolled_back_to']}, skipped rows "
            f"{first}-{last} ({skipped_steps} steps), lr x{self.lr_scale:g} "
            f"(rollback {self.rollbacks} of {self.opts.max_rollbacks})"
        )

    def state(self) -> dict[str, Any]:
        return {"lr_scale": self.lr_scale, "rollbacks": self.rollbacks, "baselines": self.detector.state()}

    def load_state(self, state: dict[str, Any], engine: Any) -> None:
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.rollbacks = int(state.get("rollbacks", 0))
        self.detector.load_state(state.get("baselines", {}))
        self.apply_lr(engine)


def rollback_tag(ckpt: Any, steps: Iterable[int], before: int) -> str:
    """The newest complete checkpoint among `steps` (this run's own) older than step `before`; rank 0 decides
    and broadcasts, so every rank loads the same one."""
    import torch.distributed as dist

    from toolkit.run.checkpoint import check, tag_for

    box: list[str | None] = [None]
    if ckpt.rank == 0:
        for step in sorted(set(steps), reverse=True):
            # sizes only: this process wrote these files moments ago; pruning may have removed them
            if step < before and check(ckpt.dir / tag_for(step), verify_hashes=False) is None:
                box = [tag_for(step)]
                break
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        raise UserError(
            f"--spike-guard: no complete checkpoint of this run before step {before} to roll back to; "
            "checkpoint more often (--save-every) or keep more (--keep-last)"
        )
    return box[0]
