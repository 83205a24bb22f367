"""Gemma 3, the family added through the family table alone: its sizes against the technical report, its HF
config both ways (the hub's own file), its sliding window in the FLOPs, what it refuses, and a tiny one trained
on 2 gloo ranks and exported back to HF with equal logits."""

from __future__ import annotations

import json

import pytest

from tests.cli import dstk
from toolkit.errors import UserError
from toolkit.plan.cost.flops import attention_flops_per_token
from toolkit.plan.hf_config import from_hf_config, to_hf_config
from toolkit.plan.load import load_model
from toolkit.plan.params import count_params
from toolkit.plan.specs import ModelSpec

# google/gemma-3-1b-pt config.json as published on the HF hub (transformers 4.50.0.dev0 wrote it).
GEMMA_3_1B_HUB = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "initializer_range": 0.02,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "use_cache": True,
    "vocab_size": 262144,
}

# Gemma Team 2025, "Gemma 3 Technical Report" (arXiv:2503.19786), Table 1: non-embedding parameters, millions.
REPORT_NON_EMBEDDING_M = {"gemma-3-1b": 698, "gemma-3-4b": 3209, "gemma-3-12b": 10759, "gemma-3-27b": 25600}


@pytest.mark.parametrize("name", sorted(REPORT_NON_EMBEDDING_M))
def test_presets_have_the_reports_sizes(name: str) -> None:
    pc = count_params(load_model(name))
    assert round((pc.total - pc.word_embedding) / 1e6) == REPORT_NON_EMBEDDING_M[name]


def test_the_hub_config_loads_to_the_preset_and_back(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA_3_1B_HUB))
    spec = load_model(str(path), {"seq_length": 8192})
    preset = load_model("gemma-3-1b")
    assert spec.model_dump(exclude={"name"}) == preset.model_dump(exclude={"name"})
    assert count_params(spec).total == 999_885_952  # the hub model's size
    # the run path builds the hub config itself; the preset (no source config) is written as transformers 5
    # writes it: its layer pattern, read again as the same spec
    assert to_hf_config(spec)["sliding_window_pattern"] == 6
    hf = to_hf_config(preset)
    assert hf["model_type"] == "gemma3_text"
    assert hf["layer_types"][:6] == ["sliding_attention"] * 5 + ["full_attention"]
    again = from_hf_config({k: v for k, v in hf.items()}, "x")
    assert again["sliding_window_pattern"] == 6 and again["sliding_window"] == 512


def test_hf_config_refusals_name_the_key() -> None:
    shape = dict(GEMMA_3_1B_HUB, num_hidden_layers=4)
    with pytest.raises(UserError, match="layer_types"):
        from_hf_config(dict(shape, layer_types=["full_attention", "sliding_attention"] * 2), "c")
    with pytest.raises(UserError, match="use_bidirectional_attention"):
        from_hf_config(dict(shape, use_bidirectional_attention=True), "c")
    with pytest.raises(UserError, match=r"image-text model.*text_config"):
        from_hf_config({"model_type": "gemma3", "text_config": shape}, "c")
    with pytest.raises(ValueError, match="sliding_window: HF's llama"):
        ModelSpec(architecture="llama", n_layers=2, hidden_size=64, n_heads=4, vocab_size=64, seq_length=32,
                  sliding_window=16)  # fmt: skip


def test_local_layers_attend_over_their_window_in_the_model_flops() -> None:
    """PaLM's 12·H·Q·T per layer with T the keys attended: at 32k tokens the 1B's 22 local layers of 512
    keys and 4 global layers of 32768."""
    spec = load_model("gemma-3-1b", {"seq_length": 32768})
    assert spec.n_local_layers == 22
    assert attention_flops_per_token(spec) == 12 * 4 * 256 * (4 * 32768 + 22 * 512)
    whole = spec.model_copy(update={"sliding_window": None})
    assert attention_flops_per_token(whole) == 12 * 4 * 256 * 26 * 32768


@pytest.mark.parametrize("name", ["gemma-3-1b", "gemma-3-27b"])
def test_presets_estimate_plan_and_build(tmp_path, name: str) -> None:
    est = dstk("estimate", "--model", name, "--cluster", "h200", "--zero-stage", "3", "--json")
    assert est.code == 0, est.err
    plan = dstk("plan", "--model", name, "--cluster", "h200", "--nodes", "2", "--json")
    assert plan.code == 0, plan.err
    assert json.loads(plan.out)["layout"]["pp"] == 1  # no Gemma pipeline: the planner never picks one
    cfg = tmp_path / "ds.json"
    built = dstk("config", "--model", name, "--cluster", "h200", "--plan", "-o", str(cfg))
    assert built.code == 0, built.err
    assert json.loads(cfg.read_text())["train_micro_batch_size_per_gpu"] >= 1


def test_what_gemma_cannot_do_is_one_line() -> None:
    pp = dstk("config", "--model", "gemma-3-1b", "--cluster", "h200", "--pp", "2", "-o", "/dev/null")
    assert pp.code == 2 and "--pp: dstk pipelines" in pp.err and "not gemma3" in pp.err, pp.err
    assert len(pp.err.strip().splitlines()) == 1
    meg = dstk("config", "--model", "gemma-3-1b", "--cluster", "h200", "--megatron", "-o", "/dev/null")
    assert meg.code == 2 and "embeddings scaled by √h" in meg.err, meg.err
    from toolkit.plan.growth_map import plan_growth

    small = load_model("tiny-gemma3")
    with pytest.raises(UserError, match="grow in depth only"):
        plan_growth(small, small.model_copy(update={"hidden_size": 256, "ffn_hidden_size": 768, "n_heads": 8,
                                                    "n_kv_heads": 2}))  # fmt: skip
    with pytest.raises(UserError, match="local/global layer pattern"):
        plan_growth(small, small.model_copy(update={"n_layers": 4}), depth_method="interleave")
    assert plan_growth(small, small.model_copy(update={"n_layers": 4})).blocks == [
        (0, False), (1, False), (0, True), (1, True)
    ]  # fmt: skip


@pytest.mark.multiprocess
def test_tiny_gemma_trains_on_two_ranks_and_exports_equal_logits(tmp_path, prepared_data) -> None:
    """ZeRO-2 in fp32 on 2 gloo ranks: the loss falls; `dstk export` gives a Gemma3ForCausalLM whose logits
    equal those of transformers' own model loaded with DeepSpeed's consolidated fp32 weights."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    from tests.distributed import config, launch
    from toolkit.run.checkpoint import complete_tags

    model = "tiny-gemma3"
    cfg = config(
        tmp_path / "ds.json", "--model", model, "--zero-stage", "2", "--precision", "fp32",
        "--micro-batch", "4", "--global-batch", "8", "--lr", "3e-3", "--train-steps", "8",
        "--warmup-steps", "2", "--log-dir", str(tmp_path / "logs"),
    )  # fmt: skip
    ckpt = tmp_path / "ckpt"
    args = ["--model", model, "--data", str(prepared_data), "--steps", "8", "--log-every", "1"]
    job = launch(tmp_path / "run", cfg, [*args, "--checkpoint-dir", str(ckpt)])
    assert job.code == 0, job.output[-4000:]
    losses = job.summary["losses"]
    assert losses[-1] < losses[0]
    out = tmp_path / "hf"
    exported = dstk("export", "--model", model, "--checkpoint", str(ckpt), "--out", str(out))
    assert exported.code == 0, exported.err
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    assert hf.config.layer_types == ["sliding_attention", "full_attention"] and hf.config.sliding_window == 32
    reference = Gemma3ForCausalLM(
        Gemma3TextConfig(
            num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
            intermediate_size=384, vocab_size=2048, max_position_embeddings=128, sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
        )
    ).eval()  # fmt: skip
    tag = next(iter(complete_tags(ckpt)))  # newest first
    assert tag.endswith("8"), tag
    state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag)
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    reference.tie_weights()
    ids = torch.arange(96).reshape(2, 48) % 2048  # longer than the window: the local layer's mask matters
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=ids).logits, reference(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
