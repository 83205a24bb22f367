"""Run under the deepspeed launcher (2 ranks): for each DeepSpeed config given (bf16 at ZeRO-0..3), build the
test model, take three optimizer steps on seeded random tokens, save a dstk checkpoint (toolkit.run.checkpoint,
manifest and all) under OUT/ckpt{stage}, and write the optimizer's fp32 masters as the live engine holds them
to OUT/masters{stage}.pt (rank 0): name -> fp32 tensor, read from the engine's own objects, not the checkpoint.

ZeRO-0 in bf16 is DeepSpeed's FP16_UnfusedOptimizer at bf16: `fp32_groups[i][j]` is the master of the module
parameter `fp16_groups[i][j]` (the same Python object the module holds). ZeRO-1/2/3: DeepSpeed's
`safe_get_full_fp32_param` (collective at ZeRO-3).
"""

from __future__ import annotations

import sys
from pathlib import Path

from toolkit.run.runtime import init_distributed, keep_large_blocks_in_mmap, seed_everything, shutdown

STEPS = 3
"""DeepSpeed's WarmupCosineLR warms up over at least 2 steps from 0, and the rate a step uses is the one set
after the previous step: the third step is the first to move the weights."""


def masters(engine) -> dict[str, object]:
    from deepspeed.utils import safe_get_full_fp32_param

    named = list(engine.module.named_parameters())
    if engine.zero_optimization_stage() == 0:
        by_id = {id(p): n for n, p in named}
        opt = engine.optimizer
        return {
            by_id[id(p)]: m.detach().clone()
            for group, fp32 in zip(opt.fp16_groups, opt.fp32_groups, strict=True)
            for p, m in zip(group, fp32, strict=True)
        }
    return {n: safe_get_full_fp32_param(p).detach().clone() for n, p in named}


def main(out: Path, model_path: str, configs: list[str]) -> None:
    import json

    import deepspeed
    import torch

    from toolkit.plan.load import load_model
    from toolkit.run.checkpoint import Checkpointer
    from toolkit.run.models import build_model

    rt = init_distributed()
    spec = load_model(model_path)
    for path in configs:
        cfg = json.loads(Path(path).read_text())
        stage = cfg["zero_optimization"]["stage"]
        seed_everything(0)
        model = build_model(spec, cfg)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        torch.manual_seed(1 + rt.rank)
        for _ in range(STEPS * engine.gradient_accumulation_steps()):
            ids = torch.randint(
                0, spec.vocab_size, (engine.train_micro_batch_size_per_gpu(), spec.seq_length)
            )
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        Checkpointer(out / f"ckpt{stage}", rt.rank).save(engine, STEPS, 0, {"stage": stage}, {})
        found = masters(engine)
        if rt.is_main:
            torch.save(found, out / f"masters{stage}.pt")
        engine.destroy()
    shutdown()


if __name__ == "__main__":
    keep_large_blocks_in_mmap()  # as dstk train does, before torch is imported
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()
