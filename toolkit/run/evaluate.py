"""Held-out evaluation of the engine a Trainer (toolkit.run.loop) drives: the plain engine's forward under
no_grad, or the pipeline engine's own eval schedule."""

from __future__ import annotations

import math
from typing import Any

from toolkit.data.loader import eval_batches
from toolkit.run.loop_state import mean_over_ranks


def evaluate(trainer: Any) -> dict[str, float]:
    """Held-out loss and perplexity. Evaluation draws from its own RNG stream (forked, seeded by the run
    seed), so it neither perturbs training's randomness nor depends on it: a resumed run and an
    uninterrupted one evaluate and continue identically (MoE gates draw random numbers even in eval)."""
    import torch

    assert trainer.eval_data is not None
    devices = [] if trainer.rt.accelerator == "cpu" else [trainer.rt.local_rank]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(trainer.opts.seed + 7919)
        return _evaluate(trainer)


def _evaluate(trainer: Any) -> dict[str, float]:
    import torch

    assert trainer.eval_data is not None
    if trainer.layout.pp > 1:
        return _pipeline_evaluate(trainer)
    trainer.engine.eval()
    total: Any = 0.0  # on the device until the one read at the end
    tokens = 0
    with torch.no_grad():
        for batch in eval_batches(
            trainer.eval_data,
            trainer.layout.micro_batch_size,
            trainer.dp_rank,
            trainer.dp_size,
            trainer.opts.eval_rows,
        ):
            if trainer.sp is not None:  # the micro-batch over the sequence-parallel group (--sp)
                loss_sum, n = trainer.sp.eval_sums(batch)
            else:
                out = trainer.engine(
                    input_ids=trainer.on_device(batch.input_ids), labels=trainer.on_device(batch.labels)
                )
                n = int((batch.labels[:, 1:] != -100).sum())  # a host tensor: no wait
                loss_sum = out.loss.detach().double() * n
            total += loss_sum
            tokens += n
            if trainer.aux_loss is not None:
                trainer.aux_loss.pop()  # evaluation reports the language-model loss alone
    trainer.engine.train()
    loss = mean_over_ranks(total / max(tokens, 1), trainer.rt)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}


def _pipeline_evaluate(trainer: Any) -> dict[str, float]:
    """The pipeline engine's own eval schedule; it averages the micro-batch losses on the last stage and
    broadcasts the result to every stage."""
    batches = [
        (trainer.on_device(b.input_ids), trainer.on_device(b.labels))
        for b in eval_batches(
            trainer.eval_data,
            trainer.layout.micro_batch_size,
            trainer.dp_rank,
            trainer.dp_size,
            trainer.opts.eval_rows,
        )
    ]
    loss = mean_over_ranks(
        trainer.engine.eval_batch(iter(batches), num_micro_batches=len(batches)), trainer.rt
    )
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}
