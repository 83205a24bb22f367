"""The MoE cost model (toolkit/plan/cost/moe.py): which tokens reach a rank's experts, the folded expert grid,
the dispatchers, routing balance, EP overlap, MTP and uneven pipelines in the estimate."""

from __future__ import annotations

import math

import pytest

from toolkit.plan.cost import gemm, moe
from toolkit.plan.cost.compute import block_linears
from toolkit.plan.cost.estimate import estimate, stage_memories
from toolkit.plan.cost.fp8 import Linear
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.rules import resolve_layout

MCORE = dict(zero_stage=1, fused_kernels=True, flash_attention=True)


def _sp(tp: int) -> dict:
    return {"tp": tp, "tp_sequence_parallel": tp > 1}


def _grok(n_layers: int = 32):
    """The issue's Grok-1-shaped model: 8 experts of 32768, top-2, hidden 6144, sequence 8192."""
    spec = load_model("mixtral-8x7b").model_dump(exclude={"hf_config_json", "trace"})
    spec.update(
        name="grok-1-shaped", n_layers=n_layers, hidden_size=6144, n_heads=48, n_kv_heads=8, head_dim=128,
        ffn_hidden_size=32768, moe_ffn_hidden_size=32768, vocab_size=131072, seq_length=8192,
        max_position_embeddings=8192,
    )  # fmt: skip
    return type(load_model("mixtral-8x7b")).model_validate(spec)


def _estimate(model, cluster, **fields):
    layout = resolve_layout(model, cluster, LayoutRequest(**fields))
    return estimate(model, cluster, layout)


def test_each_tp_rank_computes_its_own_tokens_through_the_experts() -> None:
    """With TP 4 a rank dispatches m/4 tokens (sequence parallelism; DeepSpeed's drop_tokens): the routed
    GEMMs on a rank are a quarter of a TP-1 rank's, not the whole micro-batch's."""
    m = _grok()
    c = load_cluster("dgx-h100", {"nodes": 32})
    layouts = [
        resolve_layout(m, c, LayoutRequest(**_sp(tp), ep=8, **MCORE, etp=1, moe_routing="balanced"))
        for tp in (1, 4)
    ]
    # the busiest rank's rows over its even share (fewer tokens per rank spread a little more) set aside
    rows = [
        block_linears(m, 8192, lay.tp, True, lay.ep, experts=moe.placement(m, lay))[2].m
        / moe.placement(m, lay).imbalance
        for lay in layouts
    ]
    assert rows[0] == pytest.approx(4 * rows[1]) and rows[1] == pytest.approx(8192 / 4 * 2)


def test_grok_shaped_run_is_priced_near_the_published_step() -> None:
    """Issue 45's example: TP4 PP4 VPP8 EP8 CP2 on 256 H100, sequence 8192, global batch 1024 — published a
    20.7 s step at 42 % MFU (priced 57.3 s of compute before the MoE model)."""
    est = _estimate(
        _grok(), load_cluster("dgx-h100", {"nodes": 32, "attention_efficiency": 0.55}),
        **_sp(4), pp=4, virtual_stages=8, ep=8, sp=2, precision="bf16", global_batch_size=1024,
        comm_overlap=True, tp_vocab_parallel=True, **MCORE,
    )  # fmt: skip
    assert 0.8 < est.time.total_s / 20.7 < 1.25
    assert 0.35 < est.mfu < 0.5


def test_folded_ep_may_exceed_dp_and_stays_inside_the_node() -> None:
    """Megatron-Core's expert grid: EP 32 over TP 2 × DP 16 (refused without --etp), EP at stride ETP."""
    m, c = load_model("qwen3-235b-a22b"), load_cluster("dgx-h100", {"nodes": 32})
    with pytest.raises(Exception, match="dp\\(16\\) must be divisible by ep\\(32\\)"):
        resolve_layout(m, c, LayoutRequest(**_sp(2), pp=8, ep=32, **MCORE))
    lay = resolve_layout(m, c, LayoutRequest(**_sp(2), pp=8, ep=32, etp=1, **MCORE))
    assert moe.ep_group(lay, c).per_node == 8  # 8 consecutive ranks per node, not 4 at stride tp
    assert lay.expert_dp == 1


def test_the_busiest_rank_sets_the_pace_under_either_routing() -> None:
    """Megatron-Core's forced load balancing draws random logits (a uniform router), so its ranks' loads are
    binomially spread too: both routings price the expected busiest rank, which fewer tokens spread more."""
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", {"nodes": 8})
    assert moe.imbalance(m, 1, 4096) == 1.0
    few, many = moe.imbalance(m, 64, 512), moe.imbalance(m, 64, 32768)
    assert few > many > 1.0 and many < 1.03
    for routing in ("balanced", "natural"):
        lay = resolve_layout(m, c, LayoutRequest(tp=1, pp=1, ep=64, etp=1, moe_routing=routing, **MCORE))
        assert moe.placement(m, lay).imbalance == moe.imbalance(m, 64, 4096)


def test_flex_dispatchers_send_a_token_once_per_rank() -> None:
    """DeepEP/HybridEP send a token once to each rank holding any of its experts; NCCL's all-to-all one row per
    routed copy. Qwen3-30B (128 experts, top-8) on EP8: 7·(1 − C(112,8)/C(128,8)) ≈ 4.6 rows to other ranks
    per token, against 8·7/8 = 7 copies."""
    m = load_model("qwen3-30b-a3b")
    miss = math.prod((112 - i) / (128 - i) for i in range(8))
    assert moe._other_ranks_reached(128, 8, 8) == pytest.approx(7 * (1 - miss))
    assert 4.5 < moe._other_ranks_reached(128, 8, 8) < 4.7
    assert moe._other_ranks_reached(128, 1, 8) == 0.0
    # one expert per rank: every pick is a distinct rank, as many rows as copies leave the rank
    assert moe._other_ranks_reached(8, 8, 2) == pytest.approx(2 * 7 / 8)
    c = load_cluster("dgx-b200", {"nodes": 1})
    flex, nccl = (
        resolve_layout(m, c, LayoutRequest(tp=1, pp=1, ep=8, etp=1, moe_dispatcher=d, **MCORE))
        for d in ("hybridep", "alltoall")
    )
    rows = 4096 * m.moe_top_k
    ratio = moe.dispatch_s(m, c, flex, rows, 2, 4096) / moe.dispatch_s(m, c, nccl, rows, 2, 4096)
    assert ratio < 0.75  # 4.6 rows instead of 7, at the same NVLink all-to-all bandwidth, plus latency


def test_deepep_sends_a_token_once_per_domain_in_bf16_even_in_fp8_runs() -> None:
    """Top-8 routing over 4 nodes: NCCL's all-to-all moves each of the 8 copies, DeepEP each token once per
    domain it reaches. Megatron-Core hands DeepEP and HybridEP its bf16 hidden states (HybridEP asserts "does
    not support fp8 dispatch"): an fp8 run's dispatch moves what a bf16 run's does."""
    m, c = load_model("deepseek-v3-671b"), load_cluster("dgx-h100", {"nodes": 32})
    base = dict(tp=1, pp=8, ep=32, etp=1, **MCORE)
    times = {}
    for d in ("alltoall", "deepep"):
        for precision in ("bf16", "fp8"):
            lay = resolve_layout(m, c, LayoutRequest(moe_dispatcher=d, precision=precision, **base))
            times[d, precision] = moe.moe_comm_s(m, c, lay, 1, 2)
    assert times["deepep", "bf16"] < 0.7 * times["alltoall", "bf16"]
    assert times["deepep", "fp8"] == times["deepep", "bf16"]


def test_ep_overlap_hides_some_of_the_all_to_alls_not_all() -> None:
    m, c = load_model("qwen3-235b-a22b"), load_cluster("dgx-h100", {"nodes": 32})
    base = dict(
        **_sp(2), pp=8, virtual_stages=4, ep=32, etp=1, precision="fp8", global_batch_size=2048, **MCORE
    )
    plain, overlapped = (_estimate(m, c, **base, ep_comm_overlap=o).time for o in (False, True))
    assert overlapped.model_parallel_comm_s < plain.model_parallel_comm_s
    assert overlapped.total_s > plain.compute_s + plain.pipeline_bubble_s


def test_uneven_pipeline_and_mtp_are_priced_on_the_ranks_that_hold_them() -> None:
    """94 blocks on PP 8 × VPP 4 (Megatron's account-for-embedding-and-loss split) estimate; an MTP layer on the
    last rank adds a block's memory and time there."""
    m, c = load_model("qwen3-235b-a22b"), load_cluster("dgx-h100", {"nodes": 32})
    est = _estimate(m, c, **_sp(2), pp=8, virtual_stages=4, ep=32, etp=1, precision="fp8", **MCORE,
                    pipeline_layout="Et*2|(t*3|)*30t*2L")  # fmt: skip
    assert est.time.total_s > 0
    ds = load_model("deepseek-v3-671b")
    with_mtp = ds.model_copy(update={"mtp_layers": 1})
    c2 = load_cluster("gb200-nvl72", {"nodes": 64})
    fields = dict(tp=1, pp=4, virtual_stages=4, ep=64, etp=1, precision="bf16", **MCORE)
    plain = stage_memories(ds, c2, resolve_layout(ds, c2, LayoutRequest(**fields)))
    mtp = stage_memories(with_mtp, c2, resolve_layout(with_mtp, c2, LayoutRequest(**fields)))
    assert mtp[-1].total > plain[-1].total and mtp[0].total == plain[0].total
    assert _estimate(with_mtp, c2, **fields).time.compute_s > _estimate(ds, c2, **fields).time.compute_s


def test_megatron_core_recompute_modules_drop_what_they_rebuild_and_replay_it() -> None:
    """`--recompute-modules` (Megatron-Core's selective recomputation): each module's kept tensors leave the
    activations and its forward is repeated in backward; without core_attn the attention is not rebuilt."""
    from toolkit.plan.architectures import ACTIVATIONS
    from toolkit.plan.cost import activations as act
    from toolkit.plan.cost import selective
    from toolkit.plan.cost.attention import attention_core_s
    from toolkit.plan.cost.compute import stage_compute
    from toolkit.plan.params import count_params

    m, c = load_model("deepseek-v3-671b"), load_cluster("gb200-nvl72", {"nodes": 64})
    fields = dict(tp=1, pp=4, ep=64, etp=1, precision="bf16", **MCORE)
    none = resolve_layout(m, c, LayoutRequest(**fields))
    tokens = m.seq_length
    for modules in ("moe_act", "mla_up_proj", "layernorm", "moe_act,mla_up_proj,layernorm"):
        lay = resolve_layout(m, c, LayoutRequest(recompute="selective", recompute_modules=modules, **fields))
        dropped = sum(selective.kept_by(m, 2, True, lay.recomputed_modules)) * tokens  # TP 1: both count
        kept = act.per_micro_activations(m, none, 1, 1) - act.per_micro_activations(m, lay, 1, 1)
        assert dropped > 0 and kept == pytest.approx(dropped, rel=1e-12)
    # the second grouped GEMM's input, top-k copies of the expert width
    assert selective.kept_by(m, 2, True, frozenset({"moe_act"})) == (
        2 * m.moe_ffn_hidden_size * m.moe_top_k,
        0,
    )
    stage = dict(micro_batch=1, e=2, tp=1, sp=1, dense_layers=0, moe_layers=1, last=False, flash=True,
                 recompute="selective", sequence_parallel=False, peak=c.gpu_peak_tflops * 1e12)  # fmt: skip
    pc = count_params(m)
    replay = {
        k: stage_compute(m, pc, c, **stage, modules=frozenset(k.split(","))).recompute_s
        for k in ("core_attn", "moe_act", "core_attn,moe_act")
    }
    assert replay["core_attn"] == attention_core_s(m, c, tokens, 2, 1, stage["peak"], True, True)
    passes = ACTIVATIONS[m.activation].passes + 3  # SwiGLU: the activation and the gate product
    hbm = c.gpu_memory_gb_per_s * 1e9
    assert replay["moe_act"] == pytest.approx(passes * 2 * tokens * m.moe_top_k * m.moe_ffn_hidden_size / hbm)
    assert replay["core_attn,moe_act"] == pytest.approx(replay["core_attn"] + replay["moe_act"])


def test_recompute_modules_are_megatron_cores_and_must_be_in_the_model() -> None:
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", {"nodes": 2})
    base = dict(tp=1, pp=1, ep=16, etp=1, **MCORE)
    with pytest.raises(Exception, match="--recompute-modules: mla_up_proj needs multi-latent attention"):
        resolve_layout(m, c, LayoutRequest(recompute="selective", recompute_modules="mla_up_proj", **base))
    with pytest.raises(
        Exception, match="--recompute-modules: what --recompute selective rebuilds; got --recompute none"
    ):
        resolve_layout(m, c, LayoutRequest(recompute_modules="moe_act", **base))
    with pytest.raises(Exception, match="--recompute-modules: moe: not a module dstk prices"):
        LayoutRequest(recompute="selective", recompute_modules="moe")
    lay = resolve_layout(
        m, c, LayoutRequest(recompute="selective", recompute_modules="moe_act, layernorm", **base)
    )
    assert lay.recompute_modules == "layernorm,moe_act" and lay.recomputed_modules == {"layernorm", "moe_act"}


def test_an_fp8_moe_block_keeps_its_dispatched_tokens_as_the_grouped_gemm_saves_them() -> None:
    """In an FP8/MXFP8 run TE's GroupedLinear saves its quantized input, the only keeper of the dispatched
    tokens: a byte (and a scale per 32) instead of two per element, as for a dense block's linear inputs."""
    from toolkit.plan.cost import activations as act

    m = load_model("qwen3-30b-a3b")
    x = 1 + 1 / 32  # MXFP8's saved input
    common = dict(micro_batch=1, act_bytes=2, tp=1, sequence_parallel=False, recompute="selective", moe=True)
    bf16, mxfp8 = (act.block_bytes(m, **common, fp8_inputs=f) for f in (0, x))
    h, routed, o_width = m.hidden_size, m.moe_top_k, m.n_heads * m.v_width
    # the norm outputs (QKV and MLP inputs), the experts' second GEMM input, the dispatched tokens; the
    # attention output is kept in FP8 beside its bf16 copy (block_terms)
    per_token = (
        2 * (2 - x) * h + (2 - x) * m.moe_ffn_hidden_size * routed + (2 - x) * h * routed - x * o_width
    )
    assert bf16 - mxfp8 == pytest.approx(per_token * m.seq_length, rel=1e-12)
    hf = dict(common, hf_modules=True, dense_experts=False)
    assert act.block_bytes(m, **hf, fp8_inputs=0) - act.block_bytes(m, **hf, fp8_inputs=x) == pytest.approx(
        (per_token - (2 - x) * h * routed) * m.seq_length, rel=1e-12
    )  # HF's experts are no linear layers torchao converts: their dispatched tokens stay bf16


def test_megatron_cores_experts_share_the_waves_four_gemms_at_a_time() -> None:
    """Transformer Engine's GroupedLinear issues one cuBLAS GEMM per local expert over its 4 compute streams, so
    only 4 experts' tiles share the GPU's waves; one grouped kernel (torch._grouped_mm) lets all of them. 16
    experts of 2,048 rows × 1,536 on a 148-SM B200: 1,536 tiles of 128×256 fill 10.4 waves together, 384 of 4
    experts 2.6 waves (11 against 3 rounded up)."""
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-b200")
    folded, deepspeed = (
        moe.placement(m, resolve_layout(m, c, LayoutRequest(ep=8, etp=etp, **MCORE))) for etp in (1, None)
    )
    assert (folded.gemm_streams, deepspeed.gemm_streams) == (moe.TE_COMPUTE_STREAMS, None)
    assert [x.in_flight for x in block_linears(m, 4096, 1, True, experts=folded)[2:]] == [4, 4]
    assert [x.in_flight for x in block_linears(m, 4096, 1, True, experts=deepspeed)[2:]] == [None, None]
    shares = [gemm.quantization_efficiency(2048, 1536, 148, g) for g in (16, 4)]
    assert shares[1] < 0.9 * shares[0]
    t = [
        gemm.linear_s(
            Linear(2048 * 16, 2048, 1536, 16 * 2048 * 1536, groups=16, in_flight=f), 2, 2250e12, c, None
        )
        for f in (None, 4)
    ]
    assert t[1] / t[0] == pytest.approx(shares[0] / shares[1])
