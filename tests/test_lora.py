"""LoRA through the real run path: `dstk train --lora` on 2 gloo ranks at ZeRO-2 and ZeRO-3, from a local base
model (`--init-from`), against the cost model's LoRA accounting and peft's own loader."""

from __future__ import annotations

import math

import pytest

from tests.conftest import train_args, zero_config
from tests.distributed import TEST_MODEL, launch
from toolkit.plan.load import load_model
from toolkit.plan.lora import adapter_params, parse_lora

LORA = "r=8,alpha=16"


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, prepared_data, init_weights):
    """The same LoRA fine-tune at ZeRO-2 (config planned with --lora) and ZeRO-3 (--lora on dstk train)."""
    root = tmp_path_factory.mktemp("lora")
    jobs = {}
    for stage in (2, 3):
        extra = ("--lora", LORA) if stage == 2 else ()
        cfg = zero_config(root / f"z{stage}.json", stage, *extra)
        args = train_args(prepared_data, 6, "--init-from", str(init_weights), "--eval-every", "3")
        if stage == 3:
            args += ["--lora", LORA]
        jobs[stage] = launch(root / f"run{stage}", cfg, args)
        assert jobs[stage].code == 0, jobs[stage].output[-3000:]
    return jobs


@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_trains_only_the_adapters(lora_runs, stage) -> None:
    s = lora_runs[stage].summary
    spec = load_model(TEST_MODEL)
    lora = s["lora"]
    assert lora["trainable_params"] == adapter_params(spec, parse_lora(LORA))
    assert lora["frozen_max_abs_change"] == 0.0  # the base model is bit-identical after training
    assert lora["adapter_max_abs_change"] > 1e-4
    # it learns: the held-out loss (the same rows each time) falls from step 3 to step 6; single training
    # batches are too noisy to compare over 6 steps from a randomly initialised base
    assert [e["step"] for e in s["evals"]] == [3, 6] and s["evals"][1]["loss"] < s["evals"][0]["loss"]
    assert s["layout"]["lora"] == LORA


@pytest.mark.multiprocess
@pytest.mark.parametrize("stage", [2, 3])
def test_lora_engine_states_match_the_prediction(lora_runs, stage) -> None:
    """The engine's model states (frozen fp32 base, adapters with their fp32 masters, Adam moments and
    gradients), counted tensor by tensor, against `dstk estimate --lora`'s inventory."""
    s = lora_runs[stage].summary
    measured = max(s["model_state_bytes"]["after_step"])
    predicted = s["predicted"]["engine_model_states_bytes"]
    assert measured == pytest.approx(predicted["total"], rel=0.02)
    # the optimizer holds moments for the adapters alone: 8 bytes per adapter parameter over the ZeRO ranks
    n = s["lora"]["trainable_params"]
    assert predicted["optimizer_moments"] == pytest.approx(8 * n / 2, rel=0.02)


@pytest.mark.multiprocess
def test_lora_adapters_save_and_load_with_peft(lora_runs, init_weights, prepared_data) -> None:
    """RUN_DIR/adapter loads onto the base with peft and gives the held-out loss the run measured."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from toolkit.data.loader import PackedData, eval_batches

    s = lora_runs[2].summary
    base = AutoModelForCausalLM.from_pretrained(init_weights, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, s["lora"]["adapter_dir"]).eval()
    per_rank = []
    with torch.no_grad():  # what the trainer's evaluation does on each of its 2 ranks, in one process
        for rank in (0, 1):
            total, tokens = 0.0, 0
            for batch in eval_batches(PackedData(prepared_data / "validation", 0), 4, rank, 2, 64):
                n = int((batch.labels[:, 1:] != -100).sum())
                total += float(model(input_ids=batch.input_ids, labels=batch.labels).loss) * n
                tokens += n
            per_rank.append(total / tokens)
    loss = sum(per_rank) / 2
    final_eval = s["evals"][-1]["loss"]
    assert loss == pytest.approx(final_eval, rel=1e-4)
    assert math.isfinite(loss)


def test_a_lora_runs_measured_tflops_use_the_estimates_formula() -> None:
    """The run's Meter and the estimate count a LoRA token alike (4·N + attention: no weight gradients for
    the frozen base); the run used to count 6·N, so its measured-vs-predicted row was off by up to 1.5×."""
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.layout import LayoutRequest
    from toolkit.plan.load import load_cluster
    from toolkit.plan.rules import resolve_layout
    from toolkit.run.metrics import Meter

    model, cluster = load_model("llama-7b"), load_cluster("dgx-a100-80g")
    request = LayoutRequest(zero_stage=2, micro_batch_size=2, global_batch_size=64, lora="r=16,alpha=32")
    est = estimate(model, cluster, resolve_layout(model, cluster, request, scopes=("layout", "deepspeed")))
    tokens = est.layout.global_batch_size * model.seq_length
    meter = Meter(model, est.layout.world_size, tokens, cluster.peak_flops("bf16"), frozen=True)
    rates = meter.rates(est.time.total_s)
    assert rates["tflops_per_gpu"] == pytest.approx(est.tflops_per_gpu, rel=1e-9)
    assert rates["mfu"] == pytest.approx(est.mfu, rel=1e-9)
    full = Meter(model, est.layout.world_size, tokens, cluster.peak_flops("bf16")).rates(est.time.total_s)
    assert full["tflops_per_gpu"] > 1.4 * rates["tflops_per_gpu"]  # what the run reported before
