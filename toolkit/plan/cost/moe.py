"""Mixture-of-Experts layers as the runtimes run them: which tokens reach a rank's experts, what the routed
GEMMs are, and what dispatching them costs. Pure; no torch.

Tokens. A rank dispatches only its share of the micro-batch: with tensor parallelism both runtimes drop the
duplicate copies TP ranks hold — Megatron-Core because sequence parallelism leaves each TP rank m / tp tokens
(MoEAlltoAllTokenDispatcher), DeepSpeed explicitly (`drop_tokens` before the all-to-all, deepspeed/moe/
sharded_moe.py MOELayer.forward). HF's own sparse blocks without expert parallelism (dstk's DeepSpeed run path)
compute every token on every rank.

Groups. DeepSpeed keeps experts inside the data-parallel ranks: EP is a subgroup of DP, at stride tp·sp, and
every expert is whole. Megatron-Core folds them ("MoE Parallel Folding", Liu et al. 2025, arXiv:2504.14960;
megatron/core/parallel_state.py @ d98e8a64): the experts' own grid ETP × EP × EDP spans the same ranks as
attention's TP × CP × DP, ETP innermost (rank order tp-cp-ep-dp-pp), so EP is consecutive ranks at stride ETP
and may exceed DP. Each expert is split over ETP ranks (columns of the up projection, rows of the down one),
which all-gather their dispatched tokens before the experts and reduce-scatter the outputs after.

Rows. The busiest rank's experts compute rows = (m / tp) · top-k · capacity · imbalance · ETP, as one grouped GEMM
of its E / EP experts (TE's GroupedLinear; tile quantization per expert, wave quantization over all of them).
In dropless routing the slowest of the EP ranks sets the pace. Even a uniform router spreads R = tokens·k routed
rows over EP ranks binomially, and the expected largest of EP such loads is about R/EP + σ·√(2 ln EP) with
σ² = R·(1/EP)(1 − 1/EP) (the Gaussian maximum bound), i.e. `imbalance` = 1 + √(2 ln EP · (1 − 1/EP) · EP / R).
That is exactly the load of Megatron-Core's `--moe-router-force-load-balancing`, as NVIDIA's published
benchmarks run: it does not even out the counts, it replaces the router's logits with fresh normal draws per
rank (`RandomSTE`: `logits.clone().normal_()`, megatron/core/transformer/moe/moe_utils.py @ d98e8a64), i.e. a
uniform router. Under natural routing it is a lower bound: a trained router prefers some experts.

Dispatch. Each MoE block moves every routed copy to its expert and back: forward a dispatch and a combine,
backward their gradients — 4 all-to-alls of rows·h elements, 6 when full recomputation reruns the forward.
- `alltoall` (NCCL's, both runtimes' default): each copy goes straight to its rank, the share for ranks in the
  same NVLink domain over NVLink, the rest over the rank's NIC (toolkit.plan.cost.comm.all_to_all_s).
- `allgather`: Megatron-Core's all-gather of the EP group's tokens then a reduce-scatter of the outputs, every
  token to every rank: (EP − 1)/EP · EP·m/tp·h per call.
- `deepep` / `hybridep` (Megatron-Core's flex dispatcher: DeepEP, github.com/deepseek-ai/DeepEP, and NVIDIA's
  HybridEP): a token bound for several experts in another NVLink domain crosses the network once per domain and
  is fanned out over NVLink there, so the NIC carries tokens × (distinct domains per token) rows instead of
  tokens × top-k × (remote share) — DeepEP's published "RDMA bandwidth" counts the token's own domain among
  them, and is what the kernels sustain on that count. The rows move in the activations' dtype in every run,
  FP8 ones included: DeepEP can dispatch FP8 rows (its README), but Megatron-Core passes its bf16 hidden
  states (fused_a2a.py `FusedDispatch`) and HybridEP refuses FP8 ("HybridEP dispatcher does not support fp8
  dispatch now", `init_hybrid_ep_buffer` @ d98e8a64); TE quantizes inside GroupedLinear, after. Bandwidth:
  NVLink at the cluster's all-to-all figure for HybridEP (its kernel-only BF16 dispatch on B200 735 GB/s, on
  GB200 612-764 GB/s from 8 to 36 ranks) and at most DEEPEP_SMS × DEEPEP_GB_PER_S_PER_SM for DeepEP (153 GB/s
  on H800's ~160, 420-494 GB/s on B200; DeepEP docs/legacy.md and README_Hybrid-EP.md), the network at the NIC's
  rate (DeepEP 43-58 GB/s "RDMA bottleneck bandwidth" on 50 GB/s CX7).
Permutation (sorting tokens by expert and back) reads and writes each routed row once each way, forward and
backward; the router is an m/tp × h × E GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.plan.cost import comm
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ClusterSpec, ModelSpec

TE_COMPUTE_STREAMS = 4
"""Transformer Engine's compute streams for its multi-GEMM calls (ExpertPlacement.gemm_streams)."""
DEEPEP_SMS = 20
"""SMs DeepEP's normal (training) kernels run on: `Buffer.num_sms` by default (deep_ep/buffer.py @ 2be0d4f);
"only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink" on H800 (DeepSeek-V3 report
§3.2.2)."""
DEEPEP_GB_PER_S_PER_SM = 19.0
"""What one SM of DeepEP's normal kernels moves: on B200 at 24 SMs 494 GB/s dispatch and 420 GB/s combine
(NVIDIA's comparison in DeepEP's docs/README_Hybrid-EP.md @ 17cfb81, Torch API, BF16), 19 GB/s per SM — so 20 SMs
saturate H800's ~160 GB/s NVLink but not NVLink 5. HybridEP (TMA copies) reaches 735 GB/s on 16 SMs and is
priced at the domain's all-to-all bandwidth."""
HYBRIDEP_SMS = 16
"""SMs HybridEP's dispatch and combine kernels run on by default: NVIDIA's comparison (DeepEP
docs/README_Hybrid-EP.md @ 17cfb81) measures its 735 GB/s B200 dispatch on 16 SMs; Megatron-Core passes its own
count only when `--moe-hybridep-num-sms` is given (default None, megatron/training/arguments.py @ d98e8a64)."""


def dispatcher_sms(layout: Layout, cluster: ClusterSpec) -> int | None:
    """SMs the expert all-to-all holds while it runs beside compute: DeepEP's and HybridEP's kernels their own
    count (DEEPEP_SMS, HYBRIDEP_SMS), NCCL's all-to-all (and all-gather) one CTA per channel as any NCCL
    collective (`collective_sm_count`; None where the preset does not say)."""
    d = layout.moe_dispatcher or "alltoall"
    return {"deepep": DEEPEP_SMS, "hybridep": HYBRIDEP_SMS}.get(d, cluster.collective_sm_count)


DISPATCHES = {"forward": 2, "backward": 2}
"""All-to-alls per MoE block: dispatch and combine in forward, their gradients in backward."""


@dataclass(frozen=True)
class ExpertPlacement:
    """Where a layout's routed experts run and which tokens reach them (module docstring)."""

    ep: int = 1
    etp: int = 1
    token_split: int = 1
    """TP ranks that share a micro-batch's tokens before dispatch: each dispatches 1/token_split of them."""
    imbalance: float = 1.0
    """The busiest EP rank's routed rows over the even share."""
    folded: bool = False
    """Megatron-Core's expert grid (EP at stride ETP over TP × CP × DP); DeepSpeed's EP is inside DP."""
    dispatcher: str = "alltoall"

    @property
    def gemm_streams(self) -> int | None:
        """Local experts' GEMMs in flight at once. Megatron-Core's (folded) experts are Transformer Engine's
        GroupedLinear, which issues one cuBLAS GEMM per expert round-robin over TE's compute streams
        (`nvte_multi_tensor_gemm` → `multi_stream_cublas_gemm`, cublaslt_gemm.cu; `num_compute_streams = 4`,
        util/multi_stream.cpp @ d0067d0; CUTLASS's grouped GEMM only on Hopper, in bf16, behind
        NVTE_USE_CUTLASS_GROUPED_GEMM), so the tiles of at most 4 experts share the waves. None: one grouped
        kernel (torch._grouped_mm), every expert's tiles together."""
        return TE_COMPUTE_STREAMS if self.folded else None


def placement(model: ModelSpec, layout: Layout, hf_modules: bool = False) -> ExpertPlacement:
    """The layout's expert placement for `model` (ExpertPlacement() for a dense model)."""
    if not model.is_moe:
        return ExpertPlacement()
    split = 1 if hf_modules and layout.ep == 1 else layout.tp
    tokens = layout.micro_batch_size * model.seq_length / layout.sp / split
    return ExpertPlacement(
        ep=layout.ep,
        etp=layout.etp or 1,
        token_split=split,
        imbalance=imbalance(model, layout.ep, tokens),
        folded=layout.etp is not None,
        dispatcher=layout.moe_dispatcher or "alltoall",
    )


def imbalance(model: ModelSpec, ep: int, tokens: float) -> float:
    """The busiest of `ep` ranks' routed rows over the even share, for `tokens` dispatched per rank (module
    docstring): a uniform router's spread under either routing (`balanced` is Megatron-Core's random-logit
    router, `natural` priced at its lower bound); 1 without expert parallelism."""
    if ep <= 1 or tokens <= 0:
        return 1.0
    rows = tokens * model.moe_top_k * ep  # the EP group's routed rows, spread over ep ranks
    return 1.0 + math.sqrt(2 * math.log(ep) * (1 - 1 / ep) * ep / rows)


def routed_copies(model: ModelSpec, hf_dense: bool = False) -> float:
    """Copies of each token the experts compute: top-k, padded by the capacity factor — or all E where HF's
    block runs every expert (`hf_dense`: Llama 4's HF modules without expert parallelism; `hf_dense_experts`)."""
    if hf_dense and model.family.hf_dense_experts:
        return float(model.num_experts)
    return model.moe_top_k * model.moe_capacity_factor


def dispatched_rows(model: ModelSpec, m: float, p: ExpertPlacement) -> float:
    """Routed copies a rank sends to the experts for `m` tokens (before any ETP gather)."""
    return m / p.token_split * routed_copies(model)


def expert_rows(model: ModelSpec, m: float, p: ExpertPlacement) -> float:
    """Rows the busiest rank's experts compute for `m` tokens: its dispatched share, the imbalance, and the ETP
    group's tokens gathered onto each of its ranks."""
    return dispatched_rows(model, m, p) * p.imbalance * p.etp


def ep_group(layout: Layout, cluster: ClusterSpec) -> comm.Group:
    """The expert-parallel group: consecutive ranks at stride ETP when folded, at stride tp·sp inside DP
    otherwise."""
    stride = (layout.etp or 1) if layout.etp is not None else layout.tp * layout.sp
    return comm.group(layout.ep, stride, cluster)


def _remote_domains(ep: int, per_domain: int, top_k: int) -> float:
    """Expected distinct other NVLink domains one token's top-k experts fall in, experts uniform over the EP
    group's ep / per_domain domains."""
    domains = max(1, math.ceil(ep / per_domain))
    if domains == 1:
        return 0.0
    return (domains - 1) * (1 - (1 - 1 / domains) ** top_k)


def _other_ranks_reached(experts: int, ranks: int, top_k: int) -> float:
    """Expected other EP ranks one token's top-k distinct experts fall on, experts spread evenly (experts /
    ranks each) and picked uniformly: each other rank is missed with probability C(E − E/r, k) / C(E, k)."""
    if ranks <= 1:
        return 0.0
    if experts < ranks or top_k <= 0:
        return top_k * (1 - 1 / ranks)  # fewer experts than ranks (replicas): one copy per routed row
    per_rank = experts / ranks
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, (experts - per_rank - i) / (experts - i))
    return (ranks - 1) * (1 - miss)


def dispatch_s(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, rows: float, e: float, tokens: float
) -> float:
    """One dispatch or combine of `rows` routed copies (`tokens` distinct tokens) of h elements of `e` bytes over
    the layout's EP group, by its dispatcher (module docstring)."""
    g = ep_group(layout, cluster)
    if g.size <= 1 or rows <= 0:
        return 0.0
    h = model.hidden_size
    dispatcher = layout.moe_dispatcher or "alltoall"
    if dispatcher == "alltoall":
        return comm.all_to_all_s(rows * h * e, g, cluster)
    if dispatcher == "allgather":
        return comm.all_gather_s(tokens * g.size * h * e, g, cluster)
    intra = comm.intra_bandwidth_gb_per_s(g, cluster, "all_to_all") * 1e9
    if dispatcher == "deepep":  # its copy kernels run on a fixed set of SMs, which bound it below NVLink 5
        intra = min(intra, DEEPEP_SMS * DEEPEP_GB_PER_S_PER_SM * 1e9)
    # DeepEP and HybridEP send a token once to each rank holding any of its experts (DeepEP's layout is
    # `is_token_in_rank`, one row per token and rank; the rank spreads it over its local experts itself, and
    # sums their outputs before the combine), where NCCL's all-to-all carries one row per routed copy
    copies = rows / (tokens * model.moe_top_k) if tokens > 0 else 1.0
    nvlink = (
        tokens * copies * _other_ranks_reached(model.num_experts, g.size, model.moe_top_k) * h * e / intra
    )
    remote = _remote_domains(g.size, g.per_node, model.moe_top_k)
    # DeepEP's "RDMA bottleneck bandwidth" counts a token once per distinct destination domain, its own
    # included, and runs at about the NIC's rate (43-58 GB/s on 50 GB/s CX7): price those bytes at it
    network = tokens * (remote + 1) * h * e / (cluster.inter_node_gb_per_s * 1e9) if remote else 0.0
    return max(nvlink, network) + comm.ring_latency_s(g, cluster)


def moe_comm_s(model: ModelSpec, cluster: ClusterSpec, layout: Layout, blocks: int, e: int) -> float:
    """The expert all-to-alls (and ETP gathers) of `blocks` MoE blocks for one micro-batch on one rank."""
    if blocks <= 0 or not model.is_moe:
        return 0.0
    p = placement(model, layout)
    m = layout.micro_batch_size * model.seq_length / layout.sp
    tokens = m / p.token_split
    rows = dispatched_rows(model, m, p) * p.imbalance
    reruns = 2 if layout.recompute == "full" else 0
    calls = DISPATCHES["forward"] + DISPATCHES["backward"] + reruns
    per_block = calls * dispatch_s(model, cluster, layout, rows, e, tokens)
    if p.etp > 1:
        etp = comm.group(p.etp, 1, cluster)
        gathered = rows * p.etp * model.hidden_size * e
        # all-gather before the experts and reduce-scatter after, each again in backward
        per_block += (2 + reruns // 2) * (
            comm.all_gather_s(gathered, etp, cluster) + comm.reduce_scatter_s(gathered, etp, cluster)
        )
    return blocks * per_block


def permute_bytes(model: ModelSpec, m: float, p: ExpertPlacement, e: int) -> float:
    """HBM bytes of sorting one block's routed copies by expert and back, forward: each row read and written
    once by the permutation and once by the unpermutation."""
    return 4 * dispatched_rows(model, m, p) * p.imbalance * model.hidden_size * e
