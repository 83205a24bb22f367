"""The communication half of dstk's 1-bit optimizers: an error-compensated 1-bit all-reduce built only from
`torch.distributed` collectives (gloo and NCCL alike), its wire accounting, and `CompressedAdam`, the
optimizer base that owns the per-rank error-feedback state and does all of an optimizer's communication.

Why this exists: DeepSpeed 0.19.7 deleted its 1-bit optimizers together with the cupy/NCCL/MPI "compressed
backends" they called (DeepSpeed issue #8489). The scheme is the one those backends implemented
(`NcclBackend.compressed_allreduce`), from Tang et al. 2021, "1-bit Adam: Communication Efficient Large-Scale
Training with Adam's Convergence Speed" (ICML), Algorithm 1 and Section 4.2:

1. Worker side. Every rank adds its *worker error* to the (padded, flattened) tensor, splits it into
   `world_size` chunks and compresses each to its signs (1 bit each, packed 8 per byte) and fp32 scales.
   The worker error becomes what the compression lost (`x - decompress(compress(x))`).
2. All-to-all. Chunk `j` of every rank goes to rank `j` (its "server"), signs and scales in one message.
3. Server side. Rank `j` decompresses the `world_size` contributions to its chunk, averages them, adds its
   *server error*, compresses the average again and keeps the new server error.
4. All-gather of the server chunks; every rank decompresses the same bytes, so all get the same result.

Error feedback is what removes the bias of sign compression: every loss is fed into the next call, so the
sum of the results equals the sum of the true averages up to the current error buffers (Tang et al.
Theorem 1; Karimireddy et al. 2019, "Error Feedback Fixes SignSGD"). Scales: one per chunk by default, or
one per `scale_block` elements (4 bytes each) for tensors whose magnitude varies along their length.

Nothing here reads the environment; the process group is passed in (`None` = the default group).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # most significant bit first: numpy.packbits' bit order


@dataclass
class WireCounter:
    """Bytes this rank sends, counted at each collective call.

    The convention is the bandwidth-optimal algorithm NCCL and gloo use for large messages, for a group of
    `W` ranks: an all-reduce of `B` bytes sends `2(W-1)/W * B` (ring reduce-scatter then all-gather); an
    all-to-all of `B` bytes sends `(W-1)/W * B` (the rank's own slice stays put); an all-gather of a `B`-byte
    piece sends `(W-1) * B`. A group of one sends nothing.
    """

    bytes: float = 0.0
    calls: int = 0
    by_kind: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, nbytes: float) -> None:
        self.bytes += nbytes
        self.calls += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0.0) + nbytes

    def reset(self) -> None:
        self.bytes, self.calls, self.by_kind = 0.0, 0, {}


def ring_allreduce_bytes(numel: int, world_size: int, element_size: int) -> float:
    """What one rank sends in a ring all-reduce of `numel` elements: `2(W-1)/W * numel * element_size`."""
    return 2 * (world_size - 1) / world_size * numel * element_size


def compressed_allreduce_bytes(numel: int, world_size: int, scale_block: int | None = None) -> float:
    """What one rank sends in one `compressed_allreduce`: `W-1` chunks of sign bytes and scales to the
    other servers, then its own server chunk to the `W-1` others."""
    chunk = padded_numel(numel, world_size) // world_size
    return 2 * (world_size - 1) * (chunk // 8 + 4 * _n_blocks(chunk, scale_block))


def rank_and_world(group: dist.ProcessGroup | None = None) -> tuple[int, int]:
    """This process's rank and the group's size; `(0, 1)` when no process group exists."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def padded_numel(numel: int, world_size: int) -> int:
    """`numel` rounded up so that each of the `world_size` chunks is a whole number of sign bytes."""
    unit = 8 * world_size
    return -(-numel // unit) * unit


def error_buffers(
    numel: int, world_size: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed `(worker_error, server_error)` for a tensor of `numel` elements: the worker error covers the
    whole padded tensor, the server error the one chunk this rank serves."""
    padded = padded_numel(numel, world_size)
    return (
        torch.zeros(padded, dtype=torch.float32, device=device),
        torch.zeros(padded // world_size, dtype=torch.float32, device=device),
    )


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """The signs of `x` (flattened), 8 per uint8, most significant bit first (numpy.packbits' order).

    A set bit means `x >= 0`: zero counts as positive, as in DeepSpeed's `sign().add_(1).bool()`, because a
    sign code has no zero. The last byte is padded with set bits; `unpack_signs` needs `numel` to drop them.
    """
    bits = (x.reshape(-1) >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_ones(pad)])
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=x.device)
    return (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first `numel` signs stored by `pack_signs`, as `+1`/`-1` of `dtype`."""
    if numel > 8 * packed.numel():
        raise ValueError(
            f"numel: {numel} signs asked of {packed.numel()} bytes (at most {8 * packed.numel()})"
        )
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:numel].to(dtype).mul_(2).sub_(1)


def _n_blocks(chunk: int, block: int | None) -> int:
    return 1 if block is None else -(-chunk // block)


def _scales(rows: torch.Tensor, block: int | None) -> torch.Tensor:
    """`(k, n_blocks)` scales of a `(k, C)` fp32 tensor: `||b||_2 / sqrt(len(b))` for each block `b` of
    `block` elements (the last one shorter; `None`: the whole row). This is DeepSpeed's scale, which keeps
    each block's norm. The least-squares scale `||b||_1 / len(b)` looks better per call but is worse under
    error feedback: on a constant input its worker error grew like sqrt(calls) (1,500 after 2,000 calls on
    a 1,000-element N(0,1) tensor of norm 32) while the L2 scale's stayed at 120."""
    k, c = rows.shape
    nb = _n_blocks(c, block)
    size = c if block is None else block
    blocks = torch.nn.functional.pad(rows, (0, nb * size - c)).view(k, nb, size)
    counts = torch.full((nb,), float(size), device=rows.device)
    counts[-1] = c - (nb - 1) * size
    return torch.linalg.vector_norm(blocks, dim=2) / counts.sqrt()


def _expand(scales: torch.Tensor, chunk: int, block: int | None) -> torch.Tensor:
    """`(k, n_blocks)` scales repeated over their blocks: `(k, chunk)`."""
    return scales.repeat_interleave(chunk if block is None else block, dim=1)[:, :chunk]


def _compress_rows(rows: torch.Tensor, block: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(payload, decompressed)` of a `(k, C)` fp32 tensor, `C % 8 == 0`: each payload row is the row's
    `C/8` sign bytes followed by its fp32 scales' bytes, so one collective carries both."""
    k, c = rows.shape
    scales = _scales(rows, block)
    signs = torch.where(rows >= 0, 1.0, -1.0)
    payload = torch.cat([pack_signs(rows).view(k, c // 8), scales.view(torch.uint8)], dim=1)
    return payload, signs.mul_(_expand(scales, c, block))


def _decompress_rows(payload: torch.Tensor, chunk: int, block: int | None) -> torch.Tensor:
    """The `(k, chunk)` fp32 values a payload of `_compress_rows` stands for."""
    k = payload.shape[0]
    signs = unpack_signs(payload[:, : chunk // 8].reshape(-1), k * chunk).view(k, chunk)
    # reshape + clone: a fresh 1-D buffer at offset 0, which a uint8 -> fp32 view needs
    scales = payload[:, chunk // 8 :].reshape(-1).clone().view(torch.float32).view(k, -1)
    return signs.mul_(_expand(scales, chunk, block))


def _all_gather(out: torch.Tensor, piece: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    # torch 2.13 renamed all_gather_into_tensor to all_gather_single; older torch (the GPU machine) has
    # only the former.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, piece, group=group)


def compressed_allreduce(
    buffer: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    counter: WireCounter | None = None,
    scale_block: int | None = None,
) -> torch.Tensor:
    """The average of `buffer` over the group, each rank's contribution sent as 1 bit per element.

    `worker_error` (`padded_numel(buffer.numel(), W)` fp32) and `server_error` (`1/W` of that) carry what
    compression lost from one call to the next and are updated in place (`error_buffers` makes them). The
    result has `buffer`'s shape and dtype and is identical on every rank; `buffer` is not modified. With a
    group of one nothing is sent but the compression and its error feedback still apply. `scale_block`:
    elements per fp32 scale (`None`: one per chunk). Bytes sent: `compressed_allreduce_bytes`.
    """
    _, world = rank_and_world(group)
    numel, padded = buffer.numel(), worker_error.numel()
    if padded != padded_numel(numel, world):
        raise ValueError(
            f"worker_error: {padded} elements, expected padded_numel({numel}, {world}) = "
            f"{padded_numel(numel, world)}"
        )
    chunk = padded // world
    if server_error.numel() != chunk:
        raise ValueError(
            f"server_error: {server_error.numel()} elements, expected {padded} / {world} = {chunk}"
        )

    # Worker: compensate, compress every destination chunk, keep what was lost.
    x = worker_error.new_zeros(padded)
    x[:numel] = buffer.reshape(-1)
    x.add_(worker_error)
    payload, sent = _compress_rows(x.view(world, chunk), scale_block)
    torch.sub(x, sent.view(-1), out=worker_error)

    # All-to-all: rank j receives every rank's chunk j.
    received = torch.empty_like(payload)
    if world > 1:
        dist.all_to_all_single(received, payload, group=group)
        if counter is not None:
            counter.add("all_to_all", (world - 1) * payload[0].numel())
    else:
        received = payload

    # Server: average the contributions, compensate, compress again.
    average = _decompress_rows(received, chunk, scale_block).mean(dim=0).add_(server_error)
    piece, kept = _compress_rows(average.view(1, chunk), scale_block)
    torch.sub(average, kept.view(-1), out=server_error)

    # All-gather the server chunks; every rank decompresses the same bytes.
    gathered = torch.empty(world * piece.numel(), dtype=torch.uint8, device=piece.device)
    if world > 1:
        _all_gather(gathered, piece.view(-1), group)  # gloo wants a flat output here
        gathered = gathered.view(world, -1)
        if counter is not None:
            counter.add("all_gather", (world - 1) * piece.numel())
    else:
        gathered = piece
    result = _decompress_rows(gathered, chunk, scale_block).view(-1)[:numel]
    return result.view(buffer.shape).to(buffer.dtype)


def allreduce_mean(
    flat: torch.Tensor, group: dist.ProcessGroup | None = None, counter: WireCounter | None = None
) -> torch.Tensor:
    """Average `flat` over the group in place with a plain all-reduce (the optimizers' warm-up traffic)."""
    _, world = rank_and_world(group)
    if world > 1:
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        if counter is not None:
            counter.add("all_reduce", ring_allreduce_bytes(flat.numel(), world, flat.element_size()))
    return flat


Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


class CompressedAdam(torch.optim.Optimizer):
    """What 1-bit Adam and 0/1 Adam share: flat per-group buffers, the AdamW update, error feedback.

    Group-level state (step counters, the flat `worker_error` / `server_error`) lives in the state of the
    group's first trainable parameter, so `state_dict()` carries it and `load_state_dict()` moves it to the
    parameter's device like any moment. Parameters with `requires_grad=False` are skipped; a trainable
    parameter without a gradient counts as a zero gradient, because every rank must send the same layout.
    """

    def __init__(
        self,
        params: Params,
        defaults: dict[str, Any],
        group: dist.ProcessGroup | None,
        scale_block: int | None,
    ) -> None:
        if scale_block is not None and (scale_block < 8 or scale_block % 8):
            raise ValueError(f"scale_block: {scale_block}; must be a multiple of 8 (or None: one per chunk)")
        super().__init__(params, defaults)
        self.process_group = group
        self.scale_block = scale_block
        self.wire = WireCounter()
        """Bytes this rank sent in the optimizer's collectives (see `WireCounter` for the convention)."""
        self.model_copies: dict[int, torch.Tensor] = {}
        """id(our fp32 parameter) -> the model's low-precision copy, when a mixed-precision wrapper keeps one."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = self._trainable(group)
            if params:
                gstate = self._group_state(params)
                gstate["step"] = gstate.get("step", 0) + 1
                self._group_step(group, params, gstate, gstate["step"])
        return loss

    def _group_step(self, group: dict, params: list[torch.Tensor], gstate: dict, step: int) -> None:
        raise NotImplementedError

    def only_initialization_step(self) -> bool:
        """True after exactly one step on all-zero gradients (a mixed-precision wrapper's set-up call): one
        step taken and every momentum still exactly zero."""
        states = [self.state[p] for g in self.param_groups for p in self._trainable(g) if p in self.state]
        steps = {s["step"] for s in states if "step" in s}
        return steps == {1} and all(not s["exp_avg"].any() for s in states if "exp_avg" in s)

    # -- layout helpers -------------------------------------------------------------------------------------
    @staticmethod
    def _trainable(group: dict[str, Any]) -> list[torch.Tensor]:
        return [p for p in group["params"] if p.requires_grad]

    @staticmethod
    def _flat_grads(params: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )

    @staticmethod
    def _pieces(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
        return [
            piece.view_as(p) for piece, p in zip(flat.split([p.numel() for p in params]), params, strict=True)
        ]

    def _group_state(self, params: list[torch.Tensor]) -> dict[str, Any]:
        return self.state[params[0]]

    def _moments(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["exp_avg"], state["exp_avg_sq"]

    def _errors(
        self, gstate: dict[str, Any], params: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's error-feedback buffers, made (zeroed) on first use or when the world size changed."""
        rank, world = rank_and_world(self.process_group)
        numel = sum(p.numel() for p in params)
        if gstate.get("worker_error") is None or gstate["worker_error"].numel() != padded_numel(numel, world):
            gstate["worker_error"], gstate["server_error"] = error_buffers(numel, world, params[0].device)
        gstate["error_rank"] = rank
        return gstate["worker_error"], gstate["server_error"]

    def _compressed_mean(
        self, flat: torch.Tensor, gstate: dict[str, Any], params: list[torch.Tensor]
    ) -> torch.Tensor:
        worker_error, server_error = self._errors(gstate, params)
        return compressed_allreduce(
            flat, worker_error, server_error, self.process_group, self.wire, self.scale_block
        )

    @staticmethod
    def _denom(v: torch.Tensor, bias_correction2: float, eps: float) -> torch.Tensor:
        return (v.sqrt() / bias_correction2**0.5).add_(eps)

    @staticmethod
    def _adamw(
        p: torch.Tensor, m: torch.Tensor, denom: torch.Tensor, group: dict[str, Any], bc1: float
    ) -> None:
        """torch.optim.AdamW's update in its own operation order (decoupled decay first; Loshchilov & Hutter
        2019), so the warm-up is AdamW to the bit."""
        lr, wd = group["lr"], group["weight_decay"]
        if wd:
            p.mul_(1 - lr * wd)
        p.addcdiv_(m, denom, value=-lr / bc1)

    # -- checkpoints ----------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, except that error buffers another rank saved are dropped (and start again from zero).

        DeepSpeed at ZeRO stage 0 writes the optimizer state of data-parallel rank 0 only and every rank
        loads that file (engine.py `_save_checkpoint`: `if self.save_non_zero_checkpoint`); the error
        buffers are per rank, so rank 0's would be wrong elsewhere. `rank_state()` / `load_rank_state()`
        carry each rank's own for an exact restart.
        """
        super().load_state_dict(state_dict)
        rank, _ = rank_and_world(self.process_group)
        for group in self.param_groups:
            params = self._trainable(group)
            gstate = self._group_state(params) if params else {}
            if gstate.get("error_rank", rank) != rank:
                gstate["worker_error"] = gstate["server_error"] = None

    def _rank_tensors(self, params: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        """Per-parameter state that differs between ranks (none for 1-bit Adam: its momentum is averaged)."""
        return {}

    def rank_state(self) -> dict[str, Any]:
        """This rank's own state: the error-feedback buffers (and whatever `_rank_tensors` names), to be
        saved per rank beside the engine's checkpoint."""
        rank, world = rank_and_world(self.process_group)
        groups = []
        for group in self.param_groups:
            params = self._trainable(group)
            gstate = self._group_state(params) if params else {}
            entry = {k: gstate.get(k) for k in ("worker_error", "server_error")}
            entry.update({k: [t.detach().clone() for t in v] for k, v in self._rank_tensors(params).items()})
            groups.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in entry.items()})
        return {"rank": rank, "world_size": world, "groups": groups}

    @torch.no_grad()
    def load_rank_state(self, state: dict[str, Any]) -> None:
        """Restore what `rank_state()` saved on this same rank of a job of the same size."""
        rank, world = rank_and_world(self.process_group)
        if (state["rank"], state["world_size"]) != (rank, world):
            raise ValueError(
                f"rank_state: saved by rank {state['rank']} of {state['world_size']}, this is rank {rank} of {world}"
            )
        for group, saved in zip(self.param_groups, state["groups"], strict=True):
            params = self._trainable(group)
            if not params:
                continue
            gstate = self._group_state(params)
            for key in ("worker_error", "server_error"):
                gstate[key] = None if saved[key] is None else saved[key].to(params[0].device).clone()
            gstate["error_rank"] = rank
            for key, tensors in self._rank_tensors(params).items():
                for mine, theirs in zip(tensors, saved.get(key, tensors), strict=True):
                    mine.copy_(theirs)
            for p in params:
                if id(p) in self.model_copies:
                    self.model_copies[id(p)].data.copy_(p)
