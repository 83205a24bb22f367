"""A model described by what transformers builds: the traced description the cost model reads.

For an HF `config.json` whose `model_type` has no entry in `plan/architectures.py`'s table, the run half
(`toolkit/run/trace.py`) builds the model with `AutoModelForCausalLM.from_config` on the meta device — no
memory, no weights — runs one forward pass at two sequence lengths and reads off what the cost model needs:
every parameter (tied weights once), each block's linear maps and which tokens pass through them (all, the
top-k routed ones, a shared expert's), its attention cores, the bytes autograd saves per token, the traffic
of its memory-bound ops and their count, and its FLOPs. The result is a `TracedModel`, written as JSON into
the cache under the hash of the config (and transformers' version, whose modules it reflects); every later
`estimate`/`plan` of the same config reads it here without importing torch.

A traced model becomes a `ModelSpec` like any other (`architecture: traced`, its shape fields filled from the
trace) that carries the trace itself: the cost model's few model-specific terms — parameters by component,
linear layers, attention cores, saved activations, elementwise traffic — read it where it is present, and the
family table's formulas otherwise. The table is the fast path and a check on the trace
(tests/test_traced.py holds them together), never a gate.

Blocks are grouped into two kinds, `dense` and `moe` (a block with routed experts), with per-block figures
averaged over the blocks of each kind: a hybrid's attention and Mamba blocks of one kind share one average,
exact over the whole model, approximate for a pipeline stage holding an unrepresentative slice (pipelines
are refused for traced models anyway).

Standard library, pydantic and PyYAML only: `dstk plan` imports this.
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolkit.plan.cache import cache_dir

TRACE_SCHEMA = 1
"""Bumped whenever the tracer records something new or differently: older cache entries are traced again."""

TRACE_SEQ_LENGTHS = (136, 272)
"""The two sequence lengths of the trace's forward passes (sizes no head or model width takes, so eager
attention's products are told from other GEMMs by their shapes): saved bytes that grow with the square of the
length (materialized attention scores) are told apart from those that grow linearly by the difference."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class TracedLinear(BaseModel):
    """One GEMM against a weight, as it ran in a block's forward (per block of its kind, on average)."""

    model_config = _FROZEN

    k: int
    """Input width."""
    n: int
    """Output width."""
    tokens: float
    """Rows per token of the block's input: 1 for every token, top-k for the routed experts' grouped GEMM
    (each token's k copies), 1 for a shared expert."""
    experts: int = 1
    """Weight groups behind the GEMM: E for a grouped expert GEMM, 1 for a plain linear layer."""
    bias: bool = False
    count: float = 1.0
    """How many times per block of its kind (an average where the kind's blocks differ)."""


class TracedAttention(BaseModel):
    """One attention core (the scores and the weighted sum, between activations) of a block's forward."""

    model_config = _FROZEN

    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    window: int | None = None
    """Keys a query sees in a local layer (sliding window, attention chunk); None: the whole sequence."""
    fused: bool = True
    """SDPA's fused kernel (the scores never stored); False: eager attention materializing them."""
    count: float = 1.0


class TracedKind(BaseModel):
    """The blocks of one kind (dense or MoE): their parameters, and per block their forward's figures."""

    model_config = _FROZEN

    blocks: int
    params: int
    """All parameters of the kind's blocks together (exact)."""
    expert_params: int = 0
    """Parameters of the kind's routed experts together (exact), part of `params`."""
    router_params: int = 0
    """Parameters of the kind's routers (their h × E matrices and biases) together, part of `params`."""
    small_params: int = 0
    """Parameters of one-dimensional tensors (norms, biases, sinks) together: what ZeRO-3 keeps gathered."""
    param_modules: float = 0.0
    """Modules that own parameters, per block: one ZeRO-3 gather each."""
    largest_tensor: int = 0
    """Largest tensor outside the routed experts: what ZeRO-3 gathers at once."""
    largest_expert_tensor: int = 0
    """Largest routed-expert tensor (a fused E × n × k weight)."""
    linears: tuple[TracedLinear, ...] = ()
    attention: tuple[TracedAttention, ...] = ()
    other_flops_per_token: float = 0.0
    """Forward FLOPs per token and block of products between activations outside attention (a state-space
    scan's or a linear attention's chunked products, run as PyTorch's reference path)."""
    saved_bytes_per_token: float = 0.0
    """Bytes autograd keeps per token and block, the part that grows linearly with the sequence (bf16)."""
    saved_bytes_per_token_per_key: float = 0.0
    """... and per token and key: materialized attention scores, which grow with the sequence's square."""
    elementwise_bytes_per_token: float = 0.0
    """Bytes the block's memory-bound forward ops (norms, activations, residuals, rotary, casts, copies) read
    and write per token (bf16)."""
    kernels: float = 0.0
    """Forward ops per block that launch a kernel (views excluded)."""
    num_experts: int = 0
    top_k: int = 0

    @property
    def expert(self) -> float:
        """Parameters of one routed expert."""
        return self.expert_params / (self.blocks * self.num_experts) if self.num_experts else 0.0


class TracedModel(BaseModel):
    """What `toolkit/run/trace.py` read off the meta-built HF model (see the module docstring)."""

    model_config = _FROZEN

    schema_version: int = TRACE_SCHEMA
    model_type: str
    transformers: str
    config_sha256: str
    hf_config: dict[str, Any]
    """The config as given: what the run path builds the model from again."""
    attn_implementation: str
    hidden_size: int
    vocab_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_position_embeddings: int | None = None
    layer_kinds: tuple[Literal["dense", "moe"], ...]
    kinds: dict[str, TracedKind]
    word_embedding: int
    position_embedding: int = 0
    embedding_other: int = 0
    """Parameters outside the blocks before them besides the tables (an embedding norm or projection)."""
    final_norm: int = 0
    """Parameters outside the blocks after them besides the LM head (the final norm, an output projection)."""
    lm_head: int = 0
    """0 when tied to the word embedding."""
    total_params: int
    active_params: int
    numels: tuple[int, ...]
    """Parameter tensor sizes in `model.parameters()` order (tied once): ZeRO-1/2's flat partition order."""
    forward_flops_per_token: float
    """FLOPs of the whole forward per token at `traced_seq_length` (torch's FlopCounterMode, with a grouped-GEMM
    formula registered): the check on the cost model's FLOPs."""
    traced_seq_length: int
    notes: tuple[str, ...] = ()
    """What the cost model approximates for this model, said once in the output."""
    trace_seconds: float = 0.0

    def __hash__(self) -> int:  # the config's hash names the trace (ModelSpec is hashed for lru_caches)
        return hash((self.config_sha256, self.transformers, self.schema_version))

    def kind(self, moe: bool) -> TracedKind:
        """The blocks of one kind; a model without that kind gets an empty one."""
        return self.kinds.get("moe" if moe else "dense") or TracedKind(blocks=0, params=0)

    @property
    def num_experts(self) -> int:
        return self.kind(True).num_experts

    @property
    def top_k(self) -> int:
        return self.kind(True).top_k or 1


def config_sha256(config: dict[str, Any]) -> str:
    """The hash a trace is cached under: the config's canonical JSON, minus keys that name but do not shape it."""
    shaped = {k: v for k, v in config.items() if k not in _NAMING_KEYS}
    return hashlib.sha256(json.dumps(shaped, sort_keys=True, default=str).encode()).hexdigest()


_NAMING_KEYS = ("_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype")


def transformers_version() -> str | None:
    """The installed transformers' version, read from its metadata without importing it (None: not installed)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def trace_path(config: dict[str, Any], version: str) -> Path:
    """Where the trace of `config` under transformers `version` is cached."""
    key = f"{config_sha256(config)[:24]}-tf{version}-s{TRACE_SCHEMA}"
    return cache_dir() / "models" / f"{config.get('model_type', 'model')}-{key}.json"


def read_trace(config: dict[str, Any]) -> TracedModel | None:
    """The cached trace of `config` under the installed transformers, or None when there is none (or it is
    from an older schema)."""
    version = transformers_version()
    if version is None:
        return None
    path = trace_path(config, version)
    if not path.is_file():
        return None
    try:
        return TracedModel.model_validate_json(path.read_text())
    except ValueError:
        return None  # a partly written or outdated entry is traced again


def write_trace(traced: TracedModel) -> Path:
    """Write `traced` into the cache atomically (a reader never sees half a file)."""
    path = trace_path(traced.hf_config, traced.transformers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(traced.model_dump_json())
    tmp.replace(path)
    return path


def spec_fields(traced: TracedModel, name: str) -> dict[str, Any]:
    """ModelSpec fields of a traced model: its shape as far as the fields go, and the trace beside them."""
    moe = traced.kind(True)
    default_seq = min(traced.max_position_embeddings or 4096, 4096)
    fields: dict[str, Any] = dict(
        name=name,
        architecture="traced",
        n_layers=traced.n_layers,
        hidden_size=traced.hidden_size,
        n_heads=traced.n_heads,
        n_kv_heads=traced.n_kv_heads,
        head_dim=traced.head_dim,
        vocab_size=traced.vocab_size,
        seq_length=default_seq,
        tied_embeddings=traced.lm_head == 0,
        position_embedding="learned" if traced.position_embedding else "rope",
        max_position_embeddings=max(traced.max_position_embeddings or default_seq, default_seq),
        trace=traced,
    )
    if moe.blocks and moe.num_experts >= 2:
        fields.update(num_experts=moe.num_experts, moe_top_k=max(1, min(moe.top_k, moe.num_experts)))
    return fields


class TraceNeeded(Exception):
    """An HF config dstk has no table entry for and no cached trace of: the caller traces it (run half)."""

    def __init__(self, config: dict[str, Any], source: str) -> None:
        super().__init__(f"{source}: model_type {config.get('model_type')!r} needs a trace")
        self.config = config
        self.source = source


TRACE_FIELD = Field(default=None, exclude=True, repr=False)
"""ModelSpec's `trace` field: left out of dumps (a description is re-read from its config, not a dump)."""
