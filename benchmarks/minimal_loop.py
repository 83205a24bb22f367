"""The hand-written baseline for benchmarks/overhead.py: the shortest correct DeepSpeed training loop over the
same model, config and data as `dstk train`, as a user writes it — forward, backward, step, and the loss read
and printed every LOG_EVERY steps. Each step's period (the time between consecutive step ends, on the device's
clock: CUDA events where there are some) is what it records. Run under the deepspeed launcher:
    deepspeed --num_gpus 2 --no_local_rank benchmarks/minimal_loop.py MODEL CONFIG DATA STEPS OUT.json [LOG_EVERY]
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(model_ref: str, config_path: str, data_dir: str, steps: int, out: str, log_every: int = 10) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from toolkit.data.loader import PackedData, TrainLoader
    from toolkit.plan.load import load_model
    from toolkit.run.models import hf_config

    deepspeed.init_distributed()
    accel = deepspeed.get_accelerator()
    accel.set_device(int(__import__("os").environ.get("LOCAL_RANK", "0")))
    cfg = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(load_model(model_ref)))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    loader = TrainLoader(
        PackedData(Path(data_dir) / "train", 0), micro * gas * world, micro, rank, world
    ).steps()
    event = accel.Event  # None on the CPU accelerator, whose work is done when the call returns
    ends = []
    for step in range(1, steps + 1):
        for b in next(loader):
            loss = engine(input_ids=b.input_ids.to(engine.device), labels=b.labels.to(engine.device)).loss
            engine.backward(loss)
            engine.step()
        if event is None:
            ends.append(time.perf_counter())
        else:
            ends.append(event(enable_timing=True))
            ends[-1].record()
        if step % log_every == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if event is None:
        periods = [b - a for a, b in itertools.pairwise(ends)]
    else:
        ends[-1].synchronize()
        periods = [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(ends)]
    if rank == 0:
        Path(out).write_text(json.dumps({"step_periods_s": [None, *periods]}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        sys.argv[5],
        int(sys.argv[6]) if len(sys.argv) > 6 else 10,
    )
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15 ("terminate called ..."), failing the job
