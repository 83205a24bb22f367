"""Calibration probes that run the DeepSpeed engine itself: the host's fixed cost per step and per block of an
HF GPT-2 too small to compute anything, and DeepSpeed's optimizer step per parameter on both of its code paths
(ZeRO-0's per-tensor step, ZeRO-1/2/3's flat partition). Run by every rank of `toolkit.run.calibrate`."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any


def timeit(fn: Any, repeat: int, sync: Any) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 2**30
    return 0.0


def _probe_engine(
    device: Any, gpt2: dict[str, int], zero: dict[str, Any], precision: str, **extra: Any
) -> tuple[Any, Any]:
    """A DeepSpeed engine over an HF GPT-2 built from `gpt2`, in a dstk config's shape (`precision`, clipping,
    torch AdamW) with ZeRO section `zero` and `extra` config keys, and one micro-batch of random tokens."""
    import deepspeed
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "steps_per_print": 10**9,
        **extra,
    }
    # special tokens inside the probe's vocabulary, and the loss named, as toolkit/run/models.py builds models:
    # transformers otherwise warns about GPT-2's 50256 and an unset loss type on every probe, on every rank
    ids = {key: gpt2["vocab_size"] - 1 for key in ("bos_token_id", "eos_token_id")}
    model = GPT2LMHeadModel(GPT2Config(**gpt2, **ids)).to(device)
    model.loss_type = "ForCausalLM"
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    x = torch.randint(0, gpt2["vocab_size"], (1, gpt2["n_positions"]), device=device)
    return engine, x


ENGINE_PROBE = {"n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 16}
"""A GPT-2 so small that its arithmetic is negligible: what one of its steps costs is the host's part."""


def engine_probe(device: Any, precision: str, steps: int = 12) -> dict[str, float]:
    """Seconds per optimizer step of a 1- and a 5-block HF GPT-2 (bf16, ZeRO-0, clipping, warm-up schedule: a
    dstk config's shape) through the DeepSpeed engine, and the RSS afterwards. A quarter of the difference
    is one block's host cost (eager ops, autograd, optimizer loop over its tensors) per micro-batch; what the
    1-block step costs beyond one block is the engine's fixed per-step cost (bookkeeping, clipping,
    scheduler, loss reduction). Run the same way on every rank, so the gradient all-reduce is in it too."""
    import deepspeed

    times = {}
    for layers in (1, 5):
        engine, x = _probe_engine(
            device,
            {"n_layer": layers, **ENGINE_PROBE},
            {"stage": 0},
            precision,
            scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        )

        def step(engine: Any = engine, x: Any = x) -> None:
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            loss.item()

        times[layers] = (
            timeit(lambda: [step() for _ in range(steps)], 1, deepspeed.get_accelerator().synchronize) / steps
        )
        del engine
    block = max(times[5] - times[1], 0.0) / 4
    return {
        "block_s": block,
        "step_s": max(times[1] - block, 0.0),
        "rss_gib": rss_gib(),
    }


OPTIMIZER_PROBE = {"n_layer": 4, "n_embd": 768, "n_head": 12, "vocab_size": 8192, "n_positions": 64}
"""A 35M-parameter GPT-2 (GPT-2 small's width, 4 blocks): the many tensors of a real model, each under
glibc's 32 MiB mmap ceiling in fp32, while a ZeRO-1 partition of them (69 MB on 2 ranks) is above it, as
any real model's is — the two regimes the two code paths run in."""


def optimizer_probe(device: Any, world: int, precision: str, steps: int = 3) -> dict[str, float]:
    """Nanoseconds per updated parameter of `engine.step()` less its all-gather, at ZeRO-0 (`replicated`)
    and ZeRO-1 (`partitioned`), in a dstk config's shape (bf16, clipping, torch AdamW), after
    `allow_heap_reuse` as `dstk train` runs it. The fastest of `steps` steps after the first (which creates
    the optimizer state); ZeRO-1's all-gather of the updated partitions (one bf16 call over the model,
    `all_gather_dp_groups`) is timed alone and taken off, the cost model prices it as communication."""
    import deepspeed
    import torch
    import torch.distributed as dist

    width = OPTIMIZER_PROBE["n_embd"]
    out = {}
    for stage, path in ((0, "replicated"), (1, "partitioned")):
        buckets = {"reduce_bucket_size": width * width, "allgather_bucket_size": width * width}
        engine, x = _probe_engine(
            device, OPTIMIZER_PROBE, {"stage": stage, **buckets, "overlap_comm": True}, precision
        )
        n_params = sum(p.numel() for p in engine.module.parameters())
        sync = deepspeed.get_accelerator().synchronize
        times = []
        for _ in range(steps + 1):
            engine.backward(engine(input_ids=x, labels=x).loss)
            sync()
            t = time.perf_counter()
            engine.step()
            sync()
            times.append(time.perf_counter() - t)
        gather = 0.0
        if stage:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
            full = torch.empty(n_params - n_params % world, device=device, dtype=dtype)
            part = full[: full.numel() // world].clone()
            gathers = [
                timeit(lambda f=full, p=part: dist.all_gather_into_tensor(f, p), 1, sync)
                for _ in range(steps)
            ]
            gather = min(gathers)
        shard = n_params / (world if stage else 1)
        # the least disturbed of each (a step contains its gather): medians of two noisy timings, taken one
        # from the other, went to zero on a machine busy with other work (a test beside a 2-rank job)
        out[path] = max(min(times[1:]) - gather, 0.0) / shard * 1e9
        del engine
    return out
