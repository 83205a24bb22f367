"""The hand-written baseline for benchmarks/overhead.py: the shortest correct DeepSpeed training loop over the
same model, config and data as `dstk train`, timing its steps the same way. Run under the deepspeed launcher:
    deepspeed --num_gpus 2 --no_local_rank benchmarks/minimal_loop.py MODEL CONFIG DATA STEPS OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(model_ref: str, config_path: str, data_dir: str, steps: int, out: str) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from toolkit.data.loader import PackedData, TrainLoader
    from toolkit.plan.load import load_model
    from toolkit.run.models import hf_config

    deepspeed.init_distributed()
    cfg = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(load_model(model_ref)))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    loader = TrainLoader(
        PackedData(Path(data_dir) / "train", 0), micro * gas * world, micro, rank, world
    ).steps()
    times = []
    for _ in range(steps):
        batches = next(loader)
        t = time.perf_counter()
        for b in batches:
            loss = engine(input_ids=b.input_ids, labels=b.labels).loss
            engine.backward(loss)
            engine.step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_times_s": times}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15 ("terminate called ..."), failing the job
