"""The training loop around a DeepSpeed engine: micro-batches, evaluation, metrics, checkpoints, resume.

Gradient accumulation, clipping and the LR schedule are the engine's (from the config): each micro-batch is
`engine(...)`, `engine.backward(loss)`, `engine.step()`, and the engine applies the optimizer at the
accumulation boundary. dstk adds the data position, evaluation, throughput/MFU/memory metrics and crash-safe
checkpoints (:mod:`toolkit.checkpoint`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.checkpoint import Checkpointer
from toolkit.data.loader import PackedData, TrainLoader, eval_batches
from toolkit.engine_state import held_bytes
from toolkit.layout import Layout
from toolkit.metrics import Logger, Meter, current_rss_bytes, peak_memory_bytes
from toolkit.runtime import Runtime, rng_state, set_rng_state
from toolkit.specs import ModelSpec


@dataclass
class LoopOptions:
    steps: int
    log_every: int = 10
    eval_every: int = 0
    eval_rows: int = 64
    save_every: int = 0
    seed: int = 0
    progress: bool = True
    fault_after_first_shard_at: int | None = None
    """Test-only: abort inside the save of this step, after DeepSpeed wrote its shards."""
    crash_at_step: int | None = None
    """Test-only: kill this process (SIGKILL) right after this step, as a node failure would."""


@dataclass
class Record:
    """What the run measured; written to `summary.json` by rank 0."""

    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    model_states: dict[str, list[int]] = field(default_factory=dict)


def _mean_over_ranks(value: float, rt: Runtime) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / rt.world_size


def _gather(value: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


class Trainer:
    def __init__(
        self,
        engine: Any,
        model: ModelSpec,
        layout: Layout,
        rt: Runtime,
        data_dir: Path,
        run_dir: Path,
        checkpointer: Checkpointer | None,
        opts: LoopOptions,
        peak_flops: float | None,
    ) -> None:
        self.engine, self.model, self.layout, self.rt, self.opts = engine, model, layout, rt, opts
        self.ckpt = checkpointer
        self.run_dir = run_dir
        self.train_data = PackedData(data_dir / "train", opts.seed)
        self.eval_data = (
            PackedData(data_dir / "validation", opts.seed) if (data_dir / "validation").exists() else None
        )
        self.dp_size = rt.world_size // (layout.tp * layout.pp * layout.sp)
        self.dp_rank = rt.rank // (layout.tp * layout.sp) % self.dp_size
        self.step = 0
        self.position = 0
        self.record = Record()
        tokens = layout.global_batch_size * self.train_data.input_ids.shape[1]
        self.meter = Meter(model, rt.world_size, tokens, peak_flops)

    def resume(self, tag: str) -> None:
        assert self.ckpt is not None
        r = self.ckpt.load(self.engine, tag)
        self.step, self.position = r.step, r.position
        if r.client_state.get("rank_state", {}).get("rng"):
            set_rng_state(r.client_state["rank_state"]["rng"])
        self.record.losses = list(r.client_state.get("losses", []))

    def _loader(self) -> TrainLoader:
        return TrainLoader(
            self.train_data,
            self.layout.global_batch_size,
            self.layout.micro_batch_size,
            self.dp_rank,
            self.dp_size,
            position=self.position,
        )

    def _micro_step(self, batch: Any, measure: bool) -> float:
        engine = self.engine
        out = engine(input_ids=batch.input_ids.to(self.rt.device), labels=batch.labels.to(self.rt.device))
        engine.backward(out.loss)
        if measure and engine.is_gradient_accumulation_boundary():
            self.record.model_states["after_backward"] = _gather(held_bytes(engine)["model_states"])
        engine.step()
        return float(out.loss.detach().float())

    def evaluate(self) -> dict[str, float]:
        import torch

        assert self.eval_data is not None
        self.engine.eval()
        total, tokens = 0.0, 0
        with torch.no_grad():
            for batch in eval_batches(
                self.eval_data, self.layout.micro_batch_size, self.dp_rank, self.dp_size, self.opts.eval_rows
            ):
                out = self.engine(
                    input_ids=batch.input_ids.to(self.rt.device), labels=batch.labels.to(self.rt.device)
                )
                n = int((batch.labels[:, 1:] != -100).sum())
                total += float(out.loss.float()) * n
                tokens += n
        self.engine.train()
        loss = _mean_over_ranks(total / max(tokens, 1), self.rt)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def save(self) -> None:
        if self.ckpt is None:
            return
        fault = self.opts.fault_after_first_shard_at == self.step
        self.ckpt.save(
            self.engine,
            self.step,
            self.position,
            {"losses": self.record.losses, "layout": self.layout.model_dump()},
            {"rng": rng_state()},
            fault_after_first_shard=fault,
        )

    def run(self, logger: Logger) -> None:
        loader = self._loader()
        steps = loader.steps()
        while self.step < self.opts.steps:
            micro_batches = next(steps)
            self.meter.start()
            # model states are measured in the second step: Adam creates its moments lazily in the first
            first = self.step == 1 or (self.opts.steps == 1 and self.step == 0)
            losses = [self._micro_step(b, measure=first) for b in micro_batches]
            self.meter.stop()
            if first:
                self.record.model_states["after_step"] = _gather(held_bytes(self.engine)["model_states"])
            self.step += 1
            self.position = loader.position
            loss = _mean_over_ranks(sum(losses) / len(losses), self.rt)
            self.record.losses.append(loss)
            logger.advance()
            if self.step % self.opts.log_every == 0 or self.step == self.opts.steps:
                values = {
                    "loss": loss,
                    "lr": float(self.engine.get_lr()[0]),
                    "rss_bytes": current_rss_bytes(),
                    **self.meter.rates(self.meter.step_times[-1]),
                }
                logger.log(self.step, values)
            if self.opts.eval_every and self.eval_data is not None and self.step % self.opts.eval_every == 0:
                result = self.evaluate()
                self.record.evals.append({"step": self.step, **result})
                logger.log(self.step, result, prefix="eval")
            if self.opts.save_every and self.step % self.opts.save_every == 0:
                self.save()
            if self.opts.crash_at_step == self.step:
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
        steps.close()

    def peak_memory(self) -> list[int]:
        return _gather(peak_memory_bytes(self.rt.accelerator))
