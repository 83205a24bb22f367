"""One process (a job of one): tiny Mixtral, Qwen2-MoE (shared expert, no top-k renormalisation) and Qwen3-MoE
(renormalised) built from configs in fp32; each model's logits and HF router loss before and after
`toolkit.parallel.hf_moe.convert_hf_moe` at ep = 1, and a backward through the converted model. Prints JSON."""

from __future__ import annotations

import copy
import json

import torch
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from toolkit.parallel.hf_moe import convert_hf_moe
from toolkit.run.runtime import exit_without_teardown, init_distributed

COMMON = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              num_experts_per_tok=2, max_position_embeddings=64, output_router_logits=True)  # fmt: skip
MODELS = {
    "mixtral": (MixtralForCausalLM, MixtralConfig(**COMMON, intermediate_size=48, num_local_experts=4)),
    "qwen2_moe": (
        Qwen2MoeForCausalLM,
        Qwen2MoeConfig(
            **COMMON,
            num_experts=4,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
            intermediate_size=64,
        ),
    ),
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(
            **COMMON, num_experts=4, moe_intermediate_size=24, norm_topk_prob=True, intermediate_size=64
        ),
    ),
}


def main() -> None:
    init_distributed()
    out = {}
    for name, (cls, config) in MODELS.items():
        torch.manual_seed(0)
        hf = cls(config).eval()
        ids = torch.randint(0, config.vocab_size, (2, 16))
        with torch.no_grad():
            want = hf(input_ids=ids, labels=ids)
        converted = copy.deepcopy(hf)
        blocks = convert_hf_moe(converted, 1)
        with torch.no_grad():
            got = converted(input_ids=ids, labels=ids)
        converted.train()
        converted(input_ids=ids, labels=ids).loss.backward()
        experts = [p for n, p in converted.named_parameters() if "deepspeed_experts" in n]
        out[name] = {
            "blocks": blocks,
            "logits_max_diff": float((want.logits - got.logits).abs().max()),
            "aux_hf": float(want.aux_loss),
            "aux_converted": float(got.aux_loss),
            "loss_hf": float(want.loss),
            "loss_converted": float(got.loss),
            "expert_grads": all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in experts),
            "experts_marked": all(getattr(p, "allreduce", True) is False for p in experts),
            "n_expert_tensors": len(experts),
        }
    print("HFMOE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
