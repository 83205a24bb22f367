"""`--precision fp8`: where it runs, how the cost model prices it, how the planner weighs it, what the configs say
and how `dstk train` applies it (toolkit/plan/cost/fp8.py, toolkit/plan/fp8_support.py, toolkit/run/fp8.py).

The CUDA half of the run path (a real `torch._scaled_mm`) needs a GPU with compute capability >= 8.9; here
torchao's own emulation trains the converted model on the CPU, and the refusals are checked."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli import REPO, dstk
from toolkit.errors import UserError
from toolkit.plan.cost.compute import block_linears, stage_compute
from toolkit.plan.cost.estimate import estimate
from toolkit.plan.cost.fp8 import (
    EAGER_CAST_BYTES,
    LAYOUT_COPY_BYTES,
    Fp8Gemms,
    Linear,
    cast_traffic,
)
from toolkit.plan.cost.gemm import linear_s, quantization_efficiency
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.params import count_params
from toolkit.plan.presets import gpu_table
from toolkit.plan.rules import resolve_layout
from toolkit.report.render import mfu_line

TINY_LLAMA = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")
MEGATRON = ("layout", "megatron")


def _est(model, cluster, scopes=("layout",), **layout):
    return estimate(model, cluster, resolve_layout(model, cluster, LayoutRequest(**layout), scopes))


# ----------------------------------------------------------------------------------------- the hardware


def test_gpus_with_fp8_tensor_cores_are_ada_hopper_blackwell_and_instinct() -> None:
    fp8 = {k for k, e in gpu_table().items() if e["fp8_tflops"] is not None}
    assert fp8 == {
        "h100-nvl",
        "h100-pcie-80gb",
        "h100-sxm5-80gb",
        "h100-sxm5-96gb-500w",
        "h200-sxm-141gb",
        "l40s",
        "l4",
        "rtx-4090",
        "h800-sxm5-80gb",
        "b200",
        "b300",
        "gb200",
        "gb300",
        "mi300x",
        "mi325x",
        "mi355x",
        "mi350x",
    }
    for key, e in gpu_table().items():  # Hopper, Blackwell, Instinct, datacenter Ada: FP8 runs at twice BF16
        if key != "rtx-4090" and e["fp8_tflops"] is not None:
            assert e["fp8_tflops"] == pytest.approx(2 * e["bf16_tflops"], rel=0.013)  # L40S: 733 / 362.05


@pytest.mark.parametrize(
    ("preset", "gpu", "efficiency"),
    [("dgx-h100", "h100-sxm5-80gb", 0.542), ("h200", "h200-sxm-141gb", 0.561)],
)
def test_cluster_presets_take_the_fp8_peak_from_the_gpu_table(preset, gpu, efficiency) -> None:
    c = load_cluster(preset)
    assert c.gpu_fp8_peak_tflops == gpu_table()[gpu]["fp8_tflops"] == 1979
    # the bf16 efficiency scaled by the best FP8 / best bf16 GEMM share of peak (70.9 % or 73.4 % vs 80.3 %)
    assert c.fp8_matmul_efficiency() == efficiency
    assert c.supports("fp8") and c.peak_flops("fp8") == 1979e12


@pytest.mark.parametrize("cluster", ["dgx-a100-80g", "v100-32g", "cpu"])
def test_estimate_refuses_fp8_without_fp8_tensor_cores_in_one_line(cluster) -> None:
    r = dstk("estimate", "--model", "llama-7b", "--cluster", cluster, "--precision", "fp8")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert re.search(
        r"fp8 needs FP8 tensor cores .* GPUs with FP8: h100-nvl, .*h200-sxm-141gb, l40s, l4", r.err
    )


# -------------------------------------------------------------------------------------- the cost model


def test_linear_gemms_run_at_the_fp8_peak_times_its_efficiency() -> None:
    c = load_cluster("dgx-h100")
    fp8 = Fp8Gemms(c.peak_flops("fp8"), c.fp8_matmul_efficiency(), "delayed")
    m = k = n = 8192
    quantized = quantization_efficiency(m, n, 132)
    assert linear_s(Linear(m, k, n, k * n), 2, 989e12, c, fp8) == pytest.approx(
        2 * m * k * n / (1979e12 * 0.542 * quantized)
    )
    assert linear_s(Linear(m, k, n, k * n), 2, 989e12, c, None) == pytest.approx(
        2 * m * k * n / (989e12 * 0.614 * quantized)
    )


def test_lm_head_and_routers_stay_bf16() -> None:
    """The LM head, the attention core and MoE routers are not among the FP8 GEMMs (TE and torchao leave them)."""
    c = load_cluster("dgx-h100")
    model = load_model("mixtral-8x7b")
    head_only = dict(
        micro_batch=1, e=2, tp=1, sp=1, dense_layers=0, moe_layers=0, last=True, recompute="none"
    )
    fp8 = Fp8Gemms(1979e12, 0.57, "delayed")
    common = dict(sequence_parallel=False, peak=989e12, flash=True)
    bf16_head = stage_compute(model, count_params(model), c, **head_only, **common)
    fp8_head = stage_compute(model, count_params(model), c, **head_only, **common, fp8=fp8)
    assert fp8_head == bf16_head
    linears = block_linears(model, 4096, tp=1, moe=True, ep=8)
    assert [x.n for x in linears] == [4096 + 2 * 1024, 4096, 2 * 14336, 4096]  # QKV, out, experts: no router
    assert linears[2].weights == 8 / 8 * 4096 * 2 * 14336 and linears[2].m == 4096 * 2  # top-2 tokens


def test_delayed_scaling_reads_each_tensor_once_and_writes_two_fp8_copies() -> None:
    """TE on Hopper: one read of the bf16 tensor, rowwise + transposed FP8 written; weights once per step."""
    t = cast_traffic([Linear(100, 30, 50, 30 * 50)], 2, "delayed")
    assert (t.forward_bytes, t.backward_bytes, t.per_step_bytes) == (100 * 30 * 4, 100 * 50 * 4, 30 * 50 * 4)


def test_current_scaling_reads_each_tensor_twice_amax_then_cast() -> None:
    """TE's Float8CurrentScaling: "requires reading the tensor twice" (an amax pass, then the cast), so 2e + 2
    bytes per element and two kernels per cast; weights cast once per step and copies kept, as delayed."""
    x = [Linear(100, 30, 50, 30 * 50)]
    t, d = cast_traffic(x, 2, "current"), cast_traffic(x, 2, "delayed")
    assert (t.forward_bytes, t.backward_bytes) == (100 * 30 * 6, 100 * 50 * 6)
    assert (t.forward_kernels, t.backward_kernels) == (2, 2) and t.per_step_bytes == 30 * 50 * 6
    assert t.forward_bytes == 1.5 * d.forward_bytes
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", {"nodes": 2})
    est = {
        s: estimate(
            m,
            c,
            resolve_layout(
                m, c, LayoutRequest(ep=16, etp=1, precision="fp8", fp8_scaling=s, fused_kernels=True)
            ),
        )
        for s in ("delayed", "current")
    }
    assert est["current"].layout.fp8_recipe == "current"
    assert est["current"].time.compute_s > est["delayed"].time.compute_s
    assert est["current"].memory.fp8_weight_copies == est["delayed"].memory.fp8_weight_copies > 0


def test_eager_torchao_casts_move_33_bytes_per_element_six_times_per_linear() -> None:
    m, k, n = 100, 30, 50
    t = cast_traffic([Linear(m, k, n, k * n)], 2, "tensorwise")
    assert EAGER_CAST_BYTES == 2 + 2 + 2 + (2 + 4) + (4 + 4) + (4 + 4) + (4 + 1)
    assert t.forward_bytes == (m * k + k * n) * 33 and t.per_step_bytes == 0
    # backward: the output gradient cast twice, input and weight again, three FP8 layout copies
    assert t.backward_bytes == (m * k + k * n) * (33 + LAYOUT_COPY_BYTES) + m * n * (
        2 * 33 + LAYOUT_COPY_BYTES
    )
    assert (t.forward_kernels, t.backward_kernels) == (20, 43)


def test_compiled_torchao_casts_are_single_pass_every_micro_batch() -> None:
    """torchao under torch.compile (a `--fsdp --fused-kernels` run, torchtitan's): fused casts as TE's, one
    kernel each, but the weights cast with the inputs in every forward (no cached copies), nothing per step."""
    m, k, n = 100, 30, 50
    t = cast_traffic([Linear(m, k, n, k * n)], 2, "tensorwise", compiled=True)
    assert (t.forward_bytes, t.backward_bytes, t.per_step_bytes) == ((m * k + k * n) * 4, m * n * 4, 0)
    assert (t.forward_kernels, t.backward_kernels) == (2, 1)


def test_pytorch_fsdp_runs_cast_with_torchao_and_keep_no_fp8_weight_copies() -> None:
    """A PyTorch FSDP layout (torchtitan) casts with torchao, compiled or not: no Transformer Engine weight
    workspace, no FP8 copies of saved inputs, no amax all-reduce; compiled, the eager casts' fp32 temporaries
    are gone too."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", {"nodes": 2})
    base = dict(zero_stage=3, micro_batch_size=1, recompute="ops", precision="fp8", fsdp="bf16")
    compiled = _est(model, cluster, fused_kernels=True, **base)
    eager = _est(model, cluster, **base)
    gpt = load_model("gpt3-13b")  # a block Transformer Engine's layer builds, under Megatron and under FSDP
    fused = dict(micro_batch_size=1, precision="fp8", fused_kernels=True)
    te = _est(gpt, cluster, scopes=MEGATRON, zero_stage=1, **fused)
    te_fsdp = _est(gpt, cluster, zero_stage=3, fsdp="bf16", **fused)
    assert compiled.layout.fp8_recipe == eager.layout.fp8_recipe == te_fsdp.layout.fp8_recipe == "tensorwise"
    assert te.layout.fp8_recipe == "delayed" and te.memory.fp8_weight_copies > 0
    assert te_fsdp.memory.fp8_weight_copies == 0
    assert compiled.memory.fp8_weight_copies == eager.memory.fp8_weight_copies == 0
    assert compiled.memory.total < eager.memory.total  # the eager casts' temporaries
    assert compiled.time.compute_s < eager.time.compute_s


def test_transformer_engine_saves_fp8_linear_inputs_and_keeps_fp8_weight_copies() -> None:
    """A GPT block (tp = 1, fused attention): the QKV and MLP inputs and the fc2 input are saved as one byte
    instead of two, the attention output gets an FP8 copy beside its bf16 one — 2h + 4h − h = 5h bytes fewer
    per token and block — and TE keeps a rowwise and a columnwise FP8 copy of every linear weight."""
    model, c = load_model("gpt3-13b"), load_cluster("dgx-h100")
    layout = dict(
        micro_batch_size=1, global_batch_size=8, fused_kernels=True, flash_attention=True, zero_stage=1
    )
    bf16, fp8 = _est(model, c, precision="bf16", **layout), _est(model, c, precision="fp8", **layout)
    assert bf16.memory.peak_phase == fp8.memory.peak_phase == "backward"
    tokens, h, blocks = model.seq_length, model.hidden_size, model.n_layers
    assert bf16.memory.activations - fp8.memory.activations == 5 * h * tokens * blocks
    pc = count_params(model)
    assert fp8.memory.fp8_weight_copies == 2 * blocks * (pc.attention_weights + pc.mlp_weights)
    assert fp8.memory.total - bf16.memory.total == pytest.approx(
        fp8.memory.fp8_weight_copies - 5 * h * tokens * blocks
    )


def test_torchao_saves_what_bf16_saves_plus_the_largest_eager_cast_temporaries() -> None:
    model, c = load_model("llama3-8b"), load_cluster("dgx-h100")
    layout = dict(micro_batch_size=1, global_batch_size=8, zero_stage=1)
    bf16, fp8 = _est(model, c, precision="bf16", **layout), _est(model, c, precision="fp8", **layout)
    # two fp32 copies of the largest tensor cast: the gate/up projection's output gradient, 8192 × 2·14336
    assert fp8.memory.activations - bf16.memory.activations == 8 * model.seq_length * 2 * 14336
    assert fp8.memory.fp8_weight_copies == 0


def test_mfu_of_an_fp8_layout_is_against_the_fp8_peak() -> None:
    model, c = load_model("gpt3-13b"), load_cluster("dgx-h100", {"nodes": 2})
    e = _est(model, c, precision="fp8", tp=8, micro_batch_size=1, global_batch_size=256, fused_kernels=True)
    assert e.peak_flops == 1979e12 and e.mfu == pytest.approx(e.tflops_per_gpu / 1979)
    assert "model FLOPs / fp8 peak 1,979 TFLOP/s (its linear layers' GEMMs;" in mfu_line(e)
    d = e.to_dict()
    parts = d["memory_per_gpu_bytes"]
    assert (
        parts["fp8_weight_copies"] > 0 and sum(v for k, v in parts.items() if k != "total") == parts["total"]
    )
    assert d["peak_flops_per_gpu"] == 1979e12 and d["layout"]["precision"] == "fp8"


def test_te_fp8_speeds_up_a_gemm_bound_model_and_eager_torchao_slows_it() -> None:
    """GPT-3 175B as DGX Cloud ran it (TP4 PP8) gains from FP8 linear GEMMs under TE; the eager torchao casts of
    dstk train cost more than FP8 saves (torch.compile would fuse them; dstk train runs eagerly)."""
    model, c = load_model("gpt3-175b"), load_cluster("dgx-h100", {"nodes": 64})
    layout = dict(tp=4, pp=8, micro_batch_size=1, global_batch_size=1024, tp_sequence_parallel=True)
    layout.update(tp_vocab_parallel=True, flash_attention=True)

    def speedup(fused: bool) -> float:
        bf16, fp8 = (_est(model, c, precision=p, fused_kernels=fused, **layout) for p in ("bf16", "fp8"))
        return fp8.tokens_per_s / bf16.tokens_per_s

    assert 1.2 < speedup(True) < 2 and speedup(False) < 1


def test_te_casts_weights_once_per_step_and_reduces_amaxes_over_data_parallel() -> None:
    model, c = load_model("gpt3-13b"), load_cluster("dgx-h100", {"nodes": 2})
    fp8 = Fp8Gemms(1979e12, 0.57, "delayed")
    stage = dict(micro_batch=1, e=2, tp=1, sp=1, dense_layers=model.n_layers, moe_layers=0, last=False)
    sc = stage_compute(
        model,
        count_params(model),
        c,
        **stage,
        recompute="none",
        sequence_parallel=False,
        peak=989e12,
        fp8=fp8,
    )
    pc = count_params(model)
    weights = model.n_layers * (pc.attention_weights + pc.mlp_weights)
    assert sc.per_step_s == pytest.approx(weights * (2 + 2) / 3350e9)  # read bf16, write two FP8 copies
    layout = dict(micro_batch_size=1, global_batch_size=64, fused_kernels=True, flash_attention=True)
    bf16, fp8e = _est(model, c, precision="bf16", **layout), _est(model, c, precision="fp8", **layout)
    # tp = pp = 1: the only per-micro-batch collective is TE's amax all-reduce over the 16 data-parallel ranks
    assert bf16.time.model_parallel_comm_s == 0 < fp8e.time.model_parallel_comm_s < 1e-2


# --------------------------------------------------------------------------------------------- planner


def test_plan_with_allow_fp8_picks_fp8_under_transformer_engine_and_says_why() -> None:
    from toolkit.plan.planner import plan
    from toolkit.plan.query import PlanQuery

    model, c = load_model("gpt3-13b"), load_cluster("dgx-h100", {"nodes": 2})
    fp8 = plan(model, c, PlanQuery(global_batch_size=256, scopes=MEGATRON, allow_fp8=True))
    bf16 = plan(model, c, PlanQuery(global_batch_size=256, scopes=MEGATRON))
    assert fp8.best.layout.precision == "fp8" and bf16.best.layout.precision == "bf16"
    ratio = fp8.best.tokens_per_s / bf16.best.tokens_per_s
    (line,) = [x for x in fp8.explanation if x.startswith("Precision fp8")]
    assert f"Precision fp8: {ratio:.2f}× the tokens/s of the best bf16 layout" in line and ratio > 1.1
    assert "more per GPU" in line or "less per GPU" in line
    assert fp8.best.layout.pp == 1  # Megatron-DeepSpeed's TE path needs GPTModel (no pipeline)


def test_plan_with_allow_fp8_keeps_bf16_where_eager_casts_cost_more() -> None:
    pins = ["--zero-stage", "1", "--tp", "1", "--pp", "1"]  # layouts torchao's conversion runs
    r = dstk("plan", "--model", "llama3-8b", "--cluster", "dgx-h100", *pins, "--allow-fp8", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["layout"]["precision"] == "bf16"
    (line,) = [x for x in data["explanation"] if "fp8 weighed" in x]
    assert re.search(r"fp8 weighed \(torchao\.float8\): 0\.\d\d× the tokens/s of the best bf16 layout", line)
    assert re.search(
        r"in the bf16 layout fp8 makes 0\.\d\d×: the FP8 casts cost more than its faster GEMMs", line
    )


def test_fp8_line_names_the_attention_kernel_that_comes_with_transformer_engine() -> None:
    """Under --target megatron bf16 runs CoreAttention unless --flash-attention; TE's layer brings its own fused
    attention, and the line says that part of the gain is that."""
    from toolkit.plan.planner import plan
    from toolkit.plan.query import PlanQuery

    model, c = load_model("gpt3-13b"), load_cluster("dgx-h100", {"nodes": 2})
    p = plan(model, c, PlanQuery(global_batch_size=256, scopes=MEGATRON, allow_fp8=True))
    (line,) = [x for x in p.explanation if x.startswith("Precision fp8")]
    assert "part of it is Transformer Engine's fused attention, where the bf16 layout runs unfused" in line


@pytest.mark.parametrize(
    ("argv", "pattern"),
    [
        (
            ["plan", "--model", "llama-7b", "--cluster", "dgx-a100-80g", "--allow-fp8"],
            r"--allow-fp8: fp8 needs FP8",
        ),
        (
            ["plan", "--model", "llama-7b", "--cluster", "dgx-h100", "--allow-fp8", "--precision", "bf16"],
            r"--allow-fp8: --precision bf16 pins the precision; drop one",
        ),
        (
            ["config", "--model", "llama-7b", "--cluster", "dgx-h100", "--allow-fp8", "-o", "-"],
            r"give --plan, or --precision",
        ),
    ],
)
def test_allow_fp8_refusals_are_one_line(argv, pattern) -> None:
    r = dstk(*argv)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and re.search(pattern, r.err), r.err


def test_plan_without_allow_fp8_never_tries_fp8() -> None:
    from toolkit.plan.planner import plan
    from toolkit.plan.query import PlanQuery

    p = plan(load_model("gpt3-13b"), load_cluster("dgx-h100", {"nodes": 2}), PlanQuery(scopes=MEGATRON))
    assert {c.layout.precision for c in p.alternatives} | {p.best.layout.precision} == {"bf16"}


# ------------------------------------------------------------------------------------------- configs


def test_deepspeed_config_of_an_fp8_layout_is_bf16_with_fp8_in_the_dstk_block(tmp_path) -> None:
    out = tmp_path / "ds.json"
    flags = ["--model", TINY_LLAMA, "--cluster", "dgx-h100", "--micro-batch", "1", "--global-batch", "8"]
    r = dstk("config", *flags, "--precision", "fp8", "-o", str(out))  # validated by DeepSpeed's classes
    assert r.code == 0, r.err
    cfg = json.loads(out.read_text())
    assert (
        cfg["bf16"] == {"enabled": True}
        and "fp16" not in cfg
        and "fp8" not in json.dumps({k: v for k, v in cfg.items() if k != "dstk"})
    )
    assert cfg["dstk"]["layout"]["precision"] == "fp8"
    est = dstk("estimate", "--model", TINY_LLAMA, "--cluster", "dgx-h100", "--config", str(out), "--json")
    assert est.code == 0 and json.loads(est.out)["layout"]["precision"] == "fp8"


@pytest.mark.parametrize(
    ("flags", "pattern"),
    [
        (["--model", "llama-7b", "--megatron"], r"cannot run llama-7b as planned: RMSNorm or a gated MLP"),
        (["--model", "gpt3-13b", "--megatron", "--pp", "2"], r"pp=2 \(TE needs GPTModel"),
        (["--model", TINY_LLAMA, "--hf-trainer"], r"--hf-trainer: fp8 is dstk train's torchao.float8"),
        (["--model", "gpt3-13b", "--zero-stage", "1"], r"gpt2 projections are Conv1D, not nn.Linear"),
        (["--model", "llama-7b", "--zero-stage", "3"], r"ZeRO-3 \(Float8Linear's saved weight view"),
    ],
)
def test_fp8_configs_refuse_what_their_runtime_cannot_run(tmp_path, flags, pattern) -> None:
    r = dstk("config", *flags, "--cluster", "dgx-h100", "--precision", "fp8", "-o", str(tmp_path / "x.json"))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and re.search(pattern, r.err), r.err
    assert not (tmp_path / "x.json").exists()


# -------------------------------------------------------------------------------------------- run path


def test_torchao_converts_the_block_linears_not_the_lm_head_and_trains(monkeypatch) -> None:
    """On the CPU with torchao's emulation (the casts happen, the GEMMs run in high precision)."""
    pytest.importorskip("torchao")
    import torch
    from torchao.float8.float8_linear import Float8Linear

    from toolkit.run import fp8
    from toolkit.run.models import build_model

    model = build_model(load_model(TINY_LLAMA), {})
    converted = fp8.convert(model, emulate=True)
    assert len(converted) == 2 * 7 and "lm_head" not in converted  # q, k, v, o, gate, up, down per block
    assert type(model.lm_head) is torch.nn.Linear and isinstance(
        model.model.layers[0].mlp.down_proj, Float8Linear
    )
    ids = torch.randint(0, 512, (2, 64))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_the_rank_refuses_fp8_without_an_fp8_gpu() -> None:
    import torch

    from toolkit.run.fp8 import check_device

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: check_device asks its compute capability")
    with pytest.raises(UserError, match=r"torchao\.float8 needs a CUDA GPU; this rank has none"):
        check_device(torch)


def test_preflight_refuses_fp8_without_torchao(monkeypatch) -> None:
    import importlib.util

    from toolkit.run.fp8 import preflight

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    request = LayoutRequest(precision="fp8", zero_stage=1)
    with pytest.raises(UserError, match=r"pip install 'torchao>=0.18,<0.19'"):
        preflight(load_model(TINY_LLAMA), load_cluster("dgx-h100"), request)


def test_train_refuses_fp8_on_this_cpu_before_any_rank_starts(tmp_path) -> None:
    """`dstk train` as a rank of a 2-rank job would see it: the pre-flight (no torch) refuses in one line."""
    from tests.cli import dstk_process

    r = dstk_process(
        "train", "--config", str(REPO / "tests" / "bad" / "fp8_h100_2_ranks.json"), "--model", TINY_LLAMA,
        "--steps", "2", "--run-dir", str(tmp_path / "run"), "--snapshot-every", "0",
        env={"WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert r.code == 2, r.err
    assert re.search(
        r"its layout is fp8: fp8 needs FP8 tensor cores .* cluster local ", r.err.strip().splitlines()[-1]
    )


def test_validate_says_an_fp8_layout_trains_in_bf16_on_cuda() -> None:
    from toolkit.integrations.validate import validate_config

    cfg = json.loads((REPO / "tests" / "bad" / "fp8_h100_2_ranks.json").read_text())
    assert not validate_config(cfg, 2, "cuda").problems
    cfg["bf16"] = {"enabled": False}
    texts = validate_config(cfg, 2, "cpu").texts
    assert any(t.startswith("bf16.enabled: dstk.layout is fp8, which trains in bf16") for t in texts)
    assert any("fp8 needs FP8 tensor cores on CUDA, not the cpu accelerator" in t for t in texts)
