"""The training loop around a DeepSpeed engine: micro-batches, evaluation, metrics, checkpoints, resume.

Gradient accumulation, clipping and the LR schedule are the engine's (from the config): each micro-batch is
`engine(...)`, `engine.backward(loss)`, `engine.step()`, and the engine applies the optimizer at the
accumulation boundary. dstk adds the data position, evaluation, throughput/MFU/memory metrics, crash-safe
checkpoints (:mod:`toolkit.run.checkpoint`) and the spike guard's rollbacks (:mod:`toolkit.run.stability`). With
dynamic batching (:mod:`toolkit.data.dynamic`) the micro-batches vary in shape but not in number, and dstk
sets each step's learning rate before the step.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from toolkit.data.dynamic import Batching, resolve
from toolkit.data.loader import DynamicLoader, TrainLoader, load_split
from toolkit.errors import UserError
from toolkit.plan.layout import Layout, data_parallel_size
from toolkit.plan.specs import ModelSpec
from toolkit.run.comms_log import CommsTally
from toolkit.run.data_fit import at_seq_length
from toolkit.run.engine_state import held_bytes
from toolkit.run.evaluate import evaluate
from toolkit.run.heartbeat import NO_BEAT
from toolkit.run.loop_state import LEAN_STEPS, LoopOptions, Record, begin_step, gather
from toolkit.run.metrics import LeanPeak, Logger, Meter, current_rss_bytes, peak_memory_bytes
from toolkit.run.preflight import data_fingerprint
from toolkit.run.rollback import roll_back
from toolkit.run.runtime import Runtime, rng_state, set_rng_state
from toolkit.run.save_errors import SaveFailed
from toolkit.run.stability import (
    CLEAR,
    Fault,
    SpikeGuard,
    corrupt,
    crash_if_asked,
    engine_grad_norm,
    engine_reports_grad_norm,
    local_grad_norm,
    unclipped,
)
from toolkit.run.step_sync import ScheduledCollection, StepChannel, StepRecord, to_device
from toolkit.run.stragglers import StragglerWatch
from toolkit.run.tiers import Tiers


class Trainer:
    def __init__(
        self,
        engine: Any,
        model: ModelSpec,
        layout: Layout,
        rt: Runtime,
        data_dir: Path,
        run_dir: Path,
        checkpointer: Tiers | None,
        opts: LoopOptions,
        peak_flops: float | None,
        aux_loss: Any = None,
    ) -> None:
        self.engine, self.model, self.layout, self.rt, self.opts = engine, model, layout, rt, opts
        self.stop: Any = None
        """toolkit.run.stop.StopRequest when the process listens for SIGTERM/SIGINT (session installs it)."""
        self.stopped_by = 0
        """The signal that stopped the run at a step boundary (0: it ran to the end)."""
        self.save_failed = False
        """A checkpoint could not be written and `--on-save-error stop` ended the run there."""
        self._states_measured = False
        self.sp: Any = None
        """toolkit.parallel.ulysses.SequenceParallel with --sp > 1 (session sets it): sliced batches, its loss."""
        self.compressed_optimizer: Any = None
        """dstk's 1-bit Adam / 0/1 Adam when the config asks for it; its error-feedback buffers are per rank
        and DeepSpeed saves only rank 0's optimizer state at ZeRO-0, so they travel in dstk's rank files."""
        self.aux_loss = aux_loss
        """Router load-balancing losses of dstk's MoE layers (toolkit.parallel.moe.AuxLoss), added to the LM loss."""
        self.ckpt = checkpointer
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.train_data = load_split(data_dir / "train", opts.seed)
        self.eval_data = (
            load_split(data_dir / "validation", opts.seed) if (data_dir / "validation").exists() else None
        )
        self.dp_size = data_parallel_size(rt.world_size, layout.tp, layout.pp, layout.sp)
        self.dp_rank = rt.rank // (layout.tp * layout.sp) % self.dp_size
        self.batching: Batching | None = None
        if opts.batching is not None:
            self.batching = resolve(
                opts.batching,
                seq_length=self.train_data.seq_length,
                dp=self.dp_size,
                gradient_accumulation=layout.gradient_accumulation_steps,
                micro_batch=layout.micro_batch_size,
                pipeline_stages=layout.pp,
                seed=opts.seed,
            )
        self._initial_lrs = [group["lr"] for group in engine.optimizer.param_groups]
        """The rates before any step: what dynamic batching scales until the scheduler has stepped."""
        self._step_values: dict[str, float] = {}
        """This step's dynamic-batching figures, logged with its loss."""
        self.step = 0
        self.position = 0
        self.resumed = False
        self.saved_steps: list[int] = []
        """Steps this run checkpointed or resumed from: the only checkpoints a rollback may return to."""
        self._rolled_back_to: int | None = None
        """The last rollback's checkpoint, until a newer one is written: a spike before then means that
        checkpoint already held the damage (e.g. Adam's moments after an unclipped gradient), so the next
        rollback goes further back."""
        self.guard = SpikeGuard(opts.guard, engine) if opts.guard else None
        if self.guard is not None and checkpointer is None:
            raise UserError("--spike-guard: needs --checkpoint-dir (it rolls back to the last checkpoint)")
        if opts.faults and layout.pp > 1:
            raise UserError("--inject-fault: not with pipeline parallelism")
        self._own_grad_norm = (
            self.guard is not None and layout.pp == 1 and not engine_reports_grad_norm(engine)
        )
        """The engine computes no gradient norm (a torch optimizer at ZeRO-0): dstk does, for the guard."""
        self._grad_norm: Any = None
        self.record = Record()
        tokens = layout.global_batch_size * self.train_data.seq_length
        trained = at_seq_length(model, self.train_data.seq_length)  # the data's rows, not the model's
        self.meter = Meter(trained, rt.world_size, tokens, peak_flops, LEAN_STEPS, layout.lora is not None)
        self.channel = StepChannel(rt)
        """Each step's loss, gradient norm, stop request and time, read back one step behind
        (toolkit.run.step_sync)."""
        self.channel.forward_is_local = (
            layout.zero_stage < 3 and layout.tp * layout.sp * layout.ep * layout.pp == 1
        )
        self.stragglers = StragglerWatch(opts.straggler_ratio)
        """Which rank the others wait for, judged at log steps (toolkit.run.stragglers)."""
        self.beat: Any = NO_BEAT
        """This rank's heartbeat (toolkit.run.heartbeat; session starts it): the phase the loop is in."""
        self.faults = tuple(f for f in opts.faults if f.rank in (None, rt.rank))
        self.last: StepRecord | None = None
        """The newest record read."""
        self.comms = CommsTally()
        """DeepSpeed's comms logger drained every step, when the config asks for it (toolkit.run.comms_log)."""
        self.lean = LeanPeak(rt.accelerator)
        """Peak memory over set-up and the first LEAN_STEPS steps, then heap reuse (toolkit.run.metrics)."""

    def resume(self, tag: str) -> None:
        client_state = self._load(tag)
        self.resumed = True
        if self.guard is not None and client_state.get("guard"):
            self.guard.load_state(client_state["guard"], self.engine)

    def _load(self, tag: str) -> dict[str, Any]:
        """Engine, data position, RNGs and losses as checkpoint `tag` holds them; its client state."""
        assert self.ckpt is not None
        r = self.ckpt.load(self.engine, tag)
        saved = r.client_state.get("loader", "fixed")
        if saved != self._loader_kind():
            raise UserError(
                f"--resume: {tag} was written by the {saved} data loader and this run uses the "
                f"{self._loader_kind()} one (their data positions differ): resume with the same "
                "--token-budget/--curriculum-steps setting"
            )
        self.step, self.position = r.step, 0 if self.opts.new_data and not self.resumed else r.position
        self.saved_steps.append(r.step)
        rank_state = r.client_state.get("rank_state", {})
        if rank_state.get("rng"):
            set_rng_state(rank_state["rng"])
        if self.compressed_optimizer is not None and rank_state.get("compressed_optimizer"):
            self.compressed_optimizer.load_rank_state(rank_state["compressed_optimizer"])
        self.record.losses = list(r.client_state.get("losses", []))
        return r.client_state

    def _loader_kind(self) -> str:
        return "fixed" if self.batching is None else "dynamic"

    def _loader(self) -> TrainLoader | DynamicLoader:
        if self.batching is not None:
            return DynamicLoader(
                self.train_data, self.batching, self.dp_rank, self.dp_size, self.position, self.step
            )
        return TrainLoader(
            self.train_data,
            self.layout.global_batch_size,
            self.layout.micro_batch_size,
            self.dp_rank,
            self.dp_size,
            position=self.position,
        )

    def on_device(self, tensor: Any) -> Any:
        return to_device(tensor, self.rt.device)

    def _micro_step(self, batch: Any, measure: bool, aux: list[Any], fault: Fault | None = None) -> Any:
        """One micro-batch; its loss to log stays on the device (toolkit.run.step_sync)."""
        engine = self.engine
        self.beat.enter("forward")
        if self.sp is None:
            out = engine(input_ids=self.on_device(batch.input_ids), labels=self.on_device(batch.labels))
            loss = logged = out.loss
        else:
            loss, logged = self.sp.loss(batch)  # this rank's share to back-propagate, the batch's mean
        self.channel.forward_done()
        if self.aux_loss is not None:
            router = self.aux_loss.pop()
            aux.append(router.detach())
            loss = loss + router
        if fault is not None and fault.kind != "slow":
            loss = corrupt(loss, fault)
        self.beat.enter("backward")
        engine.backward(loss)
        boundary = engine.is_gradient_accumulation_boundary()
        if measure:
            # the most the engine holds after any backward of the step: during accumulation ZeRO-1 keeps
            # whole gradients and ZeRO-2 two partitions, released by the reduction at the boundary
            held = gather(held_bytes(engine)["model_states"])
            before = self.record.model_states.get("after_backward", held)
            self.record.model_states["after_backward"] = [
                max(a, b) for a, b in zip(before, held, strict=True)
            ]
        if boundary and self._own_grad_norm:
            self._grad_norm = local_grad_norm(engine)  # before step() clips and zeroes the gradients
        spike = fault is not None and fault.kind == "spike" and boundary
        self.beat.enter("optimizer")
        with unclipped(engine) if spike else contextlib.nullcontext():
            engine.step()
        logged = logged.detach().float()
        return logged * float("nan") if fault is not None and fault.kind == "nan" else logged

    def _pipeline_step(self, micro_batches: list[Any]) -> Any:
        """One optimizer step of the pipeline engine: it pulls the micro-batches itself (1F1B schedule) and
        returns the mean loss, on the device, broadcast from the last stage."""
        batches = iter([(self.on_device(b.input_ids), self.on_device(b.labels)) for b in micro_batches])
        return self.engine.train_batch(data_iter=batches).detach().float()

    def evaluate(self) -> dict[str, float]:
        """Held-out loss and perplexity (toolkit.run.evaluate)."""
        return evaluate(self)

    def _rank_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_state()}
        if self.compressed_optimizer is not None:
            state["compressed_optimizer"] = self.compressed_optimizer.rank_state()
        return state

    def save(self, tier: str = "disk") -> None:
        if self.ckpt is None:
            return
        self.beat.enter("save")
        self.read(self.step)  # the checkpoint holds every loss up to here
        fault = self.opts.fault_after_first_shard_at == self.step
        extra: dict[str, Any] = {
            "data": data_fingerprint(self.data_dir),
            "losses": self.record.losses,
            "layout": self.layout.model_dump(),
            "model": self.model.model_dump(),
            "loader": self._loader_kind(),
        }
        if self.guard is not None:
            extra["guard"] = self.guard.state()
        try:
            self.ckpt.save(self.engine, self.step, self.position, extra, self._rank_state(), fault, tier)
        except SaveFailed:
            self.save_failed = True  # on every rank alike (toolkit.run.save_errors)
            raise
        self.saved_steps.append(self.step)
        self._rolled_back_to = None

    def _train_step(self, micro_batches: list[Any]) -> None:
        """Queue one optimizer step and its record (loss, global gradient norm, stop request), reduced over the
        ranks on the device; the host reads it later (`read`)."""
        # model states are measured once, in the second step (Adam creates its moments lazily in the first) or
        # in the first step after a resume (the moments came with the checkpoint)
        first = not self._states_measured and (self.step >= 1 or self.opts.steps == 1)
        self._states_measured = self._states_measured or first
        gb = self.layout.global_batch_size
        faults = [f for f in self.faults if not (f.first_run and self.resumed)]
        fault = next((f for f in faults if f.fires(self.step + 1, self.position, gb)), None)
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.seconds)
        aux: list[Any] = []
        self.channel.begin()
        if self.layout.pp > 1:
            losses = [self._pipeline_step(micro_batches)]
        else:
            # Ulysses slices (--sp): the adapter's collectives run here, on the training thread
            batches = micro_batches if self.sp is None else self.sp.step_batches(micro_batches)
            losses = [self._micro_step(b, measure=first, aux=aux, fault=fault) for b in batches]
        if first:
            self.record.model_states["after_step"] = gather(held_bytes(self.engine)["model_states"])
        self.lean.after_step()
        if self.guard is not None:
            self.guard.apply_lr(self.engine)  # the scheduler has just set the next step's rate
        norm = engine_grad_norm(self.engine)
        norm = self._grad_norm if norm is None else norm
        # the stop request rides on the all-reduce every step does anyway: all ranks stop after the same step
        asked = self.stop.signum if self.stop is not None else 0
        self.beat.enter("record")
        self.channel.end(self.step + 1, sum(losses) / len(losses), norm, asked, aux)
        self.comms.drain()

    def read(self, upto: int) -> StepRecord | None:
        """Take the records of the steps up to `upto` (waiting for them if need be): their losses, router
        losses and times into the run's record, a stop request into `stopped_by`. Returns the newest."""
        for rec in self.channel.take(upto):
            self.record.losses.append(rec.loss)
            self.record.aux_losses.extend(rec.aux)
            self.meter.add(rec.seconds, rec.period)
            self.stragglers.add(rec.step, rec.period, rec.alone)
            if rec.stop and not self.stopped_by:  # the asking ranks' signal, else SIGTERM's convention
                self.stopped_by = rec.signum or (self.stop.signum if self.stop is not None else 0) or 15
            self.last = rec
        return self.last

    def _due_now(self, save_due: bool) -> bool:
        """Whether this step's record must be read before the loop goes on: it is logged, checkpointed or
        judged by the spike guard now, or it is the last."""
        step, snapshot = (
            self.step,
            self.ckpt is not None and self.ckpt.snapshot_due(self.step, self.opts.steps),
        )
        last = step >= self.opts.steps or self.opts.crash_at_step == step
        return self.guard is not None or save_due or snapshot or last or step % self.opts.log_every == 0

    def run(self, logger: Logger) -> None:
        self.start_position = self.position
        if self.guard is not None and self.step not in self.saved_steps:
            self.save()  # something to roll back to before the first periodic checkpoint
        loader = self._loader()
        steps = loader.steps()
        save_due = False
        collector = ScheduledCollection()
        try:
            while self.step < self.opts.steps:
                collector.step(self.step)
                self.beat.enter("data", self.step + 1)
                self._train_step(begin_step(self, next(steps)))
                self.step += 1
                self.position = loader.position
                save_due = save_due or bool(self.opts.save_every and self.step % self.opts.save_every == 0)
                now = self._due_now(save_due)
                rec = self.read(self.step if now else self.step - 1)
                verdict = (
                    self.guard.check(self.step, rec.loss, rec.grad_norm)
                    if self.guard is not None and rec is not None
                    else CLEAR
                )
                if verdict.spike:
                    steps.close()
                    roll_back(self, verdict, logger)
                    save_due = False  # the state rolled back to is a checkpoint
                    loader = self._loader()
                    steps = loader.steps()
                    continue
                logger.advance()
                if self.step % self.opts.log_every == 0 or self.step == self.opts.steps:
                    assert rec is not None and rec.step == self.step
                    self._log(logger, rec)
                if (
                    self.opts.eval_every
                    and self.eval_data is not None
                    and self.step % self.opts.eval_every == 0
                ):
                    self.beat.enter("eval")
                    result = self.evaluate()
                    self.record.evals.append({"step": self.step, **result})
                    logger.log(self.step, result, prefix="eval")
                    logger.message(
                        f"step {self.step}: held-out loss {result['loss']:.4f}, perplexity {result['perplexity']:.4g}"
                    )
                if save_due and not verdict.suspect:  # a state inside an anomalous streak waits for the end
                    self.save()
                    save_due = False
                elif (
                    self.ckpt is not None
                    and self.ckpt.snapshot_due(self.step, self.opts.steps)
                    and not verdict.suspect
                ):
                    self.save(tier="memory")
                if self.stopped_by:  # SIGTERM/SIGINT: leave a checkpoint at this step and stop
                    if self.ckpt is not None and not self.ckpt.on_disk(self.step):
                        self.save()
                    break
                crash_if_asked(self.opts, self.step, self.resumed, self.rt.rank)
        except SaveFailed:
            pass  # --on-save-error stop: every rank ends here, the newest complete checkpoint intact
        finally:
            steps.close()
            collector.close()
        self.read(self.step)  # every step's record, before the run is summarized or saved

    def _log(self, logger: Logger, rec: StepRecord) -> None:
        values = {
            "loss": rec.loss,
            "lr": float(self.engine.get_lr()[0]),
            "rss_bytes": current_rss_bytes(),
            **self.meter.rates(rec.seconds),
            **self._step_values,
        }
        if rec.grad_norm is not None:
            values["grad_norm"] = rec.grad_norm
        logger.log(self.step, values)
        for s in self.stragglers.check(self.step, self.rt):  # one small all-gather, at log steps only
            logger.message(self.stragglers.message(s))
            logger.event({"event": "straggler", "step": self.step, **asdict(s)})

    def peak_memory(self) -> list[int]:
        """Per rank: on an accelerator the whole run's peak allocation and the memory outside torch's pool; on
        CPU the peak RSS up to the allocator switch."""
        return gather(self.lean.peak())

    def peak_rss(self) -> list[int] | None:
        """Per rank on CPU: peak RSS over the whole run, free heap the allocator kept included."""
        return gather(peak_memory_bytes("cpu")) if self.rt.accelerator == "cpu" else None
