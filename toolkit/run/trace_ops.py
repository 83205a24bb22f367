"""How a trace watches a meta-device forward pass: which block runs, and what each of its ops does.

`record_forward` runs one training-mode forward pass with labels and files under the running block (a
forward pre-hook on each decoder layer sets it):
- every GEMM (`aten.mm`, `addmm`, `bmm`, `baddbmm`, `_grouped_mm`): against a weight — an operand whose
  storage is a parameter's — it is a linear map (k × n, its rows, the expert groups of a 3-D weight);
  between activations, either eager attention (QKᵀ has the sequence as its width, the weighted sum after it
  has it as its depth) or some other product (a scan, a linear attention), whose FLOPs are kept apart;
- every other op that launches a kernel (views excluded): the bytes it reads and writes, and its FLOPs where
  `torch.utils.flop_counter` has a formula;
- every tensor autograd saves (`saved_tensors_hooks`), once per storage, parameters excluded.

SDPA is replaced by `FusedAttention`, an autograd function that computes nothing on meta tensors but saves
what the fused kernels save (q, k, v, the output and an fp32 log-sum-exp): on the meta device torch would
otherwise run the math path and store the scores, which no real run does. Two data-dependent shortcuts of
transformers are answered as the meta device cannot: there is one sequence per row (no packing), and a meta
tensor is a value-less tensor like a FakeTensor (`is_tracing`), so the library skips checks on its values.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from toolkit.plan.traced import TracedAttention

_GEMMS = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "grouped_mm")
_NOT_KERNELS = ("detach", "alias", "lift_fresh", "_unsafe_view")


@dataclass
class Gemm:
    """One GEMM against a weight."""

    k: int
    n: int
    rows: int
    experts: int
    bias: bool


@dataclass
class Block:
    """What one block did in one forward pass."""

    gemms: list[Gemm] = field(default_factory=list)
    cores: list[TracedAttention] = field(default_factory=list)
    other_flops: float = 0.0
    elementwise_bytes: float = 0.0
    kernels: int = 0
    saved_bytes: int = 0
    pending_scores: list[tuple[int, int]] = field(default_factory=list)
    """Eager attention: (heads, qk width) of score products waiting for their weighted sums."""


class Recorder:
    """One forward pass at `seq` tokens, block by block (`None`: outside the blocks)."""

    def __init__(self, params: set[int], seq: int, windows: list[int | None]) -> None:
        self.params = params
        self.seq = seq
        self.windows = windows
        self.current: int | None = None
        self.blocks: dict[int | None, Block] = defaultdict(Block)
        self.total_flops = 0.0
        self._seen: set[int] = set()
        self._keep: list[Any] = []  # saved tensors stay alive, so no storage address is reused

    @property
    def block(self) -> Block:
        return self.blocks[self.current]

    def window(self) -> int | None:
        return self.windows[self.current] if isinstance(self.current, int) else None

    def pack(self, t: Any) -> Any:
        storage = t.untyped_storage()
        sid = storage._cdata
        if sid not in self.params and sid not in self._seen:
            self._seen.add(sid)
            self._keep.append(t)
            self.block.saved_bytes += storage.nbytes()
        return t

    def is_param(self, x: Any) -> bool:
        import torch

        return isinstance(x, torch.Tensor) and x.untyped_storage()._cdata in self.params

    def flops(self, n: float) -> float:
        self.total_flops += n
        return n


def config_int(cfg: Any, *keys: str) -> int | None:
    for key in keys:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _nbytes(x: Any) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0


def _dispatch_mode(rec: Recorder) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func.overloadpacket.__name__
            if getattr(func, "is_view", False) or name in _NOT_KERNELS:
                return out
            rec.block.kernels += 1
            if name in _GEMMS:
                _gemm(rec, name, args, out)
            else:
                rec.block.elementwise_bytes += _nbytes(args) + _nbytes(out)
                rec.block.other_flops += rec.flops(_registered_flops(flop_registry, func, args, kwargs, out))
            return out

    return Mode()


def _registered_flops(registry: Any, func: Any, args: Any, kwargs: Any, out: Any) -> float:
    """FLOPs of an op torch's flop counter has a formula for (0 for the others: elementwise ops)."""
    formula = registry.get(func) or registry.get(func.overloadpacket)
    if formula is None:
        return 0.0
    import torch
    from torch.utils._pytree import tree_map

    def shape(x: Any) -> Any:
        return x.shape if isinstance(x, torch.Tensor) else x

    try:
        return float(
            formula(*tree_map(shape, args), **tree_map(shape, kwargs), out_shape=tree_map(shape, out))
        )
    except Exception:  # a formula that cannot read these arguments counts nothing
        return 0.0


def _gemm(rec: Recorder, name: str, args: Any, out: Any) -> None:
    """File one GEMM: against a weight (a linear map) or between activations (attention, a scan)."""
    block = rec.block
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    k, n, rows = a.shape[-1], b.shape[-1], math.prod(a.shape[:-1])
    grouped = name in ("_grouped_mm", "grouped_mm")
    flops = rec.flops(2.0 * rows * k * n if grouped else 2.0 * math.prod(out.shape) * k)
    if rec.is_param(b) or rec.is_param(a):
        bias = name in ("addmm", "baddbmm") and rec.is_param(args[0])
        block.gemms.append(Gemm(k=k, n=n, rows=rows, experts=b.shape[0] if b.dim() == 3 else 1, bias=bias))
    elif a.dim() >= 3 and n == rec.seq and a.shape[-2] == rec.seq:
        block.pending_scores.append((rows // rec.seq, k))  # QKᵀ, per head, one sequence
    elif a.dim() >= 3 and k == rec.seq and block.pending_scores:
        heads, qk = block.pending_scores.pop(0)
        block.cores.append(
            TracedAttention(
                heads=heads, kv_heads=heads, qk_head_dim=qk, v_head_dim=n, window=rec.window(), fused=False
            )
        )
    else:
        block.other_flops += flops


def _fused_attention(rec: Recorder) -> Any:
    """What stands in for SDPA: the fused kernels' saved tensors and FLOPs, nothing computed."""
    import torch

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = q.new_empty((*q.shape[:-1], v.shape[-1]))
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def sdpa(query, key, value, *args: Any, **kwargs: Any) -> Any:
        core = TracedAttention(
            heads=query.shape[-3],
            kv_heads=key.shape[-3],
            qk_head_dim=query.shape[-1],
            v_head_dim=value.shape[-1],
            window=rec.window(),
        )
        rec.block.cores.append(core)
        rec.flops(2.0 * math.prod(query.shape[:-1]) * key.shape[-2] * (query.shape[-1] + value.shape[-1]))
        return FusedAttention.apply(query, key, value)

    return sdpa


@contextlib.contextmanager
def _patched(rec: Recorder) -> Iterator[None]:
    import torch
    from transformers import masking_utils
    from transformers.utils import import_utils

    sdpa = torch.nn.functional.scaled_dot_product_attention
    packed = masking_utils.find_packed_sequence_indices
    fake = import_utils.is_fake_tensor
    torch.nn.functional.scaled_dot_product_attention = _fused_attention(rec)
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    import_utils.is_fake_tensor = lambda x: fake(x) or (isinstance(x, torch.Tensor) and x.is_meta)
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
        masking_utils.find_packed_sequence_indices = packed
        import_utils.is_fake_tensor = fake


def record_forward(
    model: Any, layers: Any, seq: int, params: set[int], windows: list[int | None]
) -> Recorder:
    """One training-mode forward pass with labels at `seq` tokens, recorded block by block."""
    import torch

    rec = Recorder(params, seq, windows)
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: setattr(rec, "current", i)))
        handles.append(layer.register_forward_hook(lambda m, a, o: setattr(rec, "current", None)))
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    try:
        hooks = torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t)
        with _patched(rec), hooks, _dispatch_mode(rec):  # the dispatch mode innermost: it sees every op
            model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return rec
