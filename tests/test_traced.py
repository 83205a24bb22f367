"""The family table and the trace agree: for every family in the table (no hand-kept list), a small model of
the family is described both ways — by the table's formulas and by tracing the HF model transformers builds
from the table's own config on the meta device (toolkit/run/trace.py) — and the two give the same parameters
tensor by tensor, forward FLOPs within 1 % and the bytes each kind of block saves for backward within 5 %
(as HF's eager modules keep them: toolkit/plan/cost/activations.py, `hf_eager_extra`). The table is the fast
path; the trace is how a model without an entry is priced, so this is what keeps them one model."""

from __future__ import annotations

import pytest

from toolkit.plan.architectures import ARCHITECTURES
from toolkit.plan.cost import activations as act
from toolkit.plan.cost.flops import attention_flops_per_token, matmul_params
from toolkit.plan.hf_config import to_hf_config
from toolkit.plan.params import count_params, tensor_numels
from toolkit.plan.specs import ModelSpec
from toolkit.plan.traced import TRACE_SEQ_LENGTHS

pytest.importorskip("transformers")
from toolkit.run.trace import trace_config

SEQ = TRACE_SEQ_LENGTHS[-1]


def _small(name: str) -> ModelSpec:
    """A four-block model of the family, with two dense blocks first where the family has them, grouped-query
    attention where it can, and small latent ranks for latent attention."""
    facts = ARCHITECTURES[name]
    extra: dict = {}
    if facts.native_moe:
        # Mixtral's experts are as wide as its dense MLP would be (HF has no separate key)
        extra.update(num_experts=4, moe_top_k=2, moe_ffn_hidden_size=None if name == "mixtral" else 64)
    if facts.shared_expert and not facts.shared_expert_as_wide_as_experts:
        extra.update(shared_expert_ffn_hidden_size=128 if facts.shared_expert_gate else 64)
    if facts.latent_attention:
        extra.update(q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=16, head_dim=48, v_head_dim=32)
    if name in ("deepseek_v2", "deepseek_v3", "glm4_moe"):
        extra.update(first_dense_layers=1)
    if name == "glm4_moe":
        extra.update(attention_bias=True, qk_norm=True)  # q/k/v biases without an output bias
    grouped = facts.naming == "llama" and not facts.latent_attention
    return ModelSpec(
        architecture=name,
        n_layers=4,
        hidden_size=256,
        n_heads=4,
        n_kv_heads=2 if grouped else 4,
        vocab_size=512,
        seq_length=SEQ,
        **extra,
    )


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_table_and_trace_agree(name: str) -> None:
    spec = _small(name)
    traced = trace_config(to_hf_config(spec))
    pc = count_params(spec)
    assert traced.total_params == pc.total and traced.active_params == pc.active
    assert traced.numels == tensor_numels(spec)
    forward = 2 * matmul_params(spec) + attention_flops_per_token(spec) / 3
    assert traced.forward_flops_per_token == pytest.approx(forward, rel=0.01)
    flash = spec.family.sdpa
    for kind, block in traced.kinds.items():
        moe = kind == "moe"
        recompute = act.attention_recompute("none", flash)
        table = act.block_bytes(spec, 1, 2, 1, False, recompute, moe=moe, hf_modules=True) / SEQ
        saved = block.saved_bytes_per_token + block.saved_bytes_per_token_per_key * SEQ
        assert saved == pytest.approx(table, rel=0.05), (name, kind)
        assert (block.num_experts, block.top_k) == ((spec.num_experts, spec.moe_top_k) if moe else (0, 0))
    assert set(traced.kinds) == {"moe" if spec.moe_layer(j) else "dense" for j in range(spec.n_layers)}
