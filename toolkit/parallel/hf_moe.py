"""Expert parallelism for HF's own MoE blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss), routed exactly as HF routes.

DeepSpeed's AutoEP would do this but fails on transformers 5.x: `auto_ep_presets/base.py` calls
`_CAN_RECORD_REGISTRY.get(key, default)`, and transformers' `_CanRecordRegistry.get(self, model)` takes one
argument (TypeError at engine construction). DeepSpeed's own `TopKGate` cannot stand in for HF's router either:
it always renormalises the top-k weights (Qwen2/3-MoE do so only with `norm_topk_prob`), computes its logits in
fp32 from its own weight, and for k = 2 adds Gumbel noise to the second choice by default, even in eval.

So each sparse block becomes a DeepSpeed `MoE` (which the engine recognises: expert-parallel groups, expert
gradients kept out of the data-parallel all-reduce, per-expert checkpoint files) whose gate is a thin
adapter around the block's *own* router instance. Routing is then HF's by construction, and the router
module is still an instance of HF's router class, so the forward hook HF installs to record router logits
still finds it and HF's load-balancing loss (`output_router_logits`) is computed as before. No token is
dropped: the capacity is the largest expert load, all-reduced (MAX) over the expert-parallel group because
DeepSpeed's all-to-all needs equal splits. Expert `g` (HF order) lives on expert-parallel rank `g // (E/ep)`
as local expert `g % (E/ep)`: the all-to-all splits the [E, C, M] dispatch buffer into contiguous blocks, and
DeepSpeed's checkpoint names use the same global ids.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class RouterGate(torch.nn.Module):
    """`MOELayer.gate` made of an HF top-k router: DeepSpeed 0.19.8's sparse-route contract (sharded_moe.py
    `MOELayer.forward`): (l_aux, capacity, experts, indices [k,S], locations [k,S], weights [k,S] fp32, counts [E]).
    `l_aux` is 0: HF adds its own router loss from the logits its hook records."""

    def __init__(self, router: torch.nn.Module, num_experts: int) -> None:
        super().__init__()
        self.router = router
        self.num_experts = num_experts
        self.ep_group: Any = None

    def _set_ep_group(self, group: Any) -> None:  # DeepSpeed's MoE hands its group to the gate
        self.ep_group = group

    def forward(
        self, x: torch.Tensor, used_token: Any = None, sparse: bool = True, tutel: bool = False
    ) -> Any:
        if used_token is not None or not sparse or tutel:
            raise NotImplementedError(
                "RouterGate: only DeepSpeed's sparse routes, without a token mask or Tutel"
            )
        _, weights, index = self.router(x)  # __call__, not .forward: HF's recording hook must fire
        mask = torch.zeros(x.shape[0], self.num_experts, dtype=torch.long, device=x.device).scatter_(
            1, index, 1
        )
        location = (mask.cumsum(0) - 1).gather(1, index)  # the token's slot in its expert's buffer
        counts = mask.sum(0)
        capacity = counts.max().reshape(1)
        if self.ep_group is not None:
            import deepspeed.comm as dist

            if dist.get_world_size(group=self.ep_group) > 1:
                dist.all_reduce(capacity, op=dist.ReduceOp.MAX, group=self.ep_group)
        return (
            x.new_zeros((), dtype=torch.float32),
            capacity,
            self.num_experts,
            index.t().int().contiguous(),
            location.t().int().contiguous(),
            weights.t().float().contiguous(),
            counts.detach(),
        )


class FusedExpert(torch.nn.Module):
    """One expert of HF's fused `experts`, its tensors named and shaped as HF's slices for that expert (so a
    checkpoint's per-expert files stack back into HF's tensors): Mixtral's and Qwen's `gate_up_proj` [2f, h]
    (gate rows first) and `down_proj` [h, f]; gpt-oss's transposed [h, 2f] and [f, h] with biases, gate and
    up interleaved and clamped (GptOssExperts._apply_gate)."""

    def __init__(self, experts: torch.nn.Module, index: int) -> None:
        super().__init__()
        self.transposed = _transposed(experts)
        self.act_fn = getattr(experts, "act_fn", None)
        self.alpha = getattr(experts, "alpha", None)
        self.limit = getattr(experts, "limit", None)
        for name in _EXPERT_TENSORS:
            source = getattr(experts, name, None)
            if isinstance(source, torch.nn.Parameter):
                self.register_parameter(name, torch.nn.Parameter(source.detach()[index].clone()))

    def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.limit is not None:  # gpt-oss: interleaved, clamped, (up + 1) · gate · σ(α · gate)
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias_up, bias_down = getattr(self, "gate_up_proj_bias", None), getattr(self, "down_proj_bias", None)
        if self.transposed:
            h = self._gate(x @ self.gate_up_proj + (bias_up if bias_up is not None else 0))
            return h @ self.down_proj + (bias_down if bias_down is not None else 0)
        h = self._gate(F.linear(x, self.gate_up_proj, bias_up))
        return F.linear(h, self.down_proj, bias_down)


_EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def _transposed(experts: torch.nn.Module) -> bool:
    """HF's fused expert tensors are [E, h, 2f] (gpt-oss) rather than [E, 2f, h] (Mixtral, Qwen): transformers
    5's `use_experts_implementation` records it on the module."""
    return bool(getattr(experts, "is_transposed", False))


def _router(block: torch.nn.Module) -> torch.nn.Module:
    """The sparse block's router: `gate` (Mixtral, Qwen) or `router` (gpt-oss)."""
    return block.gate if hasattr(getattr(block, "gate", None), "top_k") else block.router


class ExpertParallelBlock(torch.nn.Module):
    """What replaces an HF sparse MoE block: the block's jitter (Mixtral, training only) before routing, DeepSpeed's
    MoE with the block's router, and Qwen2-MoE's gated shared expert beside it — outside the `moe` module, whose
    keys DeepSpeed treats as experts when it saves. Returns hidden states as the HF block does: alone, or with
    the router's scores where the decoder layer unpacks a pair (gpt-oss)."""

    def __init__(self, block: torch.nn.Module, ep_size: int, ep_rank: int) -> None:
        from deepspeed.moe.layer import MoE

        super().__init__()
        experts, router = block.experts, _router(block)
        num = experts.gate_up_proj.shape[0]
        hidden = experts.down_proj.shape[2 if _transposed(experts) else 1]
        local = num // ep_size
        self.moe = MoE(
            hidden_size=hidden,
            expert=FusedExpert(experts, ep_rank * local),
            num_experts=num,
            ep_size=ep_size,
            k=router.top_k,
            drop_tokens=False,
            top2_2nd_expert_sampling=False,
        )
        self.moe.deepspeed_moe.gate = RouterGate(router, num)
        with torch.no_grad():
            for j, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                for name, param in expert.named_parameters():
                    param.copy_(getattr(experts, name)[ep_rank * local + j])
        self.jitter = float(getattr(block, "jitter_noise", 0.0) or 0.0)
        self.shared_expert = getattr(block, "shared_expert", None)
        self.shared_expert_gate = getattr(block, "shared_expert_gate", None)
        self.returns_pair = hasattr(block, "router")

    def forward(self, hidden_states: torch.Tensor) -> Any:
        batch, seq, hidden = hidden_states.shape
        if self.training and self.jitter > 0:
            hidden_states = hidden_states * torch.empty_like(hidden_states).uniform_(
                1 - self.jitter, 1 + self.jitter
            )
        x = hidden_states.reshape(-1, hidden)
        out, _, _ = self.moe(x)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        out = out.reshape(batch, seq, hidden)
        return (out, None) if self.returns_pair else out


def is_sparse_block(module: torch.nn.Module) -> bool:
    """HF's sparse MoE blocks: a top-k router (`gate`, gpt-oss's `router`) and fused `experts` (Mixtral,
    Qwen2-MoE, Qwen3-MoE, gpt-oss)."""
    experts = getattr(module, "experts", None)
    routers = (getattr(module, "gate", None), getattr(module, "router", None))
    return any(hasattr(r, "top_k") for r in routers) and hasattr(experts, "gate_up_proj")


def convert_hf_moe(model: torch.nn.Module, ep_size: int) -> int:
    """Replace every sparse MoE block of an HF model (process group up) by an ExpertParallelBlock holding this
    rank's E/ep experts; returns how many blocks were converted. The expert-parallel groups are made here, as
    the engine would make them (consecutive ranks), so each rank copies the slice the all-to-all sends it."""
    import deepspeed.comm as dist
    from deepspeed.utils import groups

    name = f"ep_size_{ep_size}"
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size)
    ep_rank = dist.get_rank(group=groups._get_expert_parallel_group(name))
    converted = 0
    for layer in model.base_model.layers:
        if is_sparse_block(layer.mlp):
            layer.mlp = ExpertParallelBlock(layer.mlp, ep_size, ep_rank)
            converted += 1
    return converted


def return_router_pair(model: torch.nn.Module) -> int:
    """Make each of DeepSpeed AutoEP's layers return (hidden states, None), as the HF decoder layer whose sparse
    block it replaced unpacks it (Llama 4's `hidden_states, _ = self.feed_forward(...)`): AutoEP's custom preset
    has no key for it, and without this the layer unpacks the batch dimension instead (at micro-batch 2 with no
    error). A plain forward hook on the layer, no change to either library; returns how many were hooked."""
    from deepspeed.module_inject.auto_ep_layer import AutoEPMoELayer

    layers = [m for m in model.modules() if isinstance(m, AutoEPMoELayer)]
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: (out, None))
    return len(layers)
