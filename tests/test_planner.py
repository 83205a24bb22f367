"""The planner and config generation: named rules, fit margins, nothing-fits advice, agreement with estimate."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.cli import dstk
from toolkit.errors import UserError
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model, model_from_params
from toolkit.plan.planner import plan
from toolkit.plan.query import DEFAULT_MARGIN, PlanQuery
from toolkit.plan.rules import RULES, resolve_layout
from toolkit.run.trace import trace_config

BOTH = ("layout", "deepspeed", "runs", "core")

# One violating layout per rule: (rule name, model, cluster, overrides, request fields, message pattern)
RULE_CASES = [
    (
        "expert_parallel_needs_zero_at_fp32",
        "mixtral-8x7b",
        "dgx-a100-80g",
        {},
        dict(ep=2, zero_stage=0, precision="fp32"),
        r"--ep: expert parallelism at ZeRO stage 0 in fp32 clips gradients by a wrong norm",
    ),
    (
        "traced_model_runs_as_hf_builds_it",
        "tests/models/tiny-olmoe",
        "cpu",
        {},
        dict(ep=2),
        r"--ep: olmoe \(traced\) has no entry in dstk's family table",
    ),
    (
        "virtual_stages_need_pp",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(virtual_stages=2),
        r"--virtual-stages: 2 chunks per rank need --pp > 1",
    ),
    (
        "megatron_core_runtime_only",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(comm_overlap=True),
        r"--comm-overlap \(--overlap-param-gather, --tp-comm-overlap\): Megatron-Core's; .*--target megatron-core",
    ),
    (
        "pipeline_layout_fits",
        "qwen3-235b-a22b",
        "dgx-h100",
        {"nodes": 32},
        dict(pp=8, virtual_stages=4, pipeline_layout="Et*2|(t*3|)*30tL", ep=8, etp=1),
        r"--pipeline-layout: 93 decoder blocks t, but the model has n_layers\(94\)",
    ),
    (
        "etp_and_dispatcher_need_moe",
        "llama-7b",
        "dgx-h100",
        {},
        dict(etp=1, moe_dispatcher="deepep"),
        r"--etp, --moe-dispatcher: these place routed experts; llama-7b has num_experts=0",
    ),
    (
        "ep_comm_overlap_needs",
        "qwen3-30b-a3b",
        "dgx-h100",
        {"nodes": 2},
        dict(ep=8, etp=1, pp=2, ep_comm_overlap=True),
        r"--ep-comm-overlap: with --pp > 1 Megatron-Core needs --virtual-stages > 1",
    ),
    (
        "megatron_core_runs_zero1_adamw",
        "llama-7b",
        "dgx-h100",
        {},
        dict(zero_stage=3),
        r"--zero-stage: Megatron-Core's distributed optimizer is ZeRO-1; stage 3 is DeepSpeed's",
    ),
    (
        "fsdp_shards_as_zero2_or_3",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(fsdp="fp32", zero_stage=1),
        r"--fsdp: PyTorch FSDP shards as ZeRO-2 \(SHARD_GRAD_OP\) or ZeRO-3 \(FULL_SHARD\), not ZeRO-1",
    ),
    (
        "pytorch_fsdp_runtime_only",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(fsdp="bf16", zero_stage=3),
        r"--fsdp: PyTorch FSDP's runtime",
    ),
    (
        "backward_prefetch_needs_fsdp",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(zero_stage=3, fsdp_backward_prefetch="post"),
        r"--fsdp-backward-prefetch: PyTorch FSDP's backward_prefetch; give --fsdp with it",
    ),
    (
        "recompute_every_needs_full",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(recompute="selective", recompute_every=2),
        r"--recompute-every: checkpoints every K-th block of --recompute full, not --recompute selective",
    ),
    (
        "recompute_modules_fit",
        "qwen3-30b-a3b",
        "dgx-h100",
        {},
        dict(recompute="selective", recompute_modules="moe_act,mla_up_proj", zero_stage=1),
        r"--recompute-modules: mla_up_proj needs multi-latent attention, which qwen3-30b-a3b does not have",
    ),
    (
        "recompute_every_runtime_only",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(recompute="full", recompute_every=2),
        r"--recompute-every: torchtitan's and fms-fsdp's block-interval checkpointing",
    ),
    (
        "op_recompute_is_torchtitan_fsdp",
        "llama-7b",
        "dgx-h100",
        {},
        dict(recompute="ops", zero_stage=3),
        r"--recompute ops: torchtitan's op-level selective checkpointing, priced with --fsdp .*fsdp=None",
    ),
    ("tp_divides_heads", "gpt2", "dgx-a100-80g", {}, dict(tp=8), r"--tp: n_heads\(12\)"),
    ("pp_le_layers", "tiny-gpt2", "dgx-a100-80g", {}, dict(pp=8), r"--pp: pp\(8\) exceeds n_layers\(4\)"),
    (
        "pipeline_needs_zero_le_1",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(pp=2, zero_stage=2),
        r"ZeRO stage 0 or 1, not 2",
    ),
    (
        "param_offload_needs_zero3",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(zero_stage=2, offload_param="cpu"),
        r"needs ZeRO stage 3",
    ),
    (
        "optimizer_offload_needs_zero",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(offload_optimizer="cpu"),
        r"needs ZeRO stage 1, 2 or 3",
    ),
    (
        "nvme_optimizer_needs_zero3",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(zero_stage=2, offload_optimizer="nvme"),
        r"nvme needs ZeRO stage 3",
    ),
    (
        "nvme_needs_local_nvme",
        "gpt2",
        "dgx-a100-80g",
        {"nvme_gib": 0},
        dict(zero_stage=3, offload_param="nvme"),
        r"nvme_gib=0",
    ),
    (
        "offload_activations_needs_full_recompute",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(offload_activations=True, recompute="selective"),
        r"needs --recompute full",
    ),
    ("precision_supported", "gpt2", "cpu", {}, dict(precision="fp16"), r"fp16 is not supported"),
    (
        "onebit_needs_zero0",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(optimizer="onebit-adam", zero_stage=1),
        r"needs ZeRO stage 0",
    ),
    ("ep_needs_moe", "gpt2", "dgx-a100-80g", {}, dict(ep=2), r"needs an MoE model"),
    (
        "ep_divides_experts_and_dp",
        "mixtral-8x7b",
        "dgx-a100-80g",
        {},
        dict(ep=3),
        r"num_experts\(8\) must be divisible by ep\(3\)",
    ),
    ("sp_divides_heads_and_seq", "gpt2", "dgx-a100-80g", {}, dict(sp=8), r"must be divisible by sp\(8\)"),
    ("sp_supports_architecture", "bloom-176b", "dgx-a100-80g", {}, dict(sp=2), r"not bloom \(no SDPA"),
    ("sp_supports_architecture", "gpt2", "dgx-a100-80g", {}, dict(sp=2), r"runs llama, .* not gpt2"),
    ("sp_is_dense_data_parallel", "llama-7b", "dgx-a100-80g", {}, dict(sp=2, tp=2), r"got tp=2"),
    (
        "sp_divides_accumulation",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(sp=2, global_batch_size=4),
        r"gradient_accumulation_steps\(1\) must be a multiple of sp\(2\).*--global-batch 8",
    ),
    (
        "zeropp_needs_zero3",
        "gpt2",
        "dgx-a100-80g",
        {"nodes": 2},
        dict(zeropp=True, zero_stage=2),
        r"ZeRO\+\+ works on ZeRO stage 3",
    ),
    ("zeropp_needs_cuda", "gpt2", "cpu", {}, dict(zeropp=True, zero_stage=3), r"need CUDA"),
    ("autotp_supports_architecture", "gpt2", "dgx-a100-80g", {}, dict(tp=2), r"AutoTP cannot shard gpt2"),
    ("pipeline_supports_architecture", "bloom-176b", "dgx-a100-80g", {}, dict(pp=2), r"not bloom"),
    ("hf_pipeline_is_data_parallel_only", "llama-7b", "dgx-a100-80g", {}, dict(pp=2, tp=2), r"tp=sp=ep=1"),
    ("native_moe_needs_zero_le_2", "gpt2", "dgx-a100-80g", {}, dict(zero_stage=3), r"DeepSpeed MoE layers"),
    (
        "native_moe_needs_zero_le_2",
        "mixtral-8x7b",
        "dgx-a100-80g",
        {"nodes": 2},
        dict(zero_stage=3, ep=8),
        r"mixtral with --ep 8\) need ZeRO stage 1 or 2",
    ),
    (
        "tp_sequence_parallel_needs_tp",
        "gpt2",
        "dgx-a100-80g",
        {},
        dict(tp_sequence_parallel=True),
        r"needs --tp > 1",
    ),
    (
        "tp_sequence_parallel_needs_megatron",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(tp=2, tp_sequence_parallel=True),
        r"use --target megatron",
    ),
    (
        "hf_attention_is_the_runtime",
        "bloom-176b",
        "dgx-a100-80g",
        {},
        dict(
            flash_attention=True, fused_kernels=True
        ),  # fused: the megatron-core scope's last rule stays quiet
        r"^--flash-attention: HF bloom models .* run eager attention .*--target megatron$",
    ),
    ("lora_targets_exist", "gpt2", "dgx-a100-80g", {}, dict(lora="r=8,targets=q_proj"), r"valid: c_attn"),
    ("lora_is_data_parallel", "llama-7b", "dgx-a100-80g", {}, dict(lora="r=8", tp=2), r"data parallelism"),
    (
        "mxfp8_nvfp4_need_their_tensor_cores",
        "llama-7b",
        "dgx-h100",
        {},
        dict(precision="mxfp8"),
        r"^--precision mxfp8: MXFP8 GEMMs need MXFP8 tensor cores, and cluster dgx-h100 has no MXFP8 tensor "
        r"cores; GPUs with MXFP8: b200, b300, gb200, gb300, mi355x, mi350x",
    ),
    (
        "mxfp8_nvfp4_are_megatron_core_only",
        "llama-7b",
        "dgx-b200",
        {},
        dict(precision="nvfp4"),
        r"^--precision nvfp4: Transformer Engine's NVFP4 recipe, which neither dstk train",
    ),
    (
        "fp8_needs_hopper_or_ada",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(precision="fp8"),
        r"^--precision: fp8 needs FP8 tensor cores .* dgx-a100-80g has no FP8 tensor cores; GPUs with FP8: "
        r"h100-nvl, h100-pcie-80gb, h100-sxm5-80gb, h100-sxm5-96gb-500w, h200-sxm-141gb, l40s, l4",
    ),
    (
        "fp8_converts_hf_linear_layers",
        "gpt2",
        "dgx-h100",
        {},
        dict(precision="fp8"),
        r"Conv1D, not nn.Linear",
    ),
    (
        "early_stop_needs_full_recompute",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(recompute="selective", recompute_early_stop=True),
        r"^--recompute-early-stop: says where --recompute full's checkpoint stops .*, not --recompute selective;",
    ),
    (
        "early_stop_is_torch_checkpoint",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(recompute="full", offload_activations=True, zero_stage=3, recompute_early_stop=True),
        r"with --offload-activations dstk train checkpoints through DeepSpeed's reentrant checkpoint",
    ),
    (
        "megatron_recomputes_whole_layers",
        "llama-7b",
        "dgx-a100-80g",
        {},
        dict(recompute="full", recompute_early_stop=True),
        r"Megatron-DeepSpeed's checkpoint is reentrant",
    ),
    (
        "fp8_fits_transformer_engine_layer",
        "llama-7b",
        "dgx-h100",
        {},
        dict(precision="fp8", zero_stage=1),
        r"Transformer Engine's TransformerLayer\) cannot run llama-7b as planned: RMSNorm or a gated MLP",
    ),
    (
        "fp8_scaling_needs_transformer_engine",
        "llama-7b",
        "dgx-h100",
        {},
        dict(precision="fp8", fp8_scaling="delayed", zero_stage=1),
        r"--fp8-scaling: Transformer Engine's scaling in Megatron's fused blocks",
    ),
    (
        "megatron_core_kernels_are_fused",
        "llama-7b",
        "dgx-h100",
        {},
        dict(fused_kernels=False, zero_stage=1),
        r"^--no-fused-kernels: Megatron-Core runs Transformer Engine's fused norms",
    ),
]


def test_every_rule_has_a_case() -> None:
    assert {r.name for r in RULES} == {c[0] for c in RULE_CASES}


@pytest.mark.parametrize(
    ("rule", "model", "cluster", "over", "fields", "match"), RULE_CASES, ids=[c[0] for c in RULE_CASES]
)
def test_named_rule_rejects_with_message(rule, model, cluster, over, fields, match) -> None:
    m = load_model(model, tracer=lambda config, source: trace_config(config))
    if rule == "native_moe_needs_zero_le_2":
        m = m.model_copy(update={"num_experts": 4})
    c = load_cluster(cluster, over)
    with pytest.raises(UserError, match=match) as info:
        resolve_layout(m, c, LayoutRequest(**fields), (*BOTH, "megatron", "megatron-core"))
    assert "\n" not in str(info.value)


def test_megatron_target_lifts_runtime_rules() -> None:
    m, c = load_model("gpt3-175b"), load_cluster("dgx-a100-80g", {"nodes": 128})
    layout = resolve_layout(
        m, c, LayoutRequest(tp=8, pp=8, zero_stage=1, global_batch_size=1536), ("layout",)
    )
    assert layout.dp == 16


def test_plan_fits_within_margin_and_matches_estimate() -> None:
    r = dstk(
        "plan",
        "--model",
        "llama-13b",
        "--cluster",
        "dgx-a100-80g",
        "--nodes",
        "2",
        "--global-batch",
        "256",
        "--json",
    )
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert set(data) >= {"layout", "estimate", "ds_config", "explanation", "alternatives"}
    assert data["estimate"]["memory_per_gpu_bytes"]["total"] <= (1 - DEFAULT_MARGIN) * 79.2 * 2**30
    assert all(a["rejected_because"] for a in data["alternatives"])
    again = dstk(
        "estimate",
        "--model",
        "llama-13b",
        "--cluster",
        "dgx-a100-80g",
        "--nodes",
        "2",
        *data["estimate_flags"],
        "--json",
    )
    assert json.loads(again.out) == data["estimate"]
    cfg = data["ds_config"]
    lay = data["layout"]
    assert cfg["train_batch_size"] == 256 * lay["tp"]
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * lay["dp"] == 256


def test_offload_only_when_nothing_else_fits() -> None:
    model = load_model("llama-13b")
    one = plan(model, load_cluster("dgx-a100-80g", {"gpus_per_node": 1}), PlanQuery(global_batch_size=8))
    eight = plan(model, load_cluster("dgx-a100-80g"), PlanQuery(global_batch_size=64))
    assert one is not None and eight is not None
    assert one.best.layout.offload_optimizer != "none"
    assert eight.best.layout.offload_optimizer == "none" and eight.best.layout.offload_param == "none"


def test_nothing_fits_names_the_smallest_cluster() -> None:
    r = dstk(
        "plan",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-40g",
        "--global-batch",
        "512",
        "--offload-optimizer",
        "none",
        "--offload-param",
        "none",
    )
    assert r.code == 2 and r.err.count("\n") == 1
    nodes = int(re.search(r"--nodes (\d+)", r.err).group(1))
    model = load_model("gpt3-175b")
    query = PlanQuery(offload_optimizer="none", offload_param="none", global_batch_size=512)
    assert plan(model, load_cluster("dgx-a100-40g", {"nodes": nodes}), query) is not None
    assert plan(model, load_cluster("dgx-a100-40g", {"nodes": nodes - 1}), query) is None
    assert "drop the --offload-* constraints" in r.err or "offload" in r.err


def test_plan_explains_the_choice() -> None:
    p = plan(load_model("llama-7b"), load_cluster("dgx-a100-80g"), PlanQuery(global_batch_size=256))
    assert p is not None
    text = " ".join(p.explanation)
    assert "tokens/s" in text and "GiB" in text and "Step time" in text
    assert any("instead" in line for line in p.explanation)


def test_config_refuses_layout_its_runtime_cannot_run() -> None:
    r = dstk("config", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--tp", "2", "-o", "-")
    assert r.code == 2 and "AutoTP cannot shard gpt2" in r.err


def test_validate_collects_every_problem(tmp_path) -> None:
    bad = {
        "train_batch_size": 30,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, "stage3_foo": 1},
        "pipeline": {"stages": 2},
        "elasticity": {"enabled": True},
        "gradient_clip": 1.0,
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}},
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    r = dstk("validate", str(path), "--world-size", "8")
    assert r.code == 2
    for needle in (
        "elasticity",
        "gradient_clip: unknown top-level key",
        "offload_param: needs stage 3",
        "pipeline: 2 stages need",
        "train_batch_size: 30 != ",
        "stage3_foo",
    ):
        assert needle in r.out, needle
    assert r.err.count("\n") == 1


def test_validate_accepts_generated_config_and_bad_file_errors(tmp_path) -> None:
    out = tmp_path / "c.json"
    assert (
        dstk("config", "--model", "tiny-gpt2", "--cluster", "cpu", "--zero-stage", "3", "-o", str(out)).code
        == 0
    )
    assert dstk("validate", str(out), "--world-size", "2").code == 0
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    r = dstk("validate", str(broken), "--world-size", "2")
    assert r.code == 2 and "malformed config" in r.err
    r = dstk("validate", str(out), "--world-size", "0")
    assert r.code == 2 and "--world-size" in r.err


def test_a_plan_query_is_typed_and_pins_only_what_was_set() -> None:
    from pydantic import ValidationError

    from toolkit.plan.layout import LayoutRequest

    with pytest.raises(ValidationError, match="zero_stag"):
        PlanQuery(zero_stag=3)
    with pytest.raises(ValidationError, match="zero_stage"):
        PlanQuery(zero_stage=4)
    request = LayoutRequest(zero_stage=2, global_batch_size=64, gradient_accumulation_steps=4)
    query = PlanQuery.pinning(request)
    assert query.pins() == {"zero_stage": 2} and query.global_batch_size == 64
    assert query.options("zero_stage", [0, 1, 2, 3]) == [2] and query.options("tp", [1, 2]) == [1, 2]
    best = plan(load_model("llama-7b"), load_cluster("dgx-a100-80g"), query)
    assert best is not None and best.best.layout.zero_stage == 2 and best.best.layout.global_batch_size == 64


@pytest.mark.parametrize(
    "job",
    [
        ["--model", "llama-7b", "--seq-length", "8192", "--cluster", "dgx-a100-80g", "--gpus-per-node", "4"],
        ["--params", "175e9", "--cluster", "dgx-a100-80g", "--nodes", "64", "--inter-node-gb-per-s", "12.5"],
        ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2", "--gpu-memory-gib", "60"],
    ],
)
def test_the_printed_reproduce_command_reproduces_the_plan(job: list[str]) -> None:
    plan_json = json.loads(dstk("plan", *job, "--json").out)
    command = plan_json["estimate_command"]
    assert command[:2] == ["dstk", "estimate"]
    again = dstk(*command[1:], "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out) == plan_json["estimate"]
    text = dstk("plan", *job).out
    assert f"Reproduce: {shlex.join(command)}" in text


def _largest_fitting(cluster, query, sizes) -> float:
    return max((p for p in sizes if plan(model_from_params(p), cluster, query) is not None), default=0.0)


def test_zero_infinity_single_dgx2_limits() -> None:
    """ZeRO-Infinity (Rajbhandari et al. 2021, Fig. 1 and the SC'21 slides): one DGX-2 (16 V100-32GB, 1.5 TB
    DRAM, 28 TB NVMe) trains about 20B parameters on its GPUs alone, 70B with CPU offload, 1T with NVMe. The
    planner reproduces the first two. With NVMe it stops near 0.5T, because DeepSpeed 0.19.8's ZeRO-3 keeps every
    gradient partition in pinned host memory once the optimizer is offloaded (stage3.py:791-795), 2 bytes per
    parameter: 2 TB for 1T against 1.5 TB; the refusal says so, and names the smallest cluster (2 nodes)."""
    dgx2 = load_cluster("v100-32g")
    sizes = [10e9, 20e9, 30e9, 50e9, 70e9, 100e9, 200e9, 500e9, 700e9, 1e12]
    gpu_only = PlanQuery(offload_optimizer="none", offload_param="none", offload_activations=False)
    assert _largest_fitting(dgx2, gpu_only, sizes) == 20e9
    assert _largest_fitting(dgx2.model_copy(update={"nvme_gib": 0}), PlanQuery(), sizes) == 70e9
    assert _largest_fitting(dgx2, PlanQuery(), sizes) == 500e9
    best = plan(model_from_params(500e9), dgx2, PlanQuery())
    assert best is not None
    lay = best.best.layout
    assert (lay.offload_optimizer, lay.offload_param, lay.offload_activations) == ("nvme", "nvme", True)
    assert "offload_activations = False instead" in " ".join(best.explanation)
    r = dstk("plan", "--params", "1e12", "--cluster", "v100-32g", "--nodes", "1")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "--nodes 2" in r.err and "does not fit in host memory" in r.err
    assert "pinned gradient partitions" in r.err
    two = plan(model_from_params(1e12), load_cluster("v100-32g", {"nodes": 2}), PlanQuery())
    assert two is not None
    assert (two.best.layout.offload_optimizer, two.best.layout.offload_param) == ("nvme", "nvme")


def test_ulysses_needs_kv_heads_and_sp_to_divide_one_another() -> None:
    """DeepSpeed's Ulysses splits kv heads over the group, or replicates them to it when there are fewer: 8 kv
    heads go with sp 16 (replicated) and sp 4; 6 kv heads with sp 4 neither split nor replicate."""
    from toolkit.plan.rules import broken_rules
    from toolkit.plan.specs import ModelSpec

    cluster = load_cluster("dgx-a100-80g", {"nodes": 2})

    def broken(kv: int, heads: int, sp: int) -> list[str]:
        model = ModelSpec(
            architecture="llama", n_layers=2, hidden_size=128 * heads, n_heads=heads, n_kv_heads=kv,
            vocab_size=1000, seq_length=32768,
        )  # fmt: skip
        request = LayoutRequest(sp=sp, global_batch_size=16 // sp * sp)
        return [msg for _, msg in broken_rules(model, cluster, request, 16 // sp, ("layout",))]

    assert not broken(8, 32, 16) and not broken(8, 32, 4)
    assert any("--sp: kv heads per TP rank (6) and sp(4)" in m for m in broken(6, 24, 4))


@pytest.mark.parametrize(
    "model,cluster,nodes,batch",
    [
        ("30e9", "dgx-a100-80g", 1, 504),  # 63 per rank: no power-of-two micro-batch but 1
        ("llama-7b", "dgx-a100-80g", 2, 384),  # 24 per rank: 3, 6, 12 and 24 are not powers of two
        ("llama-13b", "dgx-h100", 4, 480),
        ("gpt2-xl", "dgx-a100-40g", 1, 96),
    ],
)
def test_the_plan_is_never_slower_than_a_layout_given_by_flags(model, cluster, nodes, batch) -> None:
    """Every layout a user could pin by flags in the planner's space (ZeRO stage × TP × micro-batch ×
    recomputation, no offload) that fits the planner's margin is predicted no faster than the plan, beyond the
    planner's near-tie rule (within NEAR_TIE of the fastest, the simplest layout wins)."""
    from toolkit.plan.choice import NEAR_TIE
    from toolkit.plan.cost.estimate import estimate, estimate_memory
    from toolkit.plan.planner import _divisors

    spec = model_from_params(float(model)) if model[0].isdigit() else load_model(model)
    c = load_cluster(cluster, {"nodes": nodes})
    best = plan(spec, c, PlanQuery(global_batch_size=batch))
    assert best is not None
    usable = (1 - DEFAULT_MARGIN) * c.gpu_memory_gib * 2**30
    tried = 0
    for zero in (0, 1, 2, 3):
        for tp in (1, 2, 4, 8):
            if spec.n_heads % tp or (c.world_size // tp) == 0 or batch % (c.world_size // tp):
                continue
            for micro in _divisors(batch // (c.world_size // tp)):
                for recompute in ("none", "selective", "full"):
                    request = LayoutRequest(
                        zero_stage=zero,
                        tp=tp,
                        micro_batch_size=micro,
                        global_batch_size=batch,
                        recompute=recompute,
                    )
                    try:
                        layout = resolve_layout(spec, c, request, scopes=BOTH)
                    except UserError:
                        continue
                    if estimate_memory(spec, c, layout).total > usable:
                        continue
                    tried += 1
                    theirs = estimate(spec, c, layout).tokens_per_s
                    assert best.best.tokens_per_s >= (1 - NEAR_TIE) * theirs, (layout.flags(), theirs)
    assert tried >= 2  # the 30B on 8 A100s fits only at ZeRO-3 with recomputation
