"""Run under the deepspeed launcher (2 ranks): build a >= 200M-parameter model for ZeRO-3 and record, per rank,
whether every parameter is partitioned before deepspeed.initialize, the RSS growth while building, and the
first loss of the initialised model. Writes OUT/rank{r}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from toolkit.plan.specs import ModelSpec
from toolkit.run.metrics import current_rss_bytes, peak_memory_bytes
from toolkit.run.runtime import init_distributed, keep_large_blocks_in_mmap, seed_everything, shutdown


def main(out: Path) -> None:
    import deepspeed
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from toolkit.run.models import build_model

    rt = init_distributed()
    spec = ModelSpec(
        name="zero3-216m",
        n_layers=17,  # 216M parameters: above the 200M the test asks for, at 70 % of the cost of 24
        hidden_size=1024,
        n_heads=16,
        vocab_size=2048,
        seq_length=128,
        dropout=False,
    )
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    seed_everything(0)
    before_rss, before_peak = current_rss_bytes(), peak_memory_bytes("cpu")
    model = build_model(spec, cfg)
    growth = max(current_rss_bytes(), peak_memory_bytes("cpu")) - max(before_rss, before_peak)
    params = list(model.parameters())
    partitioned = all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE and p.data.numel() == 0 for p in params)
    n_params = sum(p.ds_numel for p in params)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    torch.manual_seed(1)
    # 16 tokens are enough to see an initialised model's loss (≈ ln V); a full 128-token forward of 300M
    # parameters in bf16 costs ~100 s on a host whose bf16 matmul is emulated (AVX2 only)
    ids = torch.randint(0, spec.vocab_size, (1, 16))
    with torch.no_grad():
        loss = float(engine(input_ids=ids, labels=ids).loss.float())
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rt.rank}.json").write_text(
        json.dumps(
            {
                "rank": rt.rank,
                "n_params": n_params,
                "fp32_bytes": 4 * n_params,
                "rss_growth_bytes": growth,
                "all_partitioned": partitioned,
                "first_loss": loss,
            }
        )
    )
    shutdown()


if __name__ == "__main__":
    keep_large_blocks_in_mmap()  # as dstk train does, before torch is imported
    main(Path(sys.argv[1]))
    from toolkit.run.runtime import exit_without_teardown

    exit_without_teardown()  # gloo's teardown aborts ~1 exit in 15 ("terminate called ..."), failing the job
