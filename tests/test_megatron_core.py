"""`dstk config --megatron-core`: every emitted argument list parses with a parser built from Megatron-LM's own
flags (tests/data/megatron_lm_flags.txt, read from its parser at d98e8a64) and says what the model and the
layout asked for — checked against the model description and Megatron-LM's own rules as NOTES of the flags
file give them (world % TP·PP·CP, the expert grid ETP·EP·PP, the layout grammar, the MoE layer list), not
against dstk's own writer. The pipeline a Megatron run builds from the arguments is compared block by block
with the one dstk priced."""

from __future__ import annotations

import random
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import dstk
from tests.megatron_flags import MEGATRON_LM, ParseError, parse_verified, verified_parser
from toolkit.integrations.megatron_core import moe_layer_freq
from toolkit.integrations.megatron_core_run import grouped
from toolkit.plan import pipeline_layout
from toolkit.plan.load import load_cluster, load_model

PRESETS = Path(__file__).resolve().parents[1] / "toolkit" / "plan" / "presets" / "models"
CUDA_NOTE = "CUDA_DEVICE_MAX_CONNECTIONS=1"

CASES: dict[str, list[str]] = {
    "deepseek-v3-mtp-layout-folded-ep64": [
        "--model", "deepseek-v3-671b+mtp_layers=1", "--cluster", "dgx-h100", "--nodes", "128", "--tp", "2", "--pp", "16",
        "--virtual-stages", "2", "--pipeline-layout", "Et|(tt|)*30mL", "--ep", "64", "--etp", "1",
        "--zero-stage", "1", "--recompute", "selective", "--recompute-modules", "moe_act,mla_up_proj,layernorm",
        "--global-batch", "4096",
    ],
    "qwen3-235b-uneven-interleaved-fp8": [
        "--model", "qwen3-235b-a22b", "--cluster", "dgx-h100", "--nodes", "32", "--tp", "2", "--pp", "8",
        "--virtual-stages", "4", "--ep", "32", "--etp", "1", "--precision", "fp8", "--zero-stage", "1",
        "--comm-overlap", "--global-batch", "1024",
    ],
    "mixtral-tp2-sp-ep8-allgather": [
        "--model", "mixtral-8x7b", "--cluster", "h200", "--nodes", "4", "--tp", "2", "--ep", "8", "--etp", "1",
        "--moe-dispatcher", "allgather", "--zero-stage", "1", "--global-batch", "256", "--recompute", "full",
    ],
    "llama3-8b-dense-full-recompute-context-parallel-cuda-graphs": [
        "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2", "--tp", "2", "--sp", "2",
        "--global-batch", "128", "--recompute", "full", "--cuda-graphs",
    ],
    "gpt3-13b-learned-positions-biases-unfused": [
        "--model", "gpt3-13b", "--cluster", "dgx-a100-80g", "--nodes", "8", "--tp", "4", "--pp", "2",
        "--zero-stage", "1", "--global-batch", "512", "--recompute", "selective", "--no-flash-attention",
    ],
    "qwen2-7b-qkv-bias": ["--model", "qwen2-7b", "--cluster", "dgx-h100", "--tp", "2", "--global-batch", "64"],
    "kimi-k2-uneven-deepep": [
        "--model", "kimi-k2-1t", "--cluster", "dgx-h100", "--nodes", "128", "--pp", "16", "--ep", "64",
        "--etp", "1", "--moe-dispatcher", "deepep", "--zero-stage", "1", "--recompute", "full",
        "--global-batch", "4096",
    ],
    "llama-70b-mxfp8-b200-interleaved-overlap": [
        "--model", "llama-70b", "--cluster", "dgx-b200", "--nodes", "8", "--tp", "4", "--pp", "2",
        "--virtual-stages", "5", "--precision", "mxfp8", "--zero-stage", "1", "--comm-overlap",
        "--global-batch", "512",
    ],
    "qwen3-30b-nvfp4-b200-hybridep": [
        "--model", "qwen3-30b-a3b", "--cluster", "dgx-b200", "--ep", "8", "--etp", "1", "--precision", "nvfp4",
        "--moe-dispatcher", "hybridep", "--zero-stage", "1", "--global-batch", "256",
    ],
    "qwen3-30b-fp8-current-scaling-hybridep": [
        "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "2", "--ep", "16", "--etp", "1",
        "--precision", "fp8", "--fp8-scaling", "current", "--moe-dispatcher", "hybridep", "--zero-stage", "1",
        "--global-batch", "1024",
    ],
    "qwen3-30b-ep-overlap-balanced": [
        "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--nodes", "4", "--pp", "2", "--virtual-stages", "2",
        "--ep", "8", "--etp", "1", "--ep-comm-overlap", "--moe-routing", "balanced", "--zero-stage", "1",
        "--global-batch", "256",
    ],
    "qwen1.5-moe-shared-gate-no-renormalisation": [
        "--model", "qwen1.5-moe-a2.7b", "--cluster", "dgx-h100", "--ep", "4", "--zero-stage", "1",
        "--global-batch", "64",
    ],
    "mixtral-top1-every-second-block": [
        "--model", "mixtral-8x7b+moe_top_k=1+moe_layer_interval=2", "--cluster", "dgx-h100", "--nodes", "2",
        "--pp", "2", "--ep", "8", "--global-batch", "64", "--zero-stage", "1",
    ],
    "gpt2-tanh-gelu-tied": ["--model", "gpt2", "--cluster", "dgx-h100", "--global-batch", "64", "--precision", "fp16"],
}  # fmt: skip


def _variant(tmp_path: Path, spec: str) -> str:
    """`preset+field=value+...`: a copy of the preset with those fields changed (HF's DeepSeek-V3 has no MTP
    layer, the report's model has one)."""
    preset, *changes = spec.split("+")
    data = yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())
    for change in changes:
        key, value = change.split("=")
        data[key] = yaml.safe_load(value)
    data["name"] = spec.replace("+", "-").replace("=", "")
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def emit(tmp_path: Path, flags: list[str]) -> tuple[list[str], list[str], str]:
    """(flags with model files made, the argv dstk printed, its stderr); the file -o names holds the same."""
    flags = [_variant(tmp_path, f) if "+" in f else f for f in flags]
    out = tmp_path / "megatron_core.args"
    res = dstk("config", *flags, "--megatron-core", "-o", str(out))
    assert res.code == 0, res.err
    assert out.read_text() == res.out and res.out.count("\n") == 1
    return flags, shlex.split(res.out), res.err


def given(flags: list[str], flag: str, default: str | None = None) -> str | None:
    return flags[flags.index(flag) + 1] if flag in flags else default


def megatron_moe_layers(text: str, n_layers: int) -> list[int]:
    """What Megatron-LM makes of --moe-layer-freq (arguments.py moe_freq_type/_eval_pattern; an int N puts an
    MoE layer where i % N == 0)."""
    if "[" not in text:
        return [int(i % int(text) == 0) for i in range(n_layers)]
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", text), text
    return list(eval(text))


def megatron_vpp(ns: Any, n_layers: int) -> int:
    """The virtual stages per rank Megatron derives (arguments.py:927-977), checking its divisibility rules."""
    pp = ns.pipeline_model_parallel_size
    if ns.pipeline_model_parallel_layout:
        return len(pipeline_layout.parse(ns.pipeline_model_parallel_layout)) // pp
    assert n_layers % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
    per = ns.num_layers_per_virtual_pipeline_stage
    if per is None:
        return 1
    assert (n_layers // pp) % per == 0
    return n_layers // pp // per


@pytest.mark.parametrize("case", list(CASES))
def test_arguments_are_megatron_lm_flags_with_the_plans_values(tmp_path, case) -> None:
    flags, argv, err = emit(tmp_path, CASES[case])
    ns = parse_verified(argv, MEGATRON_LM)
    model = load_model(given(flags, "--model"))
    cluster = load_cluster(given(flags, "--cluster"), {"nodes": int(given(flags, "--nodes", "1"))})
    world = cluster.world_size
    tp, pp, sp = (int(given(flags, f, "1")) for f in ("--tp", "--pp", "--sp"))

    # parallel sizes: Megatron's DP = world / (TP·PP·CP); the global batch splits over it
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size) == (tp, pp)
    assert (ns.context_parallel_size or 1) == sp and ns.cp_comm_type == (["a2a"] if sp > 1 else None)
    assert world % (tp * pp * sp) == 0
    dp = world // (tp * pp * sp)
    assert ns.micro_batch_size == int(given(flags, "--micro-batch", "1"))
    assert (
        ns.global_batch_size == int(given(flags, "--global-batch"))
        and ns.global_batch_size % (ns.micro_batch_size * dp) == 0
    )
    assert ns.sequence_parallel is (tp > 1)  # dstk's Megatron default: TP with its sequence parallelism
    assert ns.use_distributed_optimizer is (given(flags, "--zero-stage", "0") == "1")
    overlap = "--comm-overlap" in flags
    assert ns.overlap_grad_reduce is overlap and ns.overlap_param_gather is (
        overlap and ns.use_distributed_optimizer
    )
    assert ns.tp_comm_overlap is (overlap and tp > 1)

    # the model, every number explicit
    assert (ns.num_layers, ns.hidden_size, ns.num_attention_heads) == (
        model.n_layers,
        model.hidden_size,
        model.n_heads,
    )
    assert (ns.ffn_hidden_size, ns.seq_length) == (model.ffn_hidden_size, model.seq_length)
    assert ns.max_position_embeddings == model.max_position_embeddings >= model.seq_length
    assert ns.group_query_attention is (model.n_kv_heads < model.n_heads)
    assert (ns.num_query_groups or model.n_heads) == model.n_kv_heads
    assert (
        ns.position_embedding_type
        == {"rope": "rope", "learned": "learned_absolute"}[model.position_embedding]
    )
    assert ns.normalization == {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[model.norm]
    assert ns.swiglu is bool(model.gated_mlp)
    add_bias = ns.disable_bias_linear  # store_false into Megatron's add_bias_linear
    assert (add_bias, add_bias or ns.add_qkv_bias) == (model.mlp_bias, model.attention_bias)
    assert ns.untie_embeddings_and_output_weights is not model.tied_embeddings
    assert ns.attention_dropout == ns.hidden_dropout == (0.1 if model.dropout else 0.0)
    latent = model.kv_lora_rank is not None
    assert ns.multi_latent_attention is latent and ns.qk_layernorm is (model.qk_norm or latent)
    if latent:  # q/k heads are nope + rope wide
        assert (ns.q_lora_rank, ns.kv_lora_rank) == (model.q_lora_rank, model.kv_lora_rank)
        assert ns.qk_head_dim + ns.qk_pos_emb_head_dim == model.head_dim and ns.v_head_dim == model.v_head_dim
        assert ns.rotary_scaling_factor == 1  # MLA's YaRN at factor 1 is plain RoPE
        assert ns.kv_channels == model.v_head_dim  # unused by MLA; as Megatron's DeepSeek-V3 recipes pass it
    else:
        assert ns.kv_channels == model.head_dim
    assert (ns.mtp_num_layers or 0) == model.mtp_layers

    # the pipeline Megatron builds is the one dstk priced, block for block
    v = int(given(flags, "--virtual-stages", "1"))
    assert megatron_vpp(ns, model.n_layers) == v
    if ns.pipeline_model_parallel_layout:
        text = ns.pipeline_model_parallel_layout
        assert pipeline_layout.problem(text, model.n_layers, model.mtp_layers, pp, v) is None
        priced = pipeline_layout.rank_stages(
            model.n_layers, pp, v, given(flags, "--pipeline-layout"), model.mtp_layers
        )
        assert pipeline_layout.rank_stages(model.n_layers, pp, v, text, model.mtp_layers) == priced

    # experts
    assert ns.num_experts == (model.num_experts or None)
    if model.is_moe:
        pattern = megatron_moe_layers(ns.moe_layer_freq, model.n_layers)
        assert pattern == [int(model.moe_layer(j)) for j in range(model.n_layers)]
        assert (ns.moe_router_topk, ns.moe_ffn_hidden_size) == (model.moe_top_k, model.moe_ffn_hidden_size)
        assert (ns.moe_shared_expert_intermediate_size or 0) == model.shared_expert_ffn_hidden_size
        assert ns.moe_shared_expert_gate is model.family.shared_expert_gate
        ep, etp = int(given(flags, "--ep", "1")), int(given(flags, "--etp", "1"))
        # ETP is always written: Megatron's default is TP (arguments.py:587-588), not what dstk priced
        assert "--expert-tensor-parallel-size" in argv and (
            ns.expert_model_parallel_size,
            ns.expert_tensor_parallel_size,
        ) == (ep, etp)
        assert model.num_experts % ep == 0 and world % (etp * ep * pp) == 0  # parallel_state.py:871-885
        dispatcher = given(flags, "--moe-dispatcher", "alltoall")
        flex = dispatcher in ("deepep", "hybridep")
        assert ns.moe_token_dispatcher_type == ("flex" if flex else dispatcher)
        assert ns.moe_flex_dispatcher_backend == (dispatcher if flex else None) and ns.moe_grouped_gemm
        sigmoid = model.family.router_score == "sigmoid"
        assert ns.moe_router_score_function == model.family.router_score
        assert ns.moe_router_enable_expert_bias is (sigmoid and model.family.router_expert_bias)
        # softmax then top-k without renormalising (or top-1, transformer_config.py:2662-2669)
        assert ns.moe_router_pre_softmax is (
            not sigmoid and (not model.moe_renormalize or model.moe_top_k == 1)
        )
        assert ns.moe_aux_loss_coeff[0] > 0 and len(ns.moe_aux_loss_coeff) == len(
            ns.moe_router_load_balancing_type
        )
        assert ns.moe_router_dtype == ("fp32" if model.family.router_fp32 else None)
        assert ns.moe_router_force_load_balancing is ("balanced" in flags)
        overlap_ep = "--ep-comm-overlap" in flags
        assert ns.overlap_moe_expert_parallel_comm is overlap_ep and ns.delay_wgrad_compute is overlap_ep
    else:
        assert ns.expert_model_parallel_size is None and ns.expert_tensor_parallel_size is None

    # precision, recomputation, attention
    precision = given(flags, "--precision", "bf16")
    assert ns.bf16 is (precision not in ("fp16", "fp32")) and ns.fp16 is (precision == "fp16")
    assert ns.transformer_impl == "transformer_engine"
    scaling = "tensorwise" if given(flags, "--fp8-scaling", "delayed") == "current" else "delayed"
    fp8 = {"fp8": ("hybrid", scaling), "mxfp8": ("e4m3", "mxfp8")}.get(precision, (None, None))
    assert (ns.fp8_format, ns.fp8_recipe) == fp8
    assert (ns.fp4_format, ns.fp4_recipe) == (("e2m1", "nvfp4") if precision == "nvfp4" else (None, None))
    recompute = given(flags, "--recompute", "none")
    assert ns.recompute_granularity == (None if recompute == "none" else recompute)
    if recompute == "full":
        assert (ns.recompute_method, ns.recompute_num_layers) == ("uniform", 1)
    modules = given(flags, "--recompute-modules", "core_attn").split(",")
    want = ["core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts"]  # Megatron's order
    assert ns.recompute_modules == ([m for m in want if m in modules] if recompute == "selective" else None)
    assert ns.attention_backend == ("unfused" if "--no-flash-attention" in flags else "auto")
    graphs = "--cuda-graphs" in flags  # Megatron's NaN check syncs with the host (arguments.py:1235-1237)
    assert ns.cuda_graph_impl == ("full_iteration" if graphs else None)
    assert ns.no_check_for_nan_in_loss_and_grad is not graphs  # store_false
    blackwell = cluster.gpu_nvfp4_peak_tflops is not None
    assert (CUDA_NOTE in err) is ((tp > 1 or sp > 1) and not blackwell and "--ep-comm-overlap" not in flags)


def test_the_verified_parser_knows_megatron_lms_kinds() -> None:
    parser, flags = verified_parser(MEGATRON_LM)
    ns = parser.parse_args(
        [
            "--moe-aux-loss-coeff",
            "0.01",
            "1e-4",
            "--recompute-modules",
            "core_attn",
            "moe_act",
            "--cp-comm-type",
            "a2a",
        ]
    )
    assert ns.moe_aux_loss_coeff == [0.01, 1e-4] and ns.recompute_modules == ["core_attn", "moe_act"]
    assert ns.cp_comm_type == ["a2a"] and "--virtual-pipeline-model-parallel-size" not in flags
    for bad in (["--recompute-modules", "attn"], ["--num-layer", "4"], ["--normalization", "rmsnorm"]):
        with pytest.raises(ParseError):
            parser.parse_args(bad)
    with pytest.raises(AssertionError, match=r"unverified flags: .*--virtual-pipeline-model-parallel-size"):
        parse_verified(["--virtual-pipeline-model-parallel-size", "2"], MEGATRON_LM)


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ([1] * 32, "1"),
        ([0] * 3 + [1] * 58, "[0]*3+[1]*58"),
        ([0, 1] * 16, "([0]+[1])*16"),
        ([0] + [0, 0, 1] * 4, "[0]+([0]*2+[1])*4"),
    ],
)
def test_moe_layer_freq_names_exactly_the_moe_blocks(pattern, text) -> None:
    assert moe_layer_freq(pattern) == text
    assert megatron_moe_layers(text, len(pattern)) == pattern


def test_moe_layer_freq_round_trips_any_pattern() -> None:
    rng = random.Random(45)
    for _ in range(300):
        n = rng.randint(1, 64)
        pattern = [rng.choice((0, 1)) for _ in range(n)] if rng.random() < 0.5 else None
        if pattern is None:  # dense first, then every k-th block: the shapes specs have
            first, k = rng.randint(0, n), rng.randint(1, 4)
            pattern = [int(j >= first and (j + 1) % k == 0) for j in range(n)]
        if any(pattern):
            assert megatron_moe_layers(moe_layer_freq(pattern), n) == pattern, pattern


@pytest.mark.parametrize(
    ("layers", "pp", "v", "mtp", "text"),
    [
        (94, 8, 4, 0, "Et*3|(t*3|)*29t*2|t*2L"),
        (61, 16, 1, 1, "Et*4|(t*4|)*12(t*3|)*2t*3mL"),
        (61, 16, 2, 1, "Et*2|(t*2|)*28(t|)*2tmL"),
        (5, 4, 2, 0, "Et|(t|)*4(|)*2L"),
    ],
)
def test_grouped_layout_is_dstks_even_split(layers, pp, v, mtp, text) -> None:
    """Runs of equal stages written once; Megatron's grammar unrolls them to dstk's even split."""
    assert grouped(pipeline_layout.parse(pipeline_layout.even_layout(layers, pp, v, mtp))) == text
    assert pipeline_layout.problem(text, layers, mtp, pp, v) is None
    assert pipeline_layout.rank_stages(layers, pp, v, text, mtp) == pipeline_layout.rank_stages(
        layers, pp, v, None, mtp
    )
