"""The planner on MoE models: Megatron-Core's folded expert grid, ETP and the dispatcher searched for
`--target megatron-core`, DeepSpeed's rule (EP inside DP) kept for `--target deepspeed`, and the layout the
safety margin alone dropped named in the explanation."""

from __future__ import annotations

import re

from tests.cli import dstk
from toolkit.commands import TARGET_SCOPES
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.planner import plan
from toolkit.plan.query import PlanQuery


def test_megatron_core_plans_deepseek_v3_on_nvl72_with_folded_experts() -> None:
    m, c = load_model("deepseek-v3-671b"), load_cluster("gb200-nvl72", {"nodes": 64})
    p = plan(m, c, PlanQuery(scopes=TARGET_SCOPES["megatron-core"]))
    assert p is not None
    lay = p.best.layout
    assert lay.etp is not None and lay.moe_dispatcher is not None and lay.comm_overlap
    assert (lay.tp * lay.sp * lay.dp) % (lay.etp * lay.ep) == 0
    assert lay.flash_attention  # Transformer Engine's fused attention
    why = "\n".join(p.explanation)
    assert "etp = " in why or "moe_dispatcher = " in why


def test_deepspeed_target_keeps_experts_inside_data_parallel_ranks() -> None:
    m, c = load_model("qwen3-30b-a3b"), load_cluster("dgx-h100", {"nodes": 2})
    p = plan(m, c, PlanQuery(scopes=TARGET_SCOPES["deepspeed"]))
    assert p is not None and p.best.layout.etp is None and p.best.layout.dp % p.best.layout.ep == 0


def test_kimi_k2_plans_at_one_trillion_parameters() -> None:
    r = dstk(
        "plan",
        "--model",
        "kimi-k2-1t",
        "--cluster",
        "gb200-nvl72",
        "--nodes",
        "64",
        "--target",
        "megatron-core",
    )
    assert r.code == 0, r.err
    assert re.search(r"ep=\d+ etp=\d+ (alltoall|hybridep)", r.out)


def test_a_layout_dropped_only_by_the_margin_is_named_with_the_margin_that_keeps_it() -> None:
    """DeepSeek-V3 on 256 H100: a faster layout needs more than the 90 % the default margin leaves; the plan
    names it, and the margin it quotes lets the planner take it."""
    m, c = load_model("deepseek-v3-671b"), load_cluster("dgx-h100", {"nodes": 32})
    scopes = TARGET_SCOPES["megatron-core"]
    p = plan(m, c, PlanQuery(scopes=scopes))
    assert p is not None
    line = next(x for x in p.explanation if x.startswith("Dropped by the safety margin only"))
    margin = float(re.search(r"--memory-margin (\d\.\d\d)", line).group(1))
    relaxed = plan(m, c, PlanQuery(scopes=scopes, margin=margin))
    assert relaxed is not None and relaxed.best.tokens_per_s > 1.02 * p.best.tokens_per_s
