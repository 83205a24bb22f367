"""The spike guard's rollback (toolkit.run.stability) applied to a running Trainer (toolkit.run.loop)."""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError
from toolkit.run.stability import Verdict, rollback_tag


def roll_back(trainer: Any, verdict: Verdict, logger: Any) -> None:
    """Back to this run's newest checkpoint before the anomalous streak began, with the data position moved
    past everything read since (PaLM's recipe: the batches before and during the spike are skipped)."""
    assert trainer.guard is not None
    guard, spike_step, skip_to = trainer.guard, trainer.step, trainer.position
    event: dict[str, Any] = {
        "event": "spike",
        "step": spike_step,
        "reason": verdict.reason,
        "episode_start": verdict.episode_start,
    }
    if guard.rollbacks >= guard.opts.max_rollbacks:
        logger.event({**event, "action": "stop", "rollbacks": guard.rollbacks})
        raise UserError(
            f"--max-rollbacks: a spike after {guard.rollbacks} rollback(s) ({verdict.reason}): the run does "
            f"not recover; lower the learning rate (--spike-lr-factor) or inspect the data "
            f"(see {trainer.run_dir / 'events.jsonl'})"
        )
    before = verdict.episode_start or spike_step
    if trainer._rolled_back_to is not None and trainer._rolled_back_to < before:
        before = trainer._rolled_back_to
        event["escalated"] = True  # it spiked again before a new checkpoint: one further back
    trainer._load(rollback_tag(trainer.ckpt, trainer.saved_steps, before))
    trainer.channel.forget_timeline()
    trainer._rolled_back_to = trainer.step
    skipped = [trainer.position, skip_to]
    trainer.position = skip_to
    trainer.record.evals = [e for e in trainer.record.evals if e["step"] <= trainer.step]
    guard.after_rollback(trainer.engine)
    event.update(rolled_back_to=trainer.step, skipped_rows=skipped)
    # steps of data skipped: rows / global batch, or (dynamic batches vary in rows) the steps undone
    gb = trainer.layout.global_batch_size
    guard.report(
        logger, event, (skip_to - skipped[0]) // gb if trainer.batching is None else spike_step - trainer.step
    )
