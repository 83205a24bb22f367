"""`dstk config --megatron-core` and `--target megatron-core` as a user meets them: where the arguments go, what
is refused (one line, exit 2, nothing written), the planner's layouts end to end, the values an HF config.json
adds, and — opt-in, where a Megatron-LM checkout and a Python with torch are named — Megatron-LM's own
`validate_args` and TransformerConfig on the emitted arguments."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.cli import dstk
from tests.megatron_flags import MEGATRON_LM, parse_verified
from tests.test_megatron_core import CASES, emit

REPO = Path(__file__).resolve().parents[1]
MIXTRAL = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2"]
LLAMA = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2"]
# the DeepSeek-V3 config.json (deepseek-ai/DeepSeek-V3) without its YaRN context extension, which the
# refusal test puts back
DEEPSEEK_HF = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "tie_word_embeddings": False,
    "topk_group": 4, "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip


def _hf_config(tmp_path: Path, **changes: object) -> str:
    path = tmp_path / "deepseek-v3" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({**DEEPSEEK_HF, **changes}))
    return str(path)


def test_arguments_go_to_stdout_and_to_file(tmp_path) -> None:
    flags = [*LLAMA, "--tp", "2", "--global-batch", "64"]
    res = dstk("config", *flags, "--megatron-core", "-o", "-")
    assert res.code == 0, res.err
    assert not list(tmp_path.iterdir())
    parse_verified(shlex.split(res.out), MEGATRON_LM)
    # --target megatron-core is the same request: Megatron-Core reads no DeepSpeed JSON
    out = tmp_path / "sub" / "args.txt"
    again = dstk("config", *flags, "--target", "megatron-core", "-o", str(out))
    assert again.code == 0, again.err
    assert again.out == res.out == out.read_text()
    assert f"wrote {out} (Megatron-LM d98e8a64;" in again.err


BAD = [
    ("with-megatron", [*MIXTRAL, "--megatron-core", "--megatron"], r"--megatron-core: Megatron-LM has its own launcher"),
    ("with-hf-trainer", [*LLAMA, "--target", "megatron-core", "--hf-trainer"], r"cannot be combined with --megatron, --hf-trainer"),
    ("megatron-for-core", [*LLAMA, "--megatron", "--target", "megatron-core"], r"--megatron: writes for Megatron-DeepSpeed .*use --megatron-core"),
    ("core-for-megatron", [*LLAMA, "--megatron-core", "--target", "megatron"], r"--megatron-core: writes for --target megatron-core"),
    ("core-knob-default-target", [*MIXTRAL, "--ep", "8", "--etp", "1"], r"--etp \(MoE parallel folding\): Megatron-Core's; .*use --target megatron-core"),
    ("alibi", ["--model", "bloom-176b", "--cluster", "dgx-h100", "--nodes", "8", "--megatron-core"], r"--target megatron-core: .* cannot express ALiBi positions"),
    ("sliding-window", ["--model", "gemma-3-27b", "--cluster", "dgx-h100", "--megatron-core"], r"cannot express .*sliding-window layers \(dstk writes no --window-size\)"),
    ("attention-sinks", ["--model", "gpt-oss-120b", "--cluster", "dgx-h100", "--megatron-core"], r"attention sinks .*a router with a bias"),
    ("whole-projection-qk-norm", ["--model", "olmo2-13b", "--cluster", "dgx-h100", "--megatron-core"], r"q/k norms other than per-head"),
    ("cpu", ["--model", "tests/models/tiny-test-llama.yaml", "--cluster", "cpu", "--megatron-core"], r"Megatron-LM trains on CUDA \(and ROCm\) GPUs; cluster cpu is cpu"),
    ("moe-tp-without-etp", [*MIXTRAL, "--tp", "2", "--ep", "8", "--megatron-core"], r"--etp: Megatron-Core folds experts over TP × CP × DP"),
    ("whole-embedding", [*LLAMA, "--tp", "2", "--no-tp-vocab-parallel", "--megatron-core"], r"--tp-vocab-parallel: Megatron-Core always splits"),
    ("experts-tp-without-sp", [*MIXTRAL, "--tp", "2", "--ep", "8", "--etp", "1", "--no-tp-sequence-parallel", "--megatron-core"], r"--tp-sequence-parallel: Megatron-Core runs experts"),
    ("tp-overlap-without-sp", [*LLAMA, "--tp", "2", "--no-tp-sequence-parallel", "--comm-overlap", "--megatron-core"], r"--comm-overlap: Megatron-Core's --tp-comm-overlap needs --tp-sequence-parallel"),
    ("cp-chunks", [*LLAMA, "--seq-length", "4100", "--sp", "4", "--megatron-core"], r"--sp: .*seq_length\(4100\) divisible by 2 × sp\(4\)"),
    ("cp-kv-heads", [*LLAMA, "--tp", "4", "--sp", "4", "--megatron-core"], r"key/value heads per TP rank \(8, 2\) divisible"),
    ("unfused", [*LLAMA, "--no-fused-kernels", "--megatron-core"], r"--no-fused-kernels: Megatron-Core runs Transformer Engine's fused norms"),
    ("early-stop", [*LLAMA, "--recompute", "full", "--recompute-early-stop", "--megatron-core"], r"--recompute-early-stop: Megatron-Core's checkpoint"),
    ("deepspeed-option", [*LLAMA, "--wandb", "--megatron-core"], r"--wandb: DeepSpeed config options"),
    ("moe-cuda-graphs", [*MIXTRAL, "--ep", "8", "--cuda-graphs", "--megatron-core"], r"--cuda-graphs: Megatron-Core graphs an MoE model's step only with static expert shapes"),
    ("graphed-dropout-recompute", ["--model", "gpt2", "--cluster", "dgx-h100", "--recompute", "selective", "--cuda-graphs", "--megatron-core"], r"--cuda-graphs: Megatron-Core cannot recompute attention with dropout"),
    ("ep-overlap-fp32", [*MIXTRAL, "--ep", "8", "--etp", "1", "--ep-comm-overlap", "--precision", "fp32", "--megatron-core"], r"--ep-comm-overlap: .*bf16 or fp16 weights only"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "pattern"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_refusals_are_one_line_and_write_nothing(tmp_path, argv, pattern) -> None:
    out = tmp_path / "out" / "args.txt"
    res = dstk("config", *argv, "-o", str(out))
    assert res.code == 2, res.err
    lines = [line for line in res.err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.parent.exists()


def test_rope_scaling_from_a_config_json_is_refused(tmp_path) -> None:
    yarn = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}
    model = _hf_config(tmp_path, rope_scaling=yarn)
    res = dstk("config", "--model", model, "--seq-length", "4096", "--cluster", "dgx-h100", "--nodes", "32",
               "--pp", "8", "--ep", "32", "--zero-stage", "1", "--megatron-core", "-o", "-")  # fmt: skip
    assert res.code == 2 and "RoPE scaling (yarn in its config.json; dstk writes plain RoPE)" in res.err


def test_a_config_json_gives_what_the_description_lacks(tmp_path) -> None:
    flags = ["--seq-length", "4096", "--cluster", "dgx-h100", "--nodes", "32", "--pp", "8", "--ep", "32"]
    flags += ["--zero-stage", "1", "--recompute", "full"]
    res = dstk("config", "--model", _hf_config(tmp_path), *flags, "--megatron-core", "-o", "-")
    assert res.code == 0, res.err
    ns = parse_verified(shlex.split(res.out), MEGATRON_LM)
    assert (ns.rotary_base, ns.norm_epsilon, ns.moe_router_topk_scaling_factor) == (10000, 1e-6, 2.5)
    assert (ns.moe_router_num_groups, ns.moe_router_group_topk) == (8, 4)
    assert "description does not say" not in res.err
    preset = dstk("config", "--model", "deepseek-v3-671b", *flags, "--megatron-core", "-o", "-")
    assert preset.code == 0, preset.err
    ns = parse_verified(shlex.split(preset.out), MEGATRON_LM)
    assert ns.rotary_base is ns.norm_epsilon is ns.moe_router_num_groups is None
    note = next(line for line in preset.err.splitlines() if "description does not say" in line)
    assert all(f in note for f in ("--rotary-base", "--norm-epsilon", "--moe-router-topk-scaling-factor"))


def test_the_vocabulary_padding_is_said(tmp_path) -> None:
    _, _, err = emit(tmp_path, CASES["qwen3-235b-uneven-interleaved-fp8"])
    assert "multiple of 128 × tp(2): 151,936 → 152,064 rows (dstk priced 151,936)" in err
    _, _, err = emit(tmp_path, CASES["deepseek-v3-mtp-layout-folded-ep64"])  # 129,280 = 505 × 256
    assert "pads" not in err


@pytest.mark.parametrize(
    "flags",
    [
        ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "4"],
        ["--model", "llama-70b", "--cluster", "dgx-h100", "--nodes", "8", "--global-batch", "512"],
    ],
    ids=["moe", "dense"],
)
def test_plan_and_config_plan_for_megatron_core_agree(flags) -> None:
    planned = dstk("plan", *flags, "--target", "megatron-core", "--json")
    assert planned.code == 0, planned.err
    layout = json.loads(planned.out)["layout"]
    res = dstk("config", *flags, "--plan", "--megatron-core", "-o", "-")
    assert res.code == 0, res.err
    ns = parse_verified(shlex.split(res.out), MEGATRON_LM)
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (layout["tp"], layout["pp"])
    assert (ns.expert_model_parallel_size or 1, ns.context_parallel_size or 1) == (layout["ep"], layout["sp"])
    assert (ns.micro_batch_size, ns.global_batch_size) == (
        layout["micro_batch_size"],
        layout["global_batch_size"],
    )
    assert ns.sequence_parallel is layout["tp_sequence_parallel"] is (layout["tp"] > 1)
    # Megatron-Core's attention is Transformer Engine's fused kernel, and the plan priced it so
    assert layout["flash_attention"] and ns.attention_backend == "auto"
    assert layout["fused_kernels"] and layout["zero_stage"] <= 1


def test_plan_refuses_a_model_megatron_core_cannot_build() -> None:
    res = dstk("plan", "--model", "gemma-3-27b", "--cluster", "dgx-h100", "--target", "megatron-core")
    assert res.code == 2 and res.err.count("\n") == 1, res.err
    assert (
        "dstk plan: error: --target megatron-core: Megatron-Core's GPT model as dstk writes it cannot"
        in res.err
    )


def test_config_help_lists_megatron_core() -> None:
    res = dstk("config", "--help")
    assert (
        res.code == 0 and "--megatron-core" in res.out and "Megatron-LM (Megatron-Core, d98e8a64)" in res.out
    )


# ------------------------------------------------------------------ opt-in: Megatron-LM's own checks

MEGATRON_LM_SRC = os.environ.get("DSTK_MEGATRON_LM")
MEGATRON_LM_PYTHON = os.environ.get("DSTK_MEGATRON_LM_PYTHON")


@pytest.mark.skipif(
    not (MEGATRON_LM_SRC and MEGATRON_LM_PYTHON),
    reason="names a Megatron-LM checkout (DSTK_MEGATRON_LM, the folder holding megatron/, d98e8a64) and a "
    "Python with torch for it (DSTK_MEGATRON_LM_PYTHON)",
)
@pytest.mark.parametrize("case", list(CASES))
def test_megatron_lm_accepts_the_arguments(tmp_path, case) -> None:
    """Megatron-LM's validate_args and TransformerConfig.__post_init__ on CPU, the GPU queries answered as
    Hopper (Blackwell for the B200 cases) and Transformer Engine's version checks as met (neither runs here)."""
    flags, argv, _ = emit(tmp_path, CASES[case])
    cluster = flags[flags.index("--cluster") + 1]
    nodes = int(flags[flags.index("--nodes") + 1]) if "--nodes" in flags else 1
    script = REPO / "tests" / "scripts" / "megatron_lm_validate.py"
    proc = subprocess.run(
        [MEGATRON_LM_PYTHON, str(script), str(nodes * 8), "10" if "b200" in cluster else "9", *argv],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": MEGATRON_LM_SRC},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("OK"), proc.stdout + proc.stderr[-2000:]
