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


@dataclass
class Record:
    """What the run measured; written to `summary.json` by rank 0."""

    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    model_states: dict[str, list[int]] = field(default_factory=dict)
    aux_losses: list[float] = field(default_factory=list)
    """Weighted router losses added to each micro-batch's loss on this rank (MoE models)."""


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
        aux_loss: Any = None,
    ) -> None:
        self.engine, self.model, self.layout, self.rt, self.opts = engine, model, layout, rt, opts
        self.compressed_optimizer: Any = None
        """dstk's 1-bit Adam / 0/1 Adam when the config asks for it; its error-feedback buffers are per rank
        and DeepSpeed saves only rank 0's optimizer state at ZeRO-0, so they travel in dstk's rank files."""
        self.aux_loss = aux_loss
        """Router load-balancing losses of dstk's MoE layers (toolkit.moe.AuxLoss), added to the LM loss."""
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
        self.resumed = False
        self.record = Record()
        tokens = layout.global_batch_size * self.train_data.input_ids.shape[1]
        self.meter = Meter(model, rt.world_size, tokens, peak_flops)

    def resume(self, tag: str) -> None:
        assert self.ckpt is not None
        r = self.ckpt.load(self.engine, tag)
        self.step, self.position = r.step, r.position
        self.resumed = True
        rank_state = r.client_state.get("rank_state", {})
        if rank_state.get("rng"):
            set_rng_state(rank_state["rng"])
        if self.compressed_optimizer is not None and rank_state.get("compressed_optimizer"):
            self.compressed_optimizer.load_rank_state(rank_state["compressed_optimizer"])
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
        loss = out.loss
        if self.aux_loss is not None:
            aux = self.aux_loss.pop()
            self.record.aux_losses.append(float(aux.detach()))
            loss = loss + aux
        engine.backward(loss)
        if measure and engine.is_gradient_accumulation_boundary():
            self.record.model_states["after_backward"] = _gather(held_bytes(engine)["model_states"])
        engine.step()
        return float(out.loss.detach().float())

    def _pipeline_step(self, micro_batches: list[Any]) -> float:
        """One optimizer step of the pipeline engine: it pulls the micro-batches itself (1F1B schedule)."""
        batches = iter([(b.input_ids.to(self.rt.device), b.labels.to(self.rt.device)) for b in micro_batches])
        return float(self.engine.train_batch(data_iter=batches))

    def evaluate(self) -> dict[str, float]:
        """Held-out loss and perplexity. Evaluation draws from its own RNG stream (forked, seeded by the run
        seed), so it neither perturbs training's randomness nor depends on it: a resumed run and an
        uninterrupted one evaluate and continue identically (MoE gates draw random numbers even in eval)."""
        import torch

        assert self.eval_data is not None
        devices = [] if self.rt.accelerator == "cpu" else [self.rt.local_rank]
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.opts.seed + 7919)
            return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        import torch

        assert self.eval_data is not None
        if self.layout.pp > 1:
            return self._pipeline_evaluate()
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
                if self.aux_loss is not None:
                    self.aux_loss.pop()  # evaluation reports the language-model loss alone
        self.engine.train()
        loss = _mean_over_ranks(total / max(tokens, 1), self.rt)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def _pipeline_evaluate(self) -> dict[str, float]:
        """The pipeline engine's own eval schedule; it averages the micro-batch losses on the last stage and
        broadcasts the result to every stage."""
        batches = [
            (b.input_ids.to(self.rt.device), b.labels.to(self.rt.device))
            for b in eval_batches(
                self.eval_data, self.layout.micro_batch_size, self.dp_rank, self.dp_size, self.opts.eval_rows
            )
        ]
        loss = float(self.engine.eval_batch(iter(batches), num_micro_batches=len(batches)))
        loss = _mean_over_ranks(loss, self.rt)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def _rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_state()}
        if self.compressed_optimizer is not None:
            state["compressed_optimizer"] = self.compressed_optimizer.rank_state()
        return state

    def save(self) -> None:
        if self.ckpt is None:
            return
        fault = self.opts.fault_after_first_shard_at == self.step
        self.ckpt.save(
            self.engine,
            self.step,
            self.position,
            {"losses": self.record.losses, "layout": self.layout.model_dump()},
            self._rank_state(),
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
            if self.layout.pp > 1:
                losses = [self._pipeline_step(micro_batches)]
            else:
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
            if (
                self.opts.crash_at_step == self.step
                and not self.resumed
                and self.rt.rank == self.opts.crash_rank
            ):
                import os
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
        steps.close()

    def param_norm(self) -> float:
        """L2 norm of every fp32 parameter value, gathered across ZeRO-3 partitions — compares two runs' weights."""
        import deepspeed
        import torch

        params = list(self.engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, enabled=self.layout.zero_stage == 3):
            return float(torch.sqrt(sum(p.detach().double().pow(2).sum() for p in params)))

    def peak_memory(self) -> list[int]:
        return _gather(peak_memory_bytes(self.rt.accelerator))
