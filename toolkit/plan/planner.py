"""The planner: search the layouts a cluster admits, keep those that fit, pick the fastest, say why.

Pure: no torch, no trial runs. The search space is ZeRO stage × TP (divisors of gpus_per_node dividing the
heads) × PP (divisors of what is left, at most one block per stage) × EP (MoE) × Ulysses SP (long sequences)
× micro-batch (divisors of the per-rank batch) × recomputation × offload × ZeRO++. It stays small by:
- checking the named rules (:mod:`toolkit.plan.rules`) before estimating anything;
- estimating memory first (the cheap half of the cost model) and walking micro-batches upwards, stopping at
  the first that does not fit (memory grows with the micro-batch);
- trying offload only when nothing fits without it (offload adds a host or NVMe round trip to every step).
Layouts are ranked by predicted tokens/s; within `NEAR_TIE` of the best, the simplest wins
(:mod:`toolkit.plan.choice`, which also words the explanation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from toolkit.errors import UserError
from toolkit.plan import recipes
from toolkit.plan.checkpoint_interval import CheckpointPlan, checkpoint_lines
from toolkit.plan.choice import Candidate, counterfactuals, explain, pick
from toolkit.plan.cost.activations import runtime_flash_attention
from toolkit.plan.cost.estimate import (
    estimate,
    estimate_memory,
    host_fits,
    host_need,
    nvme_fits,
)
from toolkit.plan.cost.memory import GIB, Memory
from toolkit.plan.layout import Layout, LayoutRequest, data_parallel_size
from toolkit.plan.params import count_params
from toolkit.plan.query import RECOMPUTE, PlanQuery
from toolkit.plan.recomputation import early_stop_setting
from toolkit.plan.rules import broken_rules
from toolkit.plan.specs import ClusterSpec, ModelSpec
from toolkit.plan.units import format_bytes

LONG_SEQUENCE = 16_384
"""From this sequence length on, Ulysses sequence parallelism joins the search."""


@dataclass
class Plan:
    best: Candidate
    explanation: list[str]
    alternatives: list[Candidate]
    usable_bytes: float
    searched: int
    checkpoint: CheckpointPlan
    rule_rejections: dict[str, str] = field(default_factory=dict)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_global_batch(model: ModelSpec, world_size: int) -> int:
    """GPT-3's batch for the model size (Table 2.1), in sequences, rounded up to the world size times a power
    of two, so every data-parallel degree divides it and micro-batches can be powers of two."""
    target = recipes.batch_tokens(count_params(model).total) / model.seq_length
    return world_size * 2 ** max(0, math.ceil(math.log2(max(target / world_size, 1))))


def _offload_options(zero: int, cluster: ClusterSpec, allow: bool) -> list[tuple[str, str]]:
    if not allow or zero == 0:
        return [("none", "none")]
    if zero in (1, 2):
        return [("none", "none"), ("cpu", "none")]
    devices = ["cpu"] + (["nvme"] if cluster.nvme_gib > 0 else [])
    out = [("none", "none")] + [(d, "none") for d in devices] + [(d, p) for d in devices for p in devices]
    return out


class _Search:
    """One planner run: the enumeration and what it saw."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, query: PlanQuery, global_batch: int) -> None:
        self.model, self.cluster, self.query, self.global_batch = model, cluster, query, global_batch
        self.usable = (1 - query.margin) * cluster.gpu_memory_gib * GIB
        self.scopes = query.scopes
        self.fitting: list[Candidate] = []
        self.too_big: list[Candidate] = []
        self.rule_rejections: dict[str, str] = {}
        self.searched = 0
        self.closest_host: tuple[float, str] | None = None
        self.precisions = query.precisions(cluster)
        self.core = "megatron-core" in query.scopes
        self.margin_only: list[Candidate] = []
        """Layouts that fit the accelerator but not the safety margin, estimated (for the "Why" note)."""

    def shapes(self) -> list[tuple[int, int, int, int]]:
        """(tp, pp, sp, ep) combinations that tile the world size."""
        m, c, q = self.model, self.cluster, self.query
        world = c.world_size
        tps = q.options(
            "tp", [t for t in _divisors(c.gpus_per_node) if m.n_heads % t == 0 and m.n_kv_heads % t == 0]
        )
        out = []
        for tp in tps:
            if world % tp:
                continue
            for pp in q.options("pp", [p for p in _divisors(world // tp) if p <= m.n_layers]):
                if world % (tp * pp):
                    continue
                rest = world // (tp * pp)
                sps = [1]
                if m.seq_length >= LONG_SEQUENCE:
                    sps = [s for s in _divisors(rest) if (m.n_heads // tp) % s == 0 and m.seq_length % s == 0]
                for sp in q.options("sp", sps):
                    if rest % sp:
                        continue
                    dp = rest // sp
                    # Megatron-Core folds experts over TP × CP × DP; DeepSpeed keeps them inside DP
                    ranks = tp * sp * dp if self.core else dp
                    eps = [e for e in _divisors(math.gcd(m.num_experts, ranks))] if m.is_moe else [1]
                    out += [(tp, pp, sp, ep) for ep in q.options("ep", eps)]
        return out

    def moe_options(self, tp: int, sp: int, dp: int, ep: int, pp: int) -> list[dict[str, Any]]:
        """Megatron-Core's MoE knobs for one shape: ETP 1 or TP (where ETP × EP divides the stage's ranks),
        the dispatcher (NCCL's all-to-all or HybridEP) where EP > 1, and its overlaps as the recipes run them
        (`--comm-overlap`; EP A2A overlap without a pipeline, where Megatron-Core does not need VPP for it).
        One empty option for the other targets and dense models."""
        if not self.core:
            return [{}]
        common: dict[str, Any] = {"comm_overlap": True}
        if not self.model.is_moe:
            return [common]
        q, ranks = self.query, tp * sp * dp
        etps = q.options("etp", [e for e in dict.fromkeys((1, tp)) if ranks % (e * ep) == 0])
        # HybridEP differs from NCCL's all-to-all where the EP group spans NVLink domains (a token crosses the
        # network once per domain, FP8 forward); inside one domain both move the same rows at NVLink's rate
        spans = ep * min(etps) > self.cluster.nvlink_domain
        dispatchers = q.options("moe_dispatcher", ["alltoall", "hybridep"] if spans else ["alltoall"])
        overlap = ep > 1 and pp == 1
        return [
            {**common, "etp": e, "moe_dispatcher": d, "ep_comm_overlap": overlap and d != "allgather"}
            for e in etps
            for d in dispatchers
        ]

    def run(self, allow_offload: bool) -> None:
        # Megatron (no "deepspeed" scope) runs TP with sequence parallelism and a vocabulary-parallel
        # embedding (less memory at the same traffic, so always on) and fused kernels; HF modules in the
        # DeepSpeed engine run eager
        megatron = "deepspeed" not in self.scopes
        fused = megatron if self.query.fused_kernels is None else self.query.fused_kernels
        shapes = self.shapes()
        for precision in self.precisions:
            flash = runtime_flash_attention(self.model, self.query.flash_attention, fused, precision)
            if self.core and self.query.flash_attention is None:
                flash = True  # Transformer Engine's fused (cuDNN) attention, Megatron-Core's default backend
            for shape in shapes:
                self._run_shape(shape, precision, fused, flash, megatron, allow_offload)

    def _run_shape(
        self,
        shape: tuple[int, int, int, int],
        precision: str,
        fused: bool,
        flash: bool,
        megatron: bool,
        allow_offload: bool,
    ) -> None:
        c, q = self.cluster, self.query
        tp, pp, sp, ep = shape
        dp = data_parallel_size(c.world_size, tp, pp, sp)
        if self.global_batch % dp:
            return
        per_rank = self.global_batch // dp
        # every divisor, not only powers of two: a global batch of 504 on 8 ranks (63 per rank) has none
        # but 1, and experts' micro-batch 3 ran faster than anything a power-of-two search can offer
        # a pinned micro-batch must divide the per-rank batch too, or the accumulation steps would round down
        # and the config would say one global batch and train another
        micros = [m for m in q.options("micro_batch_size", _divisors(per_rank)) if per_rank % m == 0]
        if not micros:
            return
        zeros = [0, 1] if pp > 1 or self.core else [0, 1, 2, 3]
        for zero, moe in (
            (z, o) for z in q.options("zero_stage", zeros) for o in self.moe_options(tp, sp, dp, ep, pp)
        ):
            for off_opt, off_param in _offload_options(zero, c, allow_offload):
                if q.offload_optimizer not in (None, off_opt) or q.offload_param not in (None, off_param):
                    continue
                zeropps = [False, True] if zero == 3 and c.nodes > 1 and c.accelerator == "cuda" else [False]
                for zeropp in q.options("zeropp", zeropps):
                    for recompute, act_off in self._recompute_options(allow_offload):
                        megatron_tp = tp > 1 and megatron
                        base = dict(
                            tp_sequence_parallel=_pinned(q.tp_sequence_parallel, megatron_tp),
                            tp_vocab_parallel=_pinned(q.tp_vocab_parallel, megatron_tp),
                            zero_stage=zero,
                            tp=tp,
                            pp=pp,
                            sp=sp,
                            ep=ep,
                            recompute=recompute,
                            recompute_early_stop=early_stop_setting(
                                q.recompute_early_stop, recompute, megatron
                            ),
                            offload_optimizer=off_opt,
                            offload_param=off_param,
                            offload_activations=act_off,
                            precision=precision,
                            optimizer=q.optimizer or "adamw",
                            lora=q.lora,
                            zeropp=zeropp,
                            fused_kernels=fused,
                            flash_attention=flash,
                            **moe,
                        )
                        # Megatron-Core refuses its EP A2A overlap with full recomputation
                        base["ep_comm_overlap"] = bool(moe.get("ep_comm_overlap")) and recompute != "full"
                        self._walk_micro(base, dp, micros)

    def _misfit(self, mem: Memory) -> str | None:
        """Why a layout does not fit (None when it does): the accelerator, the host or the NVMe. A layout the
        GPUs hold but the host does not is remembered, smallest host need first, for the refusal message."""
        if mem.total > self.usable:
            return f"does not fit: needs {format_bytes(mem.total, 1)} > {format_bytes(self.usable, 1)} usable"
        if not host_fits(mem, self.cluster):
            why = f"does not fit in host memory: {host_need(mem, self.cluster)}"
            if self.closest_host is None or mem.cpu_per_node < self.closest_host[0]:
                self.closest_host = (mem.cpu_per_node, why)
            return why
        if not nvme_fits(mem, self.cluster):
            return (
                f"does not fit on NVMe: {format_bytes(mem.nvme_per_node, 1)} per node > "
                f"{format_bytes(self.cluster.nvme_gib * GIB, 1)}"
            )
        return None

    def _recompute_options(self, allow_offload: bool) -> list[tuple[str, bool]]:
        """(recompute, offload_activations) pairs: the checkpointed inputs of full recomputation go to host
        memory only in the offload pass (ZeRO-Infinity's last resort), or where the query pins it."""
        q = self.query
        out = []
        for recompute in q.options("recompute", list(RECOMPUTE)):
            offloads = [False, True] if allow_offload and recompute == "full" else [False]
            out += [(recompute, a) for a in q.options("offload_activations", offloads)]
        return out

    def _walk_micro(self, base: dict[str, Any], dp: int, micros: list[int]) -> None:
        request = LayoutRequest(micro_batch_size=micros[0], global_batch_size=self.global_batch, **base)
        broken = broken_rules(self.model, self.cluster, request, dp, self.scopes)
        if broken:
            for name, msg in broken:
                self.rule_rejections.setdefault(name, msg)
            return
        for micro in micros:
            layout = Layout(
                **{**base, "micro_batch_size": micro},
                dp=dp,
                world_size=self.cluster.world_size,
                global_batch_size=self.global_batch,
                gradient_accumulation_steps=self.global_batch // (micro * dp),
            )
            self.searched += 1
            mem = estimate_memory(self.model, self.cluster, layout)
            why = self._misfit(mem)
            if why:
                self.too_big.append(Candidate(layout, None, mem.total, why))
                c = self.cluster
                inside = mem.total <= c.gpu_memory_gib * GIB and host_fits(mem, c) and nvme_fits(mem, c)
                if inside and mem.total > self.usable:  # dropped by the safety margin alone
                    self.margin_only.append(
                        Candidate(layout, estimate(self.model, c, layout), mem.total, why)
                    )
                break
            est = estimate(self.model, self.cluster, layout)
            self.fitting.append(Candidate(layout, est, mem.total))


def _pinned(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def plan(model: ModelSpec, cluster: ClusterSpec, query: PlanQuery | None = None) -> Plan | None:
    """The best fitting layout with its explanation, or None when nothing fits even with offload."""
    query = query or PlanQuery()
    batch = query.global_batch_size or default_global_batch(model, cluster.world_size)
    search = _Search(model, cluster, query, batch)
    search.run(allow_offload=False)
    if not search.fitting:
        search.run(allow_offload=True)
    if not search.fitting:
        return None
    best = pick(search.fitting)
    alternatives = counterfactuals(best, search)
    assert best.estimate is not None
    ckpt = best.estimate.checkpoint_plan()
    explanation = explain(best, alternatives, search)
    explanation[3:3] = checkpoint_lines(ckpt, cluster)
    return Plan(
        best=best,
        explanation=explanation,
        alternatives=[a for _, a in alternatives],
        usable_bytes=search.usable,
        searched=search.searched,
        checkpoint=ckpt,
        rule_rejections=search.rule_rejections,
    )


def fits_anywhere(model: ModelSpec, cluster: ClusterSpec, query: PlanQuery) -> bool:
    return plan(model, cluster, query) is not None


def smallest_fitting_nodes(
    model: ModelSpec, cluster: ClusterSpec, query: PlanQuery, limit: int = 1 << 14
) -> int | None:
    """The node count n at which a layout fits while none fits on n - 1 (doubling, then bisection)."""

    def fits(n: int) -> bool:
        return fits_anywhere(model, cluster.model_copy(update={"nodes": n, "hostnames": None}), query)

    lo, hi = cluster.nodes, cluster.nodes * 2
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def nothing_fits_message(model: ModelSpec, cluster: ClusterSpec, query: PlanQuery) -> UserError:
    """Why `plan` returned None: the rules, when they exclude every layout the constraints leave (more nodes
    would not help), else the smallest cluster that would do and whether offload would."""
    search = _Search(
        model, cluster, query, query.global_batch_size or default_global_batch(model, cluster.world_size)
    )
    search.run(allow_offload=True)
    if search.searched == 0 and search.rule_rejections:
        from toolkit.plan.rules import RULES

        deepspeed_only = {r.name for r in RULES if r.scope == "deepspeed"}
        reasons = "; ".join(f"{name}: {msg}" for name, msg in sorted(search.rule_rejections.items()))
        hint = (
            " (rules of the DeepSpeed engine with HF models; --target megatron lifts them)"
            if set(search.rule_rejections) <= deepspeed_only and "deepspeed" in query.scopes
            else ""
        )
        return UserError(
            f"no layout of {model.name} meets the rules under these constraints{hint}: {reasons}"
        )
    if search.searched == 0 and not search.rule_rejections:
        micro = f" into micro-batches of {query.micro_batch_size}" if query.micro_batch_size else ""
        return UserError(
            f"--global-batch: {search.global_batch} cannot be split{micro} on {cluster.world_size} GPUs: it "
            "must be micro-batch × accumulation steps × the data-parallel degree of some layout; "
            f"give a multiple of {cluster.world_size * (query.micro_batch_size or 1)}, or another --micro-batch"
        )
    what = f"{model.name} does not fit on {cluster.nodes} × {cluster.name} ({cluster.world_size} GPUs of {cluster.gpu_memory_gib:g} GiB)"
    nodes = smallest_fitting_nodes(model, cluster, query)
    hints = []
    if nodes is not None:
        hints.append(
            f"the smallest cluster that fits is --nodes {nodes} ({nodes * cluster.gpus_per_node} GPUs)"
        )
    relaxed = query.relaxed_offload()
    if relaxed != query and fits_anywhere(model, cluster, relaxed):
        hints.append(
            "or drop the --offload-* constraints: ZeRO-Offload/Infinity makes it fit on this cluster"
        )
    if not hints:
        hints.append(f"even {1 << 14} nodes are not enough with these constraints")
    if search.closest_host is not None:
        hints.append(f"the GPUs would hold the closest layout, but it {search.closest_host[1]}")
    tried = "even with offload" if query.offload_allowed else "without offload"
    return UserError(f"{what} {tried}; " + "; ".join(hints))
