"""torchtitan's op-level selective checkpointing (`--recompute ops`), held to what torch's own SAC keeps and replays.

torchtitan wraps each block in torch's checkpoint wrapper with a selective-checkpointing policy that saves the
outputs of aten.mm — all but every second one — and of the attention kernel, and replays everything else
(torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py; e7c0cae drops aten.abs from its `_save_list`). Here that
policy, copied as torchtitan writes it, runs on the blocks of HF models built from configs, wrapped as
torchtitan wraps its own; what it saved in forward and the GEMMs it ran again in backward are counted and
compared with the cost model's terms (toolkit.plan.cost.activations.op_sac_matmuls, block_bytes; flops).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from toolkit.plan.cost.activations import block_bytes
from toolkit.plan.cost.flops import hardware_flops_per_token
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.specs import ModelSpec

BATCH, SEQ = 2, 16


def _tiny(preset: str) -> ModelSpec:
    """`preset`'s architecture at a size the CPU runs in a second (GQA kept: 4 heads over 2 kv heads)."""
    shape = dict(
        hidden_size=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden_size=160,
        vocab_size=128,
        seq_length=SEQ,
        max_position_embeddings=SEQ,
    )
    return load_model(preset).model_copy(update=shape)


def _torchtitan_sac(spec: ModelSpec, float8: bool = False) -> dict[str, float]:
    """One forward and backward of the HF model from `spec` (fp32, SDPA) with torchtitan's op-level policy on
    every decoder layer: bytes the policy saved per block, FLOPs of the GEMMs replayed per block (backward's
    GEMMs less those of the same model without checkpointing), and whether the gradients equal that model's.
    `float8`: the linear layers converted to torchao's Float8Linear as dstk train converts them (emulated on
    the CPU), under e7c0cae's list, which no longer saves `abs` (9dec370's would keep every cast's)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    from transformers import AutoModelForCausalLM

    from toolkit.run.models import hf_config

    aten = torch.ops.aten
    # torchtitan's `_save_list`; the CPU runs SDPA's flash kernel as `_for_cpu`, the stand-in for CUDA's
    save_list = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.max.default,
    } | (set() if float8 else {aten.abs.default})
    seen = {"saved_bytes": 0.0, "replayed_flops": 0.0, "amax_bytes": 0.0}

    def _get_custom_policy(meta):
        def _custom_policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            mm_count_key = f"{mode}_mm_count"
            if func == aten.mm.default:
                meta[mm_count_key] += 1
            # Saves output of all compute ops, except every second mm (torchtitan's policy, verbatim)
            to_save = func in save_list and not (func == aten.mm.default and meta[mm_count_key] % 2 == 0)
            if to_save and not ctx.is_recompute:
                outputs = ctx.op_output if isinstance(ctx.op_output, tuple) else (ctx.op_output,)
                tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
                size = sum(t.numel() * t.element_size() for t in tensors)
                # the casts' amaxes, one fp32 scalar each, which dstk leaves out
                seen["amax_bytes" if func == aten.max.default else "saved_bytes"] += size
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

        return _custom_policy

    def selective_checkpointing_context_fn():
        return create_selective_checkpoint_contexts(_get_custom_policy(defaultdict(int)))

    torch.manual_seed(0)
    config = hf_config(spec)
    config._attn_implementation = "sdpa"
    config.use_cache = False  # a KV cache would grow again in the replay (HF turns it off when checkpointing)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(plain.state_dict())
    if float8:
        from toolkit.run.fp8 import convert

        for m in (plain, model):
            convert(m, emulate=True)
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(
            layer, context_fn=selective_checkpointing_context_fn, preserve_rng_state=False
        )

    class BackwardGemms(TorchDispatchMode):
        """FLOPs of the GEMMs (the linear layers' mm and addmm) autograd runs in backward, replays included."""

        flops = 0.0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (aten.mm.default, aten.addmm.default):
                a, b = args[-2], args[-1]
                self.flops += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
            return func(*args, **(kwargs or {}))

    x = torch.randint(0, spec.vocab_size, (BATCH, SEQ))
    backward = {}
    for name, m in (("plain", plain), ("sac", model)):
        m.train()
        loss = m(input_ids=x, labels=x).loss
        with BackwardGemms() as count:
            loss.backward()
        backward[name] = count.flops
    seen["replayed_flops"] = backward["sac"] - backward["plain"]
    grads = dict(plain.named_parameters())
    same = all(
        torch.allclose(p.grad, grads[n.replace("._checkpoint_wrapped_module", "")].grad, rtol=1e-5, atol=1e-7)
        for n, p in model.named_parameters()
    )
    seen["amaxes"] = seen.pop("amax_bytes", 0.0)
    return {
        "amaxes": seen["amaxes"] / spec.n_layers,
        "saved_bytes": seen["saved_bytes"] / spec.n_layers,
        "replayed_flops": seen["replayed_flops"] / spec.n_layers,
        "same_grads": same,
    }


@pytest.mark.parametrize("preset", ["tiny-llama", "qwen2-7b"])
def test_the_cost_model_keeps_and_replays_what_torchtitans_policy_does(preset: str) -> None:
    """Per block, the bytes the policy saves plus the block input the checkpoint keeps are dstk's `ops` term,
    and the GEMM FLOPs replayed in backward are the hardware FLOPs `ops` adds to no recomputation. Llama
    (no biases) saves q, v, gate and down and replays k, o and up; Qwen2's biased q, k and v projections run
    aten.addmm, which the policy neither counts nor saves, so it saves o and up and replays q, k, v and gate —
    not down, which the checkpoint's early stop (torchtitan@9dec370's wrapper keeps torch's default) never
    reaches."""
    spec = _tiny(preset)
    run = _torchtitan_sac(spec)
    assert run["same_grads"]
    block_input = BATCH * SEQ * spec.hidden_size * 4
    predicted = block_bytes(spec, BATCH, 4, 1, False, "ops")
    assert run["saved_bytes"] + block_input == pytest.approx(predicted, rel=1e-9)
    added = hardware_flops_per_token(spec, "ops") - hardware_flops_per_token(spec, "none")
    assert run["replayed_flops"] == pytest.approx(added * BATCH * SEQ / spec.n_layers, rel=1e-9)


def test_torchao_float8_linear_layers_all_count_as_matmuls() -> None:
    """torchao's Float8Linear runs aten.mm and adds its bias apart, so under Float8 the policy counts Qwen2's
    biased q, k and v projections too and saves q, v, gate and down as in Llama (op_sac_matmuls' `float8`):
    checked with dstk train's conversion (emulated) through torch's SAC. The casts' amaxes, one fp32 scalar
    each, are saved too and left out of dstk's figure."""
    spec = _tiny("qwen2-7b")
    run = _torchtitan_sac(spec, float8=True)
    assert run["same_grads"] and 0 < run["amaxes"] <= 4 * 3 * 7  # fp32 scalars, ≤ 3 casts per linear layer
    block_input = BATCH * SEQ * spec.hidden_size * 4
    predicted = block_bytes(spec, BATCH, 4, 1, False, "ops", float8="eager")
    assert predicted != block_bytes(spec, BATCH, 4, 1, False, "ops")  # torch's linear layers differ
    assert run["saved_bytes"] + block_input == pytest.approx(predicted, rel=1e-9)
    added = hardware_flops_per_token(spec, "ops", float8="eager") - hardware_flops_per_token(spec, "none")
    assert run["replayed_flops"] == pytest.approx(added * BATCH * SEQ / spec.n_layers, rel=1e-9)


def test_op_recomputation_prices_torchtitans_8b_as_it_ran() -> None:
    """torchtitan's Llama 3.1 8B on 8 H100 (96 GB), local batch 2 at 8K tokens, op-level AC: the report gives
    82.4 GiB of reserved memory (benchmarks/llama3_h100_202412_torchtitan.md, Table 1). Priced as that policy it
    fits, below the report (the allocator reserves above what is live); Megatron-style selective (the attention
    core only, which FlashAttention never stores) would keep every activation and not fit."""
    from toolkit.plan.cost.estimate import estimate
    from toolkit.plan.layout import LayoutRequest
    from toolkit.plan.rules import resolve_layout

    model, cluster = load_model("llama3-8b"), load_cluster("grand-teton-h100", {"nodes": 1})

    def run(recompute: str):
        request = LayoutRequest(
            zero_stage=3, micro_batch_size=2, global_batch_size=16, recompute=recompute, fsdp="fp32"
        )
        return estimate(model, cluster, resolve_layout(model, cluster, request))

    ops, selective, full = run("ops"), run("selective"), run("full")
    assert ops.fits and not selective.fits
    assert 0.8 * 82.4 < ops.memory.total / 2**30 < 82.4
    assert full.memory.activations < ops.memory.activations < selective.memory.activations
    assert selective.time.compute_s < ops.time.compute_s < full.time.compute_s
