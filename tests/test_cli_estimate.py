"""`dstk estimate` and `dstk presets` from the command line: JSON contract, errors, start-up cost."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli import REPO, dstk, dstk_process

DESIGN_KEYS = {
    "memory_per_gpu_bytes",
    "fits",
    "step_time_s",
    "tokens_per_s",
    "tflops_per_gpu",
    "mfu",
    "layout",
    "n_params",
    "n_active_params",
}


def test_estimate_json_contract() -> None:
    r = dstk(
        "estimate",
        "--model",
        "llama-7b",
        "--cluster",
        "dgx-a100-80g",
        "--nodes",
        "2",
        "--zero-stage",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "64",
        "--recompute",
        "selective",
        "--json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert set(data) >= DESIGN_KEYS
    assert {"params", "gradients", "optimizer_states", "activations", "total"} <= set(
        data["memory_per_gpu_bytes"]
    )
    layout = data["layout"]
    assert (layout["dp"], layout["gradient_accumulation_steps"], layout["global_batch_size"]) == (16, 2, 64)
    assert data["n_params"] == 6_738_415_616 and data["fits"] is True
    assert r.out.endswith("\n") and r.out == json.dumps(data, sort_keys=True, indent=2) + "\n"


def test_estimate_params_flag_and_table() -> None:
    r = dstk(
        "estimate",
        "--params",
        "175e9",
        "--cluster",
        "dgx-a100-80g",
        "--nodes",
        "64",
        "--tp",
        "8",
        "--pp",
        "8",
        "--zero-stage",
        "1",
        "--global-batch",
        "1536",
        "--recompute",
        "full",
    )
    assert r.code == 0, r.err
    assert "Memory per GPU" in r.out and "MFU" in r.out


def test_layout_that_does_not_fit_is_not_an_error() -> None:
    r = dstk("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--json")
    assert r.code == 0
    assert json.loads(r.out)["fits"] is False


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ["--model", "gpt-7", "--cluster", "cpu"],
            "--model: 'gpt-7' is neither a preset nor an existing file",
        ),
        (["--model", "gpt2", "--cluster", "dgx-a100"], "did you mean dgx-a100-40g"),
        (
            ["--model", "gpt2", "--cluster", "cpu", "--tp", "5"],
            r"--tp/--pp/--sp: world_size\(2\) = nodes\(1\) × gpus_per_node\(2\) is not divisible by tp\(5\)",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--tp", "8"],
            r"--tp: n_heads\(12\) and n_kv_heads\(12\) must be divisible by tp\(8\); valid: 1, 2, 3, 4, 6, 12",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--tp", "2", "--pp", "3"],
            r"is not divisible by tp\(2\) × pp\(3\)",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--micro-batch", "3", "--global-batch", "100"],
            r"--global-batch: global_batch_size\(100\) is not divisible by micro_batch_size\(3\) × dp\(8\) = 24; valid nearby: 96, 120",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--micro-batch", "0"],
            "--micro-batch: input should be greater than 0",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--nodes", "-1"],
            "nodes: input should be greater than 0",
        ),
        (
            ["--model", "gpt2", "--cluster", "cpu", "--precision", "fp16"],
            "--precision: fp16 is not supported on cpu",
        ),
        (
            ["--model", "gpt2", "--cluster", "cpu", "--offload-param", "cpu"],
            "--offload-param: parameter offload needs ZeRO stage 3",
        ),
        (
            ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--pp", "2", "--zero-stage", "2"],
            "--pp: pipeline parallelism",
        ),
        (["--model", "gpt2", "--cluster", "cpu", "--ep", "2"], "--ep: expert parallelism"),
        (["--params", "5", "--cluster", "cpu"], r"--params: 5 is out of range"),
        (["--model", "missing.yaml", "--cluster", "cpu"], r"missing.yaml: file not found"),
        (
            ["--model", "gpt2", "--cluster", "cpu", "--zero-stage", "4"],
            r"argument --zero-stage: invalid choice",
        ),
        (["--model", "gpt2", "--cluster", "cpu", "--tp", "two"], r"argument --tp: invalid int value"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], match: str) -> None:
    import re

    r = dstk("estimate", *args)
    assert r.code == 2, (r.out, r.err)
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert re.search(match, r.err), r.err


def test_bad_files_exit_2(tmp_path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("nodes: [1\n")
    misspelt = tmp_path / "cluster.yaml"
    misspelt.write_text("nodes: 1\ngpus_per_nod: 8\n")
    for path, match in ((bad_yaml, "malformed YAML at line"), (misspelt, "gpus_per_nod: unknown field")):
        r = dstk("estimate", "--model", "gpt2", "--cluster", str(path))
        assert r.code == 2 and match in r.err and r.err.count("\n") == 1


def test_subprocess_error_has_no_traceback() -> None:
    r = dstk_process("estimate", "--model", "gpt2", "--cluster", "cpu", "--tp", "3")
    assert r.code == 2 and "Traceback" not in r.err and r.err.startswith("dstk estimate: error: --tp")


def test_presets_lists_both_kinds() -> None:
    r = dstk("presets", "--json")
    data = json.loads(r.out)
    assert {m["name"] for m in data["models"]} >= {"gpt2", "gpt-1t", "mixtral-8x7b"}
    assert {c["name"] for c in data["clusters"]} >= {"dgx-h100", "cpu"}
    assert "Cluster presets" in dstk("presets").out


def test_import_path_never_loads_torch_or_deepspeed() -> None:
    """`import toolkit.cli` and a whole `dstk estimate` run stay clear of torch and deepspeed."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import toolkit.cli"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    modules = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not modules & {"torch", "deepspeed", "transformers", "datasets"}
    code = (
        "import sys; from toolkit.cli import main; "
        "rc = main(['estimate', '--model', 'gpt-1t', '--cluster', 'dgx-a100-80g', '--nodes', '384', '--tp', '8', "
        "'--pp', '64', '--zero-stage', '1', '--json']); "
        "assert rc == 0; bad = {'torch', 'deepspeed'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)


def test_plan_shows_the_recipe_and_lays_the_schedule_over_the_token_budget() -> None:
    """Issue 12 point 3: the generated optimizer and schedule follow toolkit/plan/recipes.py, visibly; with --tokens
    the cosine schedule spans tokens / (global batch × sequence length) steps."""
    import json
    import math

    from toolkit.plan import recipes

    r = dstk("plan", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--tokens", "300e9", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    cfg, layout = data["ds_config"], data["layout"]
    steps = math.ceil(300e9 / (layout["global_batch_size"] * 1024))
    assert cfg["scheduler"]["params"]["total_num_steps"] == steps
    assert cfg["optimizer"]["params"]["betas"] == list(recipes.ADAM_BETAS)
    assert cfg["gradient_clipping"] == recipes.GRADIENT_CLIPPING
    assert cfg["optimizer"]["params"]["lr"] == pytest.approx(recipes.peak_learning_rate(124_439_808))
    assert f"over {steps} steps" in data["recipe"] and "GPT-3" in data["recipe"]
    text = dstk("plan", "--model", "gpt2", "--cluster", "dgx-a100-80g")
    assert "Optimisation recipe: AdamW β=(0.9, 0.95)" in text.out
