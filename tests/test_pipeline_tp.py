"""Pipeline and tensor parallelism on 2 gloo ranks: a 2-stage PipelineModule that computes what the HF model
computes, and DeepSpeed AutoTP on a tiny Llama matching a 1-rank run."""

from __future__ import annotations

import shutil

import pytest

from tests.cli import REPO
from tests.conftest import train_args
from tests.distributed import TEST_MODEL, assert_export_generates, config, launch

pytestmark = pytest.mark.multiprocess
LLAMA = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")


def _first_batch_loss(model_dir, data, micro: int, global_batch: int) -> float:
    """The unpipelined HF model's mean loss over the micro-batches of the first step."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.data.loader import PackedData, TrainLoader

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    steps = TrainLoader(PackedData(data / "train", 0), global_batch, micro, 0, 1).steps()
    batches = next(steps)
    steps.close()
    with torch.no_grad():
        return sum(float(model(input_ids=b.input_ids, labels=b.labels).loss) for b in batches) / len(batches)


def test_two_stage_pipeline(tmp_path, prepared_data, init_weights) -> None:
    cfg = config(
        tmp_path / "pp.json",
        "--model",
        TEST_MODEL,
        "--pp",
        "2",
        "--zero-stage",
        "1",
        "--precision",
        "fp32",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        "12",
        "--warmup-steps",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", "6", "--async-save"]
    straight = launch(
        tmp_path / "straight", cfg, train_args(prepared_data, 12, "--init-from", str(init_weights), *ckpt)
    )
    assert straight.code == 0, straight.output[-4000:]
    losses = straight.summary["losses"]
    assert losses[0] == pytest.approx(_first_batch_loss(init_weights, prepared_data, 2, 8), rel=1e-5)
    assert losses[-1] < losses[0] - 0.3
    # the (asynchronous) step-6 checkpoint alone in a directory, as a run stopped after 6 steps leaves it,
    # resumed to 12
    shutil.copytree(tmp_path / "ckpt" / "step00000006", tmp_path / "half" / "step00000006")
    resume = ["--checkpoint-dir", str(tmp_path / "half"), "--resume", "auto"]
    resumed = launch(tmp_path / "b", cfg, train_args(prepared_data, 12, *resume))
    assert resumed.code == 0, resumed.output[-4000:]
    assert "at step 6" in resumed.output
    assert resumed.summary["losses"] == pytest.approx(losses, rel=1e-6, abs=1e-6)


def test_autotp_matches_one_rank(tmp_path, prepared_data) -> None:
    import torch

    from toolkit.plan.load import load_model
    from toolkit.run.models import build_model

    weights = tmp_path / "llama"
    torch.manual_seed(0)
    build_model(load_model(LLAMA), {}).save_pretrained(weights)
    args = [
        "--model",
        LLAMA,
        "--precision",
        "fp32",
        "--micro-batch",
        "4",
        "--global-batch",
        "8",
        "--lr",
        "3e-3",
        "--train-steps",
        "5",
        "--warmup-steps",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    tp_cfg = config(tmp_path / "tp.json", *args, "--tp", "2")
    one_cfg = config(tmp_path / "one.json", *args, "--gpus-per-node", "1")
    run_args = [
        "--model",
        LLAMA,
        "--data",
        str(prepared_data),
        "--steps",
        "5",
        "--log-every",
        "1",
        "--init-from",
        str(weights),
    ]
    tp = launch(tmp_path / "tp", tp_cfg, run_args)
    assert tp.code == 0, tp.output[-4000:]
    one = launch(tmp_path / "one", one_cfg, [*run_args, "--checkpoint-dir", str(tmp_path / "ckpt")], ranks=1)
    assert one.code == 0, one.output[-4000:]
    # the Llama run exported with its tokenizer generates like the GPT-2 one (test_run_path)
    from tests.cli import dstk

    out = tmp_path / "hf"
    r = dstk(
        "export", "--model", LLAMA, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out),
        "--tokenizer", str(prepared_data / "tokenizer"),
    )  # fmt: skip
    assert r.code == 0, r.err
    assert_export_generates(out)
    assert tp.summary["losses"] == pytest.approx(one.summary["losses"], rel=1e-4)
    held = [r["dense"] for r in tp.summary["params_on_rank"]]
    whole = one.summary["params_on_rank"][0]["dense"]
    assert held[0] == held[1] and 0.45 * whole < held[0] < 0.75 * whole  # about half: matrices split
    assert held[0] == pytest.approx(tp.summary["predicted"]["params_per_rank"]["dense"], rel=0.02)
