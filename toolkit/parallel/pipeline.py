"""HF causal LMs as DeepSpeed `PipelineModule`s, computing exactly what the HF model computes.

The model becomes a list of layers: the embedding (a `TiedLayerSpec` shared with the LM head when the
embeddings are tied, so DeepSpeed keeps the two copies on the first and last stage in sync), one `LayerSpec`
per decoder block (the HF block class itself, its weights copied in), the final norm, and the LM head; the
loss is HF's shifted cross-entropy. Blocks are built only on the stage that owns them. Attention gets no
mask, so SDPA runs causal — what HF does for unpadded batches. Partitioning is DeepSpeed's `parameters`
(balance parameter counts) or `type:` the block class (balance blocks); full recomputation becomes
`activation_checkpoint_interval = 1`.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from toolkit.plan.specs import ModelSpec


def _load(module: nn.Module, state: dict[str, torch.Tensor], prefix: str) -> None:
    own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    missing, unexpected = module.load_state_dict(own, strict=False)
    missing = [m for m in missing if not m.endswith("inv_freq")]
    if missing or unexpected:
        raise KeyError(f"weights for {prefix}: missing {missing[:3]}, unexpected {unexpected[:3]}")


def _prefixes(spec: ModelSpec) -> dict[str, str]:
    if spec.family.naming == "gpt2":
        return {
            "embed": "transformer.wte.",
            "pos": "transformer.wpe.",
            "block": "transformer.h.{}.",
            "norm": "transformer.ln_f.",
            "head": "lm_head.",
        }
    return {
        "embed": "model.embed_tokens.",
        "block": "model.layers.{}.",
        "norm": "model.norm.",
        "head": "lm_head.",
    }


class EmbeddingPipe(nn.Module):
    """input_ids → hidden states (word + learned positions and dropout for GPT-2)."""

    def __init__(self, spec: ModelSpec, config: Any, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        p = _prefixes(spec)
        self.word_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        _load(self.word_embeddings, state, p["embed"])
        self.positions = None
        if spec.position_embedding == "learned":
            self.positions = nn.Embedding(spec.max_position_embeddings, spec.hidden_size)
            _load(self.positions, state, p["pos"])
        self.dropout = nn.Dropout(getattr(config, "embd_pdrop", 0.0))

    @property
    def weight(self) -> torch.Tensor:
        return self.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.word_embeddings(input_ids)
        if self.positions is not None:
            hidden = hidden + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        return self.dropout(hidden)


class BlockPipe(nn.Module):
    """One HF decoder block; Llama-family blocks also get their rotary embeddings computed here."""

    def __init__(self, spec: ModelSpec, config: Any, index: int, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.rotary = None
        arch, prefix = spec.architecture, spec.family.hf_prefix
        modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
        if spec.family.naming == "gpt2":
            self.block = getattr(modeling, f"{prefix}Block")(config, layer_idx=index)
        else:
            self.block = getattr(modeling, f"{prefix}DecoderLayer")(config, index)
            self.rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(config=config)
        _load(self.block, state, _prefixes(spec)["block"].format(index))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rotary is None:
            return self.block(hidden)
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        return self.block(hidden, position_ids=positions, position_embeddings=self.rotary(hidden, positions))


class NormPipe(nn.Module):
    def __init__(self, spec: ModelSpec, config: Any, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        if spec.norm == "layernorm":
            self.norm = nn.LayerNorm(spec.hidden_size, eps=getattr(config, "layer_norm_epsilon", 1e-5))
        else:
            from transformers.models.llama.modeling_llama import LlamaRMSNorm

            self.norm = LlamaRMSNorm(spec.hidden_size, eps=config.rms_norm_eps)
        _load(self.norm, state, _prefixes(spec)["norm"])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


class HeadPipe(nn.Module):
    """The untied LM head."""

    def __init__(self, spec: ModelSpec, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        _load(self.lm_head, state, "lm_head.")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def tied_head(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head as the transpose of the shared word embedding (TiedLayerSpec forward_fn)."""
    return nn.functional.linear(hidden, embedding.weight)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's loss: predict token t+1 from position t, in fp32, ignoring -100 (padding)."""
    return nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def build_pipeline(
    spec: ModelSpec,
    config: Any,
    state: dict[str, torch.Tensor],
    stages: int,
    partition: str = "parameters",
    checkpoint_interval: int = 0,
) -> Any:
    """The `PipelineModule` for `spec` with the HF weights in `state` (a `state_dict` of the HF model)."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    if spec.tied_embeddings:
        layers: list[Any] = [
            TiedLayerSpec("embed", EmbeddingPipe, spec, config, state, tied_weight_attr="weight")
        ]
    else:
        layers = [LayerSpec(EmbeddingPipe, spec, config, state)]
    layers += [LayerSpec(BlockPipe, spec, config, i, state) for i in range(spec.n_layers)]
    layers.append(LayerSpec(NormPipe, spec, config, state))
    if spec.tied_embeddings:
        layers.append(
            TiedLayerSpec(
                "embed", EmbeddingPipe, spec, config, state, forward_fn=tied_head, tied_weight_attr="weight"
            )
        )
    else:
        layers.append(LayerSpec(HeadPipe, spec, state))
    method = "type:BlockPipe" if partition == "type" else partition
    return PipelineModule(
        layers=layers,
        num_stages=stages,
        loss_fn=causal_lm_loss,
        partition_method=method,
        activation_checkpoint_interval=checkpoint_interval,
    )
