"""`dstk train`: what the launcher runs on every rank. Wires the parts together and nothing else.

model description + DeepSpeed config → HF model (under zero.Init for ZeRO-3) → `deepspeed.initialize` →
:class:`~toolkit.trainer.Trainer` (data, eval, metrics, checkpoints) → summary with measured vs predicted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.specs import ClusterSpec, ModelSpec


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
    loop: Any  # toolkit.trainer.LoopOptions


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


def _check_data(model: ModelSpec, data: Path) -> None:
    from toolkit.data.prepare import MANIFEST

    path = data / MANIFEST
    if not path.is_file():
        raise UserError(f"--data: {data} has no {MANIFEST}; make it with dstk data prepare")
    manifest = json.loads(path.read_text())
    if manifest["vocab_size"] > model.vocab_size:
        raise UserError(
            f"--data: tokenizer vocabulary {manifest['vocab_size']} exceeds the model's vocab_size {model.vocab_size}"
        )
    if manifest["seq_length"] > model.max_position_embeddings and model.position_embedding == "learned":
        raise UserError(
            f"--data: sequences of {manifest['seq_length']} exceed max_position_embeddings {model.max_position_embeddings}"
        )


def main(run: TrainRun) -> dict[str, Any]:
    import warnings

    import deepspeed

    from toolkit.checkpoint import Checkpointer
    from toolkit.layout_from_config import layout_from_config
    from toolkit.metrics import Logger
    from toolkit.models import build_model
    from toolkit.report_run import summarize
    from toolkit.runtime import init_distributed, seed_everything, shutdown
    from toolkit.trainer import Trainer

    # DeepSpeed's ZeRO calls the torch API this deprecates on every step, from every rank
    warnings.filterwarnings(
        "ignore", message=".*all_gather_into_tensor.* is deprecated", category=FutureWarning
    )
    rt = init_distributed()
    try:
        layout = layout_from_config(run.config, rt.world_size)
        data = run.data or _prepare_default_data(run, rt)
        _check_data(run.model, data)
        seed_everything(run.loop.seed)
        model = build_model(run.model, run.config, run.init_from)
        if layout.recompute == "full":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=run.config)
        seed_everything(run.loop.seed + 1 + rt.rank)  # dropout differs per rank, identically in every run
        ckpt = Checkpointer(run.checkpoint_dir, rt.rank, run.keep_last) if run.checkpoint_dir else None
        peak = run.cluster.peak_flops(layout.precision) if run.cluster else None
        trainer = Trainer(engine, run.model, layout, rt, data, run.run_dir, ckpt, run.loop, peak)
        if ckpt is not None and run.resume != "never":
            tag = ckpt.latest() if run.resume == "auto" else run.resume
            if tag is not None:
                trainer.resume(tag)
                if rt.is_main:
                    print(f"resumed from {run.checkpoint_dir / tag} at step {trainer.step}", flush=True)
            elif rt.is_main:
                print(f"no complete checkpoint in {run.checkpoint_dir}: starting from step 0", flush=True)
        logger = Logger(run.run_dir, engine, rt.is_main, run.loop.steps, trainer.step, run.loop.progress)
        try:
            trainer.run(logger)
        finally:
            logger.close()
        if ckpt is not None and not (run.loop.save_every and trainer.step % run.loop.save_every == 0):
            trainer.save()  # the final state, unless the last periodic save already holds it
        summary = summarize(trainer, run, layout)
    except BaseException:
        shutdown(clean=False)
        raise
    shutdown()
    return summary
