"""Full recomputation's early stop, checked against the GEMMs real HF modules run in backward.

PyTorch's non-reentrant checkpoint stops replaying a block once the tensor its forward saved last is back. The
cost model (toolkit.plan.cost.compute.early_stop_skips) says that leaves a dense block's last linear layer out
when nothing after it saves a tensor, and recomputes it whole otherwise; dstk train checkpoints as the layout
was priced (toolkit.run.session._recompute_blocks). Here both are held to what autograd actually runs.
"""

from __future__ import annotations

import pytest

from toolkit.plan.cost.compute import early_stop_skips
from toolkit.plan.cost.estimate import estimate
from toolkit.plan.layout import Layout, LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.rules import resolve_layout, violations
from toolkit.plan.specs import ModelSpec

GEMMS = ("mm", "addmm")  # the linear layers; attention's batched matmuls (bmm) are not counted


def _layout(**fields: object) -> Layout:
    base = dict(precision="fp32", dp=1, global_batch_size=1, gradient_accumulation_steps=1, world_size=1)
    return Layout(**{**base, **fields})


def _backward_gemms(spec: ModelSpec, layout: Layout | None) -> tuple[int, int]:
    """GEMM kernels autograd dispatches during one backward of the HF model built from `spec` (2 tokens × 8),
    recomputation included, with dstk train's checkpointing for `layout` (None: no checkpointing); and the
    linear layers (nn.Linear, GPT-2's Conv1D) of one block, what a whole replay runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import AutoModelForCausalLM

    from toolkit.run.models import hf_config
    from toolkit.run.session import _recompute_blocks

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in GEMMS:
                self.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    model.train()
    if layout is not None:
        _recompute_blocks(model, layout)
    x = torch.randint(0, spec.vocab_size, (2, 8))
    loss = model(input_ids=x, labels=x).loss
    count = Count()
    with count:
        loss.backward()
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if type(m).__name__ in ("Linear", "Conv1D") and m is not head]
    return count.n, len(linears) // spec.n_layers


@pytest.mark.parametrize(
    ("preset", "dropout"),
    [("tiny-llama", False), ("tiny-gpt2", False), ("tiny-gpt2", True)],
)
def test_recomputation_skips_the_last_linear_exactly_where_the_model_says(preset: str, dropout: bool) -> None:
    """Llama (SwiGLU, no dropout) and GPT-2 without dropout replay all but the down projection; GPT-2 with
    dropout saves the mask after it and replays the whole block; --no-recompute-early-stop replays it whole
    everywhere. The skipped GEMM is one per block, as the cost model subtracts."""
    spec = load_model(preset).model_copy(update={"dropout": dropout})
    plain, per_block = _backward_gemms(spec, None)
    early, _ = _backward_gemms(spec, _layout(recompute="full"))
    whole, _ = _backward_gemms(spec, _layout(recompute="full", recompute_early_stop=False))
    assert whole - plain == spec.n_layers * per_block
    skipped = spec.n_layers if early_stop_skips(spec) else 0
    assert early - plain == spec.n_layers * per_block - skipped
    assert early_stop_skips(spec) is not dropout


def test_early_stop_prices_one_linear_less_per_block() -> None:
    """Recompute time and executed FLOPs drop by the down projections, nothing else moves."""
    model, cluster = load_model("llama-7b"), load_cluster("dgx-h100")
    on = estimate(
        model, cluster, resolve_layout(model, cluster, LayoutRequest(recompute="full", micro_batch_size=2))
    )
    off = estimate(
        model,
        cluster,
        resolve_layout(
            model, cluster, LayoutRequest(recompute="full", micro_batch_size=2, recompute_early_stop=False)
        ),
    )
    assert on.layout.recompute_stops_early and not off.layout.recompute_stops_early
    assert on.time.compute_s < off.time.compute_s
    assert on.memory.total == off.memory.total
    tail = model.n_layers * model.ffn_hidden_size * model.hidden_size
    assert off.hardware_flops_per_token - on.hardware_flops_per_token == pytest.approx(2 * tail)
    assert on.model_flops_per_token == off.model_flops_per_token


@pytest.mark.parametrize(
    ("request_fields", "expected"),
    [
        (dict(recompute="full"), True),  # dstk train: HF modules, torch's non-reentrant checkpoint
        (dict(recompute="full", fused_kernels=True), False),  # Megatron/NeMo's reentrant checkpoint
        (dict(recompute="full", fused_kernels=True, fsdp="fp32", zero_stage=3), True),  # FSDP's wrapper
        (dict(recompute="full", pp=2), False),  # DeepSpeed's pipeline checkpoint
        (dict(recompute="full", offload_activations=True), False),  # deepspeed.checkpointing
        (dict(recompute="selective"), False),
        (dict(recompute="full", recompute_early_stop=False), False),
    ],
)
def test_early_stop_default_follows_the_runtime(request_fields: dict, expected: bool) -> None:
    assert _layout(**request_fields).recompute_stops_early is expected


def test_early_stop_rules() -> None:
    model, cluster = load_model("llama-7b"), load_cluster("dgx-h100")
    cases = [
        (
            LayoutRequest(recompute="selective", recompute_early_stop=True),
            ("layout",),
            "not --recompute selective",
        ),
        (LayoutRequest(recompute_early_stop=False), ("layout",), "--no-recompute-early-stop: says where"),
        (
            LayoutRequest(recompute="full", pp=2, recompute_early_stop=True),
            ("layout", "deepspeed"),
            "with --pp",
        ),
        (LayoutRequest(recompute="full", recompute_early_stop=True), ("layout", "megatron"), "reentrant"),
    ]
    for request, scopes, fragment in cases:
        problems = violations(model, cluster, request, 8, scopes)
        assert any(fragment in p for p in problems), (request, problems)
    ok = LayoutRequest(recompute="full", recompute_early_stop=True)
    assert not violations(model, cluster, ok, 8, ("layout", "deepspeed"))


def test_plan_keeps_a_pinned_early_stop_and_prices_megatron_plans_whole() -> None:
    """dstk plan carries --no-recompute-early-stop into its layouts (dstk train then replays whole blocks);
    Megatron-DeepSpeed plans (fused kernels) price the whole replay its reentrant checkpoint runs."""
    from toolkit.plan.planner import plan
    from toolkit.plan.query import PlanQuery

    model, cluster = load_model("llama-7b"), load_cluster("dgx-h100")

    def chosen(**query: object) -> Layout:
        result = plan(model, cluster, PlanQuery(recompute="full", **query))
        assert result is not None
        return result.best.estimate.layout

    assert chosen().recompute_stops_early
    assert not chosen(recompute_early_stop=False).recompute_stops_early
    megatron = chosen(scopes=("layout", "megatron"))
    assert megatron.fused_kernels and not megatron.recompute_stops_early


def test_early_stop_skips_the_down_projections_tp_all_reduce() -> None:
    """Under AutoTP the row-parallel down projection all-reduces its output right after its GEMM: a replay
    that stops before that GEMM issues 5 of the block's 6 all-reduces, one fewer per block."""
    from toolkit.plan.cost import comm
    from toolkit.plan.cost.timing import _groups

    model, cluster = load_model("llama-7b"), load_cluster("dgx-h100")

    def tp_comm(stop: bool) -> tuple[float, Layout]:
        request = LayoutRequest(tp=2, recompute="full", micro_batch_size=2, recompute_early_stop=stop)
        est = estimate(model, cluster, resolve_layout(model, cluster, request))
        return est.time.model_parallel_comm_s, est.layout

    whole, layout = tp_comm(False)
    early, _ = tp_comm(True)
    tokens = layout.micro_batch_size * model.seq_length
    one = comm.all_reduce_s(tokens * model.hidden_size * 2, _groups(layout, cluster)["tp"], cluster)
    per_micro = (whole - early) / layout.gradient_accumulation_steps
    assert per_micro == pytest.approx(model.n_layers * one)
