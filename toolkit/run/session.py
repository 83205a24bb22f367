"""`dstk train`: what the launcher runs on every rank. Wires the parts together and nothing else.

model description + DeepSpeed config → HF model (under zero.Init for ZeRO-3) → `deepspeed.initialize` →
:class:`~toolkit.run.loop.Trainer` (data, eval, metrics, checkpoints) → summary with measured vs predicted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ModelSpec
from toolkit.run.loop_state import TrainRun


def _prepare_default_data(run: TrainRun, rt: Any) -> Path:
    """Without --data: the generated demo corpus, tokenized for this model (rank 0 prepares, others wait)."""
    import torch.distributed as dist

    from toolkit.data.corpus import write_corpus
    from toolkit.data.prepare import MANIFEST, prepare

    out = run.run_dir / "data"
    if rt.is_main and not (out / MANIFEST).is_file():
        files = write_corpus(out / "raw", seed=run.loop.seed)
        prepare(
            files, out, run.model.seq_length, vocab_size=min(run.model.vocab_size, 4096), seed=run.loop.seed
        )
    dist.barrier()
    return out


def _moe(model: Any, spec: ModelSpec, layout: Any) -> tuple[Any, Any]:
    """(router-loss collector, optimizer parameters): dense models with experts get DeepSpeed MoE layers and
    expert parameter groups; HF's own MoE models (Mixtral) add their router loss to the HF loss themselves, and
    with expert parallelism their sparse blocks become DeepSpeed MoE layers routed by HF's router — or, for the
    families whose expert parallelism is DeepSpeed's AutoEP, stay HF's until `deepspeed.initialize` replaces them
    (`expert_parallel` in the config)."""
    if not spec.is_moe:
        return None, model.parameters()
    from toolkit.parallel.moe import convert_to_moe, optimizer_groups

    if spec.family.native_moe:
        model.config.output_router_logits = True
        if layout.ep == 1 or spec.family.expert_parallel == "autoep":
            return None, model.parameters()  # AutoEP replaces the sparse blocks inside deepspeed.initialize
        from toolkit.parallel.hf_moe import convert_hf_moe

        convert_hf_moe(model, layout.ep)
        return None, optimizer_groups(model)

    aux = convert_to_moe(model, spec, layout.ep)
    return aux, optimizer_groups(model)


def _whole_block_checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
    """torch's non-reentrant checkpoint recomputing the whole block (--no-recompute-early-stop); the context
    manager, unlike checkpoint's `early_stop` argument (torch 2.9), exists in every torch dstk supports."""
    import torch.utils.checkpoint as ckpt

    with ckpt.set_checkpoint_early_stop(False):
        return ckpt.checkpoint(function, *args, use_reentrant=False, **kwargs)


def _recompute_blocks(model: Any, layout: Layout) -> None:
    """Full recomputation of the HF blocks: torch's non-reentrant checkpoint, stopping early (before each
    block's last linear layer) or not as the layout was priced (Layout.recompute_stops_early), or DeepSpeed's
    when the checkpointed block inputs go to host memory (`cpu_checkpointing` is read only by
    `deepspeed.checkpointing.checkpoint`).
    transformers 5 passes `gradient_checkpointing_kwargs` to torch's function and has no public way to pass
    another, hence its `_set_gradient_checkpointing`; DeepSpeed's reentrant checkpoint needs an input that
    requires grad, which `enable_input_require_grads` gives the first block."""
    if not layout.offload_activations and layout.recompute_stops_early:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    if not layout.offload_activations:
        model._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=_whole_block_checkpoint)
        return
    import deepspeed

    model._set_gradient_checkpointing(
        enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint
    )
    model.enable_input_require_grads()


def _dstk_optimizer(config: dict[str, Any], params: Any) -> Any:
    """dstk's 1-bit Adam / 0/1 Adam from the config's `dstk.optimizer` block (DeepSpeed 0.19.7+ removed its
    own), as a client optimizer; None when the config names a DeepSpeed optimizer."""
    from toolkit.integrations.dstk_block import read_dstk_block

    spec = read_dstk_block(config).optimizer
    if spec is None:
        return None
    from toolkit.parallel.onebit import build_optimizer

    try:
        return build_optimizer(list(params), spec)
    except ValueError as exc:
        raise UserError(f"--config: {exc}") from None


def _pipeline(model: Any, spec: ModelSpec, layout: Any, config: dict[str, Any]) -> tuple[Any, Any]:
    """The HF model as a DeepSpeed PipelineModule with the same weights (toolkit.parallel.pipeline)."""
    from toolkit.parallel.pipeline import build_pipeline

    pipe_cfg = config.get("pipeline") or {}
    pipe = build_pipeline(
        spec,
        model.config,
        model.state_dict(),
        layout.pp,
        partition=str(pipe_cfg.get("partition", "parameters")),
        checkpoint_interval=int(
            pipe_cfg.get("activation_checkpoint_interval", 1 if layout.recompute == "full" else 0)
        ),
    )
    return pipe, [p for p in pipe.parameters() if p.requires_grad]


def _local_tensors(model: Any, trainable: bool) -> dict[str, Any]:
    """This rank's copy of the (trainable or frozen) parameters: the ZeRO-3 partition or the whole tensor."""
    return {
        n: getattr(p, "ds_tensor", p.data).detach().float().clone()
        for n, p in model.named_parameters()
        if p.requires_grad == trainable
    }


def _max_change(before: dict[str, Any], model: Any, trainable: bool) -> float:
    """Largest absolute change of any local element since `before`, the maximum over the ranks."""
    import torch
    import torch.distributed as dist

    after = _local_tensors(model, trainable)
    worst = max((float((after[n] - t).abs().max()) for n, t in before.items() if t.numel()), default=0.0)
    import deepspeed

    # on the accelerator: NCCL reduces device tensors only
    out = torch.tensor([worst], dtype=torch.float64, device=deepspeed.get_accelerator().current_device_name())
    dist.all_reduce(out, op=dist.ReduceOp.MAX)
    return float(out.item())


def _monitors_under(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The config with relative monitor paths (TensorBoard, CSV) under the run directory: DeepSpeed resolves
    them against the working directory, so every run started from one place appended to the same files."""
    out = dict(config)
    for key in ("tensorboard", "csv_monitor"):
        block = config.get(key)
        if (
            isinstance(block, dict)
            and block.get("output_path")
            and not Path(block["output_path"]).is_absolute()
        ):
            out[key] = {**block, "output_path": str(run_dir / block["output_path"])}
    return out


def _tiers(run: TrainRun, rank: int) -> Any:
    """The checkpoint tiers of this run (toolkit.run.tiers), or None without --checkpoint-dir."""
    if run.checkpoint_dir is None:
        return None
    from toolkit.run.tiers import Tiers

    tiers = Tiers(run.checkpoint_dir, rank, run.keep_last, run.loop.async_save, run.loop.snapshot_every)
    tiers.memory.slow_s = run.loop.slow_snapshot_s
    tiers.on_save_error(run.loop.on_save_error)
    return tiers


def _resume_tag(ckpt: Any, run: TrainRun) -> str | None:
    """The checkpoint to resume from (all ranks agree), or None."""
    if ckpt is None or run.resume == "never":
        return None
    if run.resume == "auto":
        return ckpt.latest()
    from toolkit.run.checkpoint import check

    problem = check(ckpt.where(run.resume) / run.resume)
    if problem:
        raise UserError(
            f"--resume: {ckpt.where(run.resume) / run.resume} is not a complete checkpoint: {problem}"
        )
    return run.resume


def _fresh_start(run: TrainRun) -> None:
    """A run that starts at step 0 (rank 0): an earlier run's checkpoints removed when
    --overwrite-checkpoints says so (the pre-flight refused them otherwise), its records in the run folder
    set aside, each said once (toolkit.run.folders)."""
    from toolkit.run.folders import remove_checkpoints, set_aside_records

    if run.overwrite_checkpoints and run.checkpoint_dir is not None:
        removed = remove_checkpoints(run.checkpoint_dir)
        if removed:
            print(
                f"--overwrite-checkpoints: removed {', '.join(removed)} from {run.checkpoint_dir}", flush=True
            )
    note = set_aside_records(run.run_dir)
    if note:
        print(f"note: {note}", flush=True)


def main(run: TrainRun) -> dict[str, Any]:
    import contextlib

    import deepspeed

    from toolkit.integrations.ds_input import idle_comms_logger, without_idle_comms_logger
    from toolkit.integrations.ds_layout import layout_from_config
    from toolkit.parallel import ulysses
    from toolkit.run.chatter import quiet
    from toolkit.run.loop import Trainer
    from toolkit.run.metrics import Logger
    from toolkit.run.models import build_model
    from toolkit.run.preflight import check_data
    from toolkit.run.runtime import init_distributed, seed_everything, shutdown
    from toolkit.run.save_errors import SaveFailed
    from toolkit.run.summary import summarize
    from toolkit.run.universal import is_universal

    quiet()  # library notices that tell the user nothing (toolkit.run.chatter); the CLI did it already
    rt = init_distributed()
    from toolkit.run.heartbeat import Heartbeat

    beat = Heartbeat.start(run.run_dir, rt)  # what the launcher watches for a hang (launcher/heartbeat.py)
    if rt.nodes > 1:  # where each rank landed: the first thing to know when a multi-node launch goes wrong
        print(f"rank {rt.rank} of {rt.world_size} on {rt.host} (node {rt.node} of {rt.nodes})", flush=True)
    try:
        layout = layout_from_config(run.config, rt.world_size)
        if layout.sp > 1:
            ulysses.check_supported(run.model, layout, run.config, run.loop.batching, run.lora)
        data = run.data or _prepare_default_data(run, rt)
        check_data(run.model, data)
        seed_everything(run.loop.seed)
        model = build_model(run.model, run.config, run.init_from)
        if layout.precision == "fp8":  # torchao.float8 on the linear layers (toolkit/run/fp8.py)
            from toolkit.run import fp8

            fp8.apply(model, rt.is_main)
        if run.lora:
            from toolkit.plan.lora import parse_lora
            from toolkit.run.lora import apply_lora

            layout = layout.model_copy(update={"lora": run.lora})
            model = apply_lora(model, run.model, parse_lora(run.lora))
        aux, params = _moe(model, run.model, layout)
        if run.lora:
            params = [p for p in model.parameters() if p.requires_grad]
        if layout.offload_activations:
            # deepspeed.initialize never configures its checkpointing module; its `checkpoint` reads this
            deepspeed.checkpointing.configure(None, deepspeed_config=run.config)
        if layout.pp > 1:
            model, params = _pipeline(model, run.model, layout, run.config)
        elif layout.recompute == "full":
            _recompute_blocks(model, layout)
        # DeepSpeed-Ulysses: SDPA replaced by its all-to-all attention; its groups are the engine's mpu
        mpu = ulysses.register(model, layout) if layout.sp > 1 else None
        ckpt = _tiers(run, rt.rank)
        tag = _resume_tag(ckpt, run)
        if tag is None and rt.is_main:
            _fresh_start(run)
        if ckpt is not None and tag is None and run.loop.crash_at_step and rt.rank == run.loop.crash_rank:
            ckpt.crash = (run.loop.crash_at_step, run.loop.crash_during)  # test-only, as --crash-at-step
        config = _monitors_under(without_idle_comms_logger(run.config), run.run_dir)
        if idle_comms_logger(run.config) and rt.is_main:
            print(
                "--config: dropped its disabled comms_logger block: DeepSpeed 0.19.8 turns the logger on "
                "for any such key, and it synchronizes after every collective (pass --comms-logger to "
                "dstk config to have it)",
                flush=True,
            )
        if tag is not None and is_universal(run.checkpoint_dir / tag):
            # a checkpoint from another world size, converted by dstk checkpoint convert
            config = {**config, "checkpoint": {**config.get("checkpoint", {}), "load_universal": True}}
        client_optimizer = _dstk_optimizer(config, params)
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=None if client_optimizer else params,
            optimizer=client_optimizer,
            config=config,
            mpu=mpu,
        )
        if "expert_parallel" in config and run.model.family.autoep_returns_tuple:
            from toolkit.parallel.hf_moe import return_router_pair

            return_router_pair(engine.module)
        if client_optimizer is not None:
            from toolkit.parallel.onebit import attach_to_engine

            client_optimizer = attach_to_engine(engine)  # before any load_checkpoint (see its docstring)
        seed_everything(run.loop.seed + 1 + rt.rank)  # dropout differs per rank, identically in every run
        peak = run.cluster.peak_flops(layout.precision) if run.cluster else None
        trainer = Trainer(engine, run.model, layout, rt, data, run.run_dir, ckpt, run.loop, peak, aux)
        trainer.compressed_optimizer = client_optimizer
        trainer.beat = beat
        if mpu is not None:
            trainer.sp = ulysses.SequenceParallel(engine, layout)
        from toolkit.run.stop import StopRequest

        trainer.stop = StopRequest.install()
        if tag is not None:
            beat.enter("load")
            trainer.resume(tag)
            if rt.is_main:
                print(f"resumed from {ckpt.describe(tag)} at step {trainer.step}", flush=True)
        elif ckpt is not None and run.resume != "never" and rt.is_main:
            print(f"no complete checkpoint in {run.checkpoint_dir}: starting from step 0", flush=True)
        if run.loop.eval_only:
            if trainer.eval_data is None:
                raise UserError(f"--eval-only: {data} has no validation split")
            trainer.record.evals.append({"step": trainer.step, **trainer.evaluate()})
        else:
            logger = Logger(run.run_dir, engine, rt.is_main, run.loop.steps, trainer.step, run.loop.progress)
            frozen = _local_tensors(engine.module, trainable=False) if run.lora else None
            adapters = _local_tensors(engine.module, trainable=True) if run.lora else None
            try:
                trainer.run(logger)
            finally:
                logger.close()
            beat.enter("end")
            if run.lora:
                from toolkit.run.lora import save_adapters

                save_adapters(engine, run.run_dir / "adapter", rt.is_main)
                trainer.lora_changes = {
                    "frozen_max_abs_change": _max_change(frozen, engine.module, trainable=False),
                    "adapter_max_abs_change": _max_change(adapters, engine.module, trainable=True),
                }
            if ckpt is not None and not ckpt.on_disk(trainer.step) and not trainer.save_failed:
                with contextlib.suppress(SaveFailed):  # said in one line; the summary records it
                    trainer.save()  # the final state, unless a checkpoint already holds it
        if ckpt is not None:
            # every save durable before the summary says so
            ckpt.close(finished=not run.loop.eval_only and not trainer.save_failed)
        summary = summarize(trainer, run, layout)
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    beat.close()
    return summary
