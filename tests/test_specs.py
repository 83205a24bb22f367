"""Model and cluster descriptions: loading, defaults, exact parameter counts, and their errors."""

from __future__ import annotations

import json

import pytest

from toolkit.errors import UserError
from toolkit.plan.architectures import ARCHITECTURES
from toolkit.plan.hf_config import to_hf_config
from toolkit.plan.load import load_cluster, load_model, model_from_params
from toolkit.plan.params import count_params, tensor_numels
from toolkit.plan.presets import preset_names
from toolkit.plan.specs import ClusterSpec, ModelSpec

DESIGN_MODEL_PRESETS = [
    "gpt2",
    "gpt2-xl",
    "llama-7b",
    "llama-13b",
    "llama-70b",
    "gpt3-175b",
    "bloom-176b",
    "mixtral-8x7b",
    "gpt-1t",
]
DESIGN_CLUSTER_PRESETS = ["dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "h200", "v100-32g", "cpu"]


def test_every_preset_named_in_design_exists() -> None:
    assert set(DESIGN_MODEL_PRESETS) <= set(preset_names("models"))
    assert set(DESIGN_CLUSTER_PRESETS) <= set(preset_names("clusters"))


@pytest.mark.parametrize("name", preset_names("models"))
def test_param_count_equals_hf_model_on_meta(name: str) -> None:
    """Exact counting: sum(p.numel()) of the HF model built from the same config on the meta device."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = load_model(name)
    config = AutoConfig.for_model(**to_hf_config(spec))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == count_params(spec).total


MODEL_CARDS = {
    # preset: (total, active) as the model card writes them (sources in each preset's comments); DeepSeek's,
    # Kimi's, Qwen's and gpt-oss's active counts leave out the input embedding (a lookup), Meta's count it
    "deepseek-v3-671b": ("671B", "37B"),
    "kimi-k2-1t": ("1T", "32B"),
    "qwen3-8b": ("8.2B", None),
    "qwen3-235b-a22b": ("235B", "22B"),
    "gpt-oss-120b": ("116.83B", "5.13B"),
    "gpt-oss-20b": ("20.91B", "3.61B"),
    "llama4-scout": (None, "17B"),  # the cards' 109B and 400B totals include the vision encoder
    "llama4-maverick": (None, "17B"),
    "olmo2-13b": ("13.7B", None),
}


def _as_card_writes(count: float, text: str) -> str:
    unit = 1e12 if text.endswith("T") else 1e9
    digits = len(text[:-1].split(".")[1]) if "." in text else 0
    return f"{count / unit:.{digits}f}{text[-1]}"


@pytest.mark.parametrize("name", list(MODEL_CARDS))
def test_presets_count_what_their_model_cards_say(name: str) -> None:
    total, active = MODEL_CARDS[name]
    pc = count_params(load_model(name))
    lookup = pc.word_embedding if pc.lm_head and not name.startswith("llama4") else 0
    if total:
        assert _as_card_writes(pc.total, total) == total
    if active:
        assert _as_card_writes(pc.active - lookup, active) == active


def test_known_published_counts() -> None:
    assert count_params(load_model("gpt2")).total == 124_439_808
    assert count_params(load_model("llama-7b")).total == 6_738_415_616
    mixtral = load_model("mixtral-8x7b")
    assert count_params(mixtral).total == 46_702_792_704
    assert 12.8e9 < count_params(mixtral).active < 13.0e9  # "~12.9B active" (Jiang et al. 2024)


def test_core_only_file_is_a_gpt_decoder(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: mine\nn_layers: 2\nhidden_size: 64\nn_heads: 4\nvocab_size: 100\nseq_length: 32\n")
    spec = load_model(str(path))
    assert (spec.architecture, spec.n_kv_heads, spec.ffn_hidden_size, spec.tied_embeddings) == (
        "gpt2",
        4,
        256,
        True,
    )
    assert spec.num_experts == 0 and spec.moe_top_k == 1 and spec.moe_layer_interval == 1


@pytest.mark.parametrize(
    "hf",
    [
        {
            "model_type": "gpt2",
            "n_layer": 2,
            "n_embd": 64,
            "n_head": 4,
            "vocab_size": 500,
            "n_positions": 128,
        },
        {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 172,
            "vocab_size": 500,
            "max_position_embeddings": 256,
        },
        {
            "model_type": "mistral",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 500,
        },
        {
            "model_type": "mixtral",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 96,
            "vocab_size": 500,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        },
        {
            "model_type": "qwen2",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 160,
            "vocab_size": 500,
            "tie_word_embeddings": True,
        },
        {"model_type": "bloom", "n_layer": 2, "hidden_size": 64, "n_head": 4, "vocab_size": 500},
        {
            "model_type": "qwen2_moe",
            "num_hidden_layers": 4,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 160,
            "vocab_size": 500,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 96,
            "decoder_sparse_step": 2,
        },
        {
            "model_type": "qwen3_moe",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 160,
            "vocab_size": 500,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
        },
    ],
    ids=lambda d: d["model_type"],
)
def test_hf_config_json_counts_like_hf(tmp_path, hf: dict) -> None:
    """An HF config.json (as `save_pretrained` writes it, defaults filled) loads to the same count."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**hf)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_dict()))
    spec = load_model(str(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert spec.architecture == hf["model_type"]
    assert count_params(spec).total == sum(p.numel() for p in model.parameters())


# The config.json files as published on the HF hub (Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen3-30B-A3B), verbatim but for
# the tokenizer ids and dtype, which do not change the shape.
QWEN_MOE_HUB_CONFIGS = {
    "Qwen1.5-MoE-A2.7B": (
        {
            "architectures": ["Qwen2MoeForCausalLM"],
            "attention_dropout": 0.0,
            "decoder_sparse_step": 1,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 5632,
            "max_position_embeddings": 8192,
            "max_window_layers": 21,
            "model_type": "qwen2_moe",
            "moe_intermediate_size": 1408,
            "norm_topk_prob": False,
            "num_attention_heads": 16,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "num_hidden_layers": 24,
            "num_key_value_heads": 16,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": 5632,
            "sliding_window": 32768,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        (14.3e9, 2.7e9),  # "14.3B parameters in total and 2.7B activated" (Qwen blog, 2024-03-28)
    ),
    "Qwen3-30B-A3B": (
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "decoder_sparse_step": 1,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 6144,
            "max_position_embeddings": 40960,
            "max_window_layers": 48,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_attention_heads": 32,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        (30.5e9, 3.3e9),  # "30.5B total, 3.3B activated" (Qwen3 technical report, Table 2)
    ),
}


@pytest.mark.parametrize("name", QWEN_MOE_HUB_CONFIGS)
def test_published_qwen_moe_configs_count_as_published_and_as_hf(tmp_path, name: str) -> None:
    """The hub's own config.json: the total and active counts are the model card's, the total equals
    the HF model's, and the spec builds the same HF config back (routing renormalisation included)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    data, (total, active) = QWEN_MOE_HUB_CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    spec = load_model(str(path))
    pc = count_params(spec)
    # the cards print one decimal (3.353e9 active is Qwen3's "3.3B")
    assert pc.total == pytest.approx(total, rel=0.005) and pc.active == pytest.approx(active, rel=0.02)
    config = AutoConfig.for_model(**to_hf_config(spec))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == pc.total
    assert config.norm_topk_prob == data["norm_topk_prob"]
    assert [p.numel() for p in model.parameters()] == list(tensor_numels(spec))


def test_qwen_moe_dense_layers_by_index_are_refused(tmp_path) -> None:
    data = {**QWEN_MOE_HUB_CONFIGS["Qwen3-30B-A3B"][0], "mlp_only_layers": [0, 1]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="mlp_only_layers"):
        load_model(str(path))


@pytest.mark.parametrize("target", [7.5e9, 175e9, 1e12, 1.3e9])
def test_params_builds_gpt3_shape_within_half_percent(target: float) -> None:
    spec = model_from_params(target)
    assert abs(count_params(spec).total / target - 1) < 0.005
    assert spec.n_heads % 8 == 0 and spec.hidden_size % spec.n_heads == 0


def test_175e9_is_gpt3_shape() -> None:
    spec = model_from_params(175e9)
    assert (spec.n_layers, spec.hidden_size, spec.n_heads) == (96, 12288, 96)


def test_cluster_file_with_first_group_only_loads(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "nodes: 2\ngpus_per_node: 4\naccelerator: cuda\ngpu_memory_gib: 24\ngpu_peak_tflops: 100\n"
        "intra_node_gb_per_s: 50\ninter_node_gb_per_s: 12.5\ncpu_memory_gib: 256\nnvme_gib: 0\n"
    )
    cluster = load_cluster(str(path))
    assert cluster.world_size == 8 and cluster.supports_fp16 and cluster.gpu_fp32_peak_tflops == 100 / 16


def test_cluster_overrides_and_cpu_rules() -> None:
    cluster = load_cluster("dgx-a100-80g", {"nodes": 48})
    assert cluster.nodes == 48 and cluster.world_size == 384
    cpu = load_cluster("cpu")
    assert not cpu.supports("fp16") and cpu.supports("bf16")


def test_specs_are_frozen() -> None:
    spec = load_model("gpt2")
    with pytest.raises(Exception, match="frozen"):
        spec.n_layers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "n_layers: 2\nhidden_size: 64\nn_heads: 4\nvocab_size: 10\nseq_length: 8\nn_layer: 3\n",
            r"n_layer: unknown field \(did you mean n_layers\?\)",
        ),
        (
            "n_layers: 0\nhidden_size: 64\nn_heads: 4\nvocab_size: 10\nseq_length: 8\n",
            r"n_layers: input should be greater than 0",
        ),
        (
            "n_layers: 2\nhidden_size: 64\nn_heads: 5\nvocab_size: 10\nseq_length: 8\n",
            r"hidden_size\(64\) is not divisible by n_heads\(5\)",
        ),
        (
            "n_layers: 2\nhidden_size: 64\nn_heads: 4\nn_kv_heads: 3\nvocab_size: 10\nseq_length: 8\n",
            r"n_kv_heads",
        ),
        ("n_layers: 2\nhidden_size: 64\n", r"n_heads: required field missing"),
        ("n_layers: [2\n", r"malformed YAML at line"),
        ("- 1\n- 2\n", r"expected a mapping"),
    ],
)
def test_bad_model_files_name_the_field(tmp_path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match) as info:
        load_model(str(path))
    assert "\n" not in str(info.value)


def test_unknown_preset_suggests_close_name() -> None:
    with pytest.raises(UserError, match=r"did you mean llama-7b\?"):
        load_model("lama-7b")


def test_missing_file() -> None:
    with pytest.raises(UserError, match=r"nope\.yaml: file not found"):
        load_cluster("nope.yaml")


def test_misspelt_cluster_field(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: 1\ngpus_per_nod: 8\n")
    with pytest.raises(
        UserError, match=r"cluster.yaml: gpus_per_nod: unknown field \(did you mean gpus_per_node\?\)"
    ):
        load_cluster(str(path))


def test_field_docstrings_become_descriptions() -> None:
    """Every field documents itself (the CLI help is built from these)."""
    for cls in (ModelSpec, ClusterSpec):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no docstring"


def test_the_architecture_table_covers_exactly_the_families_a_spec_accepts() -> None:
    from typing import get_args

    from toolkit.plan.architectures import ARCHITECTURES, TRACED
    from toolkit.plan.specs import Architecture

    # and `traced`: a model with no entry, read off its modules (toolkit/plan/traced.py)
    assert set(ARCHITECTURES) | {"traced"} == set(get_args(Architecture))
    assert set(TRACED.defaults) <= set(ModelSpec.model_fields)
    for name, facts in ARCHITECTURES.items():
        assert facts.name == name
        assert set(facts.defaults) <= set(ModelSpec.model_fields), name
        spec = ModelSpec(
            architecture=name, n_layers=2, hidden_size=64, n_heads=4, vocab_size=128, seq_length=32
        )
        assert {k: getattr(spec, k) for k in facts.defaults} == dict(facts.defaults), name
        assert spec.family is facts


def test_the_table_agrees_with_the_hf_model_it_describes() -> None:
    """For every family in the table (no hand-kept list: a new entry is covered the day it lands), the HF
    model built from the table's own config has exactly the parameters dstk counts, tensor by tensor in
    `parameters()` order (what ZeRO-1/2 partition), and the block prefix, residual outputs and LoRA targets
    name real modules (a typo would otherwise surface only in a growth or LoRA run)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for name, facts in ARCHITECTURES.items():
        moe = dict(num_experts=4, moe_top_k=2) if facts.native_moe else {}
        spec = ModelSpec(
            architecture=name, n_layers=2, hidden_size=32, n_heads=4, vocab_size=64, seq_length=16, **moe
        )
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**to_hf_config(spec)))
        assert type(model).__name__.startswith(facts.hf_prefix), (name, type(model).__name__)
        numels = tuple(p.numel() for p in model.parameters())
        assert sum(numels) == count_params(spec).total, name
        assert numels == tensor_numels(spec), name
        names = [n for n, _ in model.named_parameters()]
        block = [
            n[len(spec.family.block_prefix) + 2 :] for n in names if n.startswith(spec.family.block_prefix)
        ]
        assert block, name
        # growth (the residual outputs' one reader) refuses MoE models, whose MLP output is a fused expert tensor
        for prefix in spec.family.residual_outputs[: 1 if facts.native_moe else 2]:
            assert any(b.startswith(prefix) for b in block), (name, prefix)
        for target in spec.family.lora_targets:
            assert any(f".{target}." in f".{b}" for b in block), (name, target)


def test_the_docs_list_the_tables_families_and_activations() -> None:
    """docs/descriptions.md's `architecture` and `activation` rows name exactly the table's keys, and the
    README's run line every family (by its HF class prefix's spelling), so a new family cannot land undocumented."""
    import re

    from tests.cli import REPO
    from toolkit.plan.architectures import ACTIVATIONS

    docs = (REPO / "docs" / "descriptions.md").read_text()
    readme = (REPO / "README.md").read_text()
    rows = {}
    for line in docs.replace("\\|", "/").splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip() in ("`architecture`", "`activation`"):
            rows[cells[1].strip("` ")] = set(re.findall(r"`([a-z0-9_]+)`", cells[2]))
    assert rows["architecture"] == set(ARCHITECTURES)
    assert set(ACTIVATIONS) <= rows["activation"]
    run_line = readme.split("builds the HF model (", 1)[1].split(")", 1)[0].lower().replace("-", "")
    for facts in ARCHITECTURES.values():
        stem = re.sub(r"moe$", "", facts.hf_prefix.lower())
        assert stem.rstrip("0123456789") in run_line, (facts.name, run_line)
