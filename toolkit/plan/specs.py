"""Model and cluster descriptions: the two inputs to everything dstk does.

Both are frozen pydantic models with ``extra="forbid"``, so a typo in a user's YAML becomes
``cluster.yaml: gpus_per_nod: unknown field (did you mean gpus_per_node?)`` instead of a silent default.
Field names carry their units. Derived numbers (parameter counts, world size, peak FLOP/s for a precision)
are methods here, so no caller recomputes them.

Only the standard library, pydantic and PyYAML are imported: `dstk estimate` and `dstk plan` must start fast.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolkit.plan.architectures import ACTIVATIONS, ARCHITECTURES, FAMILIES, TRACED, ArchitectureFacts
from toolkit.plan.model_checks import check_shape, llama_ffn_hidden_size
from toolkit.plan.traced import TRACE_FIELD, TracedModel

# Exactly the families and activations of plan/architectures.py's tables, and `traced` (a model read off what
# transformers builds: toolkit/plan/traced.py): a new family is a table entry, or nothing at all, and
# pydantic's error for any other name lists the valid ones.
Architecture = Literal[tuple(FAMILIES)]  # type: ignore[valid-type]
Activation = Literal[tuple(ACTIVATIONS)]  # type: ignore[valid-type]
Accelerator = Literal["cuda", "cpu", "xpu", "hpu", "npu", "mps"]
Precision = Literal["bf16", "fp16", "fp32", "fp8", "mxfp8", "nvfp4"]
"""Training precision. `fp8` is bf16 training whose linear layers run their GEMMs in FP8 (Transformer Engine,
torchao.float8): weights, gradients, optimizer states and activations stay bf16 (toolkit/plan/cost/fp8.py);
`mxfp8` and `nvfp4` with Transformer Engine's block-scaled recipes of those names."""
LOW_PRECISION_GEMMS: tuple[str, ...] = ("fp8", "mxfp8", "nvfp4")

_STRICT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class ModelSpec(BaseModel):
    """A decoder-only transformer, dense or Mixture-of-Experts, described by its shape.

    Enough to count parameters exactly as the HF implementation does and to compute FLOPs and activations.
    """

    model_config = _STRICT

    name: str = "custom"
    """Label used in reports and file names."""
    architecture: Architecture = "gpt2"
    """HF architecture family; sets defaults for biases, norms, positions and gating."""
    n_layers: int = Field(gt=0)
    """Number of transformer blocks."""
    hidden_size: int = Field(gt=0)
    """Model width h."""
    n_heads: int = Field(gt=0)
    """Attention (query) heads a."""
    n_kv_heads: int | None = Field(default=None, gt=0)
    """Key/value heads for grouped-query attention (default: n_heads, i.e. multi-head attention)."""
    head_dim: int | None = Field(default=None, gt=0)
    """Per-head width (default: hidden_size / n_heads)."""
    ffn_hidden_size: int | None = Field(default=None, gt=0)
    """MLP inner width (default 4·h; gated MLPs default to Llama's 2/3·4h rounded up to 256)."""
    gated_mlp: bool | None = None
    """SwiGLU-style MLP with gate, up and down projections (default by architecture)."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size V."""
    seq_length: int = Field(gt=0)
    """Training sequence length s in tokens."""
    max_position_embeddings: int | None = Field(default=None, gt=0)
    """Rows of a learned position table (default: seq_length); ignored for rope/alibi."""
    position_embedding: Literal["learned", "rope", "alibi"] | None = None
    """How positions enter the model (default by architecture)."""
    tied_embeddings: bool | None = None
    """LM head shares the input embedding matrix (default true for GPT-style, false for Llama-style)."""
    attention_bias: bool | None = None
    """Biases on the q/k/v projections (default by architecture)."""
    attention_out_bias: bool | None = None
    """Bias on the attention output projection (default: attention_bias; Qwen2 has none)."""
    mlp_bias: bool | None = None
    """Biases in the MLP projections (default by architecture)."""
    norm: Literal["layernorm", "rmsnorm"] | None = None
    """LayerNorm (weight + bias) or RMSNorm (weight only) (default by architecture)."""
    embedding_norm: bool | None = None
    """A LayerNorm right after the word embeddings, as in BLOOM (default by architecture)."""
    activation: Activation | None = None
    """MLP activation (HF names): gelu (exact, or Megatron's fused), gelu_new (GPT-2's tanh approximation in
    eight elementwise ops, which keeps more activations), gelu_pytorch_tanh (the same approximation in one
    kernel: Gemma's GeGLU), silu (SwiGLU), relu."""
    dropout: bool | None = None
    """Dropout after attention, residuals and embeddings (GPT-2: yes; Llama, BLOOM: none); masks cost memory."""
    num_experts: int = Field(default=0, ge=0)
    """Experts per MoE layer; 0 means a dense model."""
    moe_top_k: int = Field(default=1, gt=0)
    """Experts each token is routed to."""
    moe_layer_interval: int = Field(default=1, gt=0)
    """Every k-th block is an MoE block (1 = all blocks)."""
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0)
    """Inner width of one expert's MLP (default: ffn_hidden_size)."""
    moe_capacity_factor: float = Field(default=1.0, gt=0)
    """Expert capacity as a multiple of the even share of tokens (DeepSpeed MoE's default is 1.0)."""
    moe_renormalize: bool = True
    """The top-k routing weights are renormalised to sum to 1 (Mixtral; Qwen2/3-MoE's `norm_topk_prob`,
    off by default there). No effect on sizes; it makes a model built from the spec route as the source."""
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0)
    """Inner width of an always-on shared expert beside the routed ones, with a sigmoid gate h → 1
    (Qwen2-MoE's `shared_expert_intermediate_size`); 0: none."""
    qk_norm: bool = False
    """RMSNorm over each head's query and key (Qwen3, Gemma 3): 2·head_dim weights per block (default by
    architecture)."""
    sliding_window: int | None = Field(default=None, gt=0)
    """Keys a local-attention layer sees (Gemma 3: 512 in the 1B, 1024 above); None: every layer attends to
    the whole sequence. Only families whose HF model has local layers accept it."""
    sliding_window_pattern: int = Field(default=1, ge=0)
    """With a sliding window, every k-th block attends globally and the others locally (Gemma 3: 6, i.e. five
    local layers to one global one; gpt-oss and Gemma 2: 2; Llama 4: 4, its chunked-attention layers around
    every fourth, global NoPE one); 0: every block local (Phi-3's sliding window)."""
    q_lora_rank: int | None = Field(default=None, gt=0)
    """Multi-head latent attention: the rank of the query's low-rank projection (DeepSeek-V3: 1536); None:
    queries through one full projection (DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = Field(default=None, gt=0)
    """Multi-head latent attention: the rank of the compressed key/value latent (DeepSeek-V3: 512). Set only for
    families with latent attention; q/k heads are then `head_dim` = nope + rope wide."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0)
    """Multi-head latent attention: the rotary part of each q/k head (DeepSeek-V3: 64 of 192), its key shared
    by all heads."""
    v_head_dim: int | None = Field(default=None, gt=0)
    """Width of each value head where it differs from the q/k heads' (DeepSeek-V3: 128 against 192)."""
    first_dense_layers: int = Field(default=0, ge=0)
    """Leading blocks with a dense MLP before the MoE blocks begin (DeepSeek-V3's `first_k_dense_replace`: 3;
    Kimi K2: 1)."""
    mtp_layers: int = Field(default=0, ge=0)
    """Multi-token-prediction modules after the last block (DeepSeek-V3: 1; Megatron's `--mtp-num-layers`): each a
    block, a 2h → h projection and two norms, sharing the embedding and LM head. HF builds none: priced by
    `dstk estimate` and written for Megatron-Core, refused by the DeepSpeed run path."""
    hf_config_json: str | None = Field(default=None, exclude=True, repr=False)
    """The HF `config.json` the description was read from (canonical JSON): the run path builds that model, with
    every key the file sets (rope scaling, routing groups, soft-capping), not the spec's round trip. Set by the
    loader, never written in a description file."""
    trace: TracedModel | None = TRACE_FIELD
    """For `architecture: traced`: what the meta-built HF model showed (toolkit/plan/traced.py); the cost model
    reads its parameters, linear layers, attention cores and saved activations instead of the table's
    formulas. Set by the loader from the trace cache, never written in a description file."""

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        """Resolve every `None` default from the architecture, so a loaded spec is fully explicit."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        # an unknown family falls back to GPT-2's defaults here; the Literal field then names the valid ones
        arch = FAMILIES.get(str(data.get("architecture", "gpt2")), ARCHITECTURES["gpt2"])
        for key, value in arch.defaults.items():
            data.setdefault(key, value)
        data.setdefault("attention_out_bias", data.get("attention_bias"))
        heads, hidden = data.get("n_heads"), data.get("hidden_size")
        data.setdefault("n_kv_heads", heads)
        if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and hidden % heads == 0:
            data.setdefault("head_dim", hidden // heads)
        if isinstance(hidden, int) and hidden > 0:
            gated = data.get("gated_mlp")
            data.setdefault("ffn_hidden_size", llama_ffn_hidden_size(hidden) if gated else 4 * hidden)
        data.setdefault("moe_ffn_hidden_size", data.get("ffn_hidden_size"))
        if arch.shared_expert_as_wide_as_experts and data.get("num_experts"):
            data.setdefault("shared_expert_ffn_hidden_size", data.get("moe_ffn_hidden_size"))
        data.setdefault("max_position_embeddings", data.get("seq_length"))
        return data

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        check_shape(self)
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def family_label(self) -> str:
        """The family's name in messages: the table's, or a traced model's own `model_type`."""
        return f"{self.trace.model_type} (traced)" if self.trace is not None else self.architecture

    @property
    def family(self) -> ArchitectureFacts:
        """What dstk knows about this model's architecture family (toolkit/plan/architectures.py); a traced
        model's attention implementation is the one its trace ran."""
        if self.trace is not None:
            return _traced_facts(self.trace.attn_implementation == "sdpa")
        return ARCHITECTURES[self.architecture]

    @property
    def n_local_layers(self) -> int:
        """Blocks that attend through the sliding window: all but every `sliding_window_pattern`-th (HF
        Gemma3TextConfig: layer i is global when (i + 1) % pattern == 0)."""
        if self.sliding_window is None:
            return 0
        if self.sliding_window_pattern == 0:
            return self.n_layers
        return self.n_layers - self.n_layers // self.sliding_window_pattern

    def moe_layer(self, j: int) -> bool:
        """Whether block j (from 0) has routed experts: every `moe_layer_interval`-th, counting from the first;
        for a traced model, the blocks where the trace saw them."""
        if self.trace is not None:
            return self.trace.layer_kinds[j] == "moe"
        return self.is_moe and j >= self.first_dense_layers and (j + 1) % self.moe_layer_interval == 0

    @property
    def n_moe_layers(self) -> int:
        """Blocks whose MLP is an MoE layer (`moe_layer`): every `moe_layer_interval`-th after the first dense ones."""
        if self.trace is not None:
            return self.trace.kind(True).blocks
        k, first = self.moe_layer_interval, min(self.first_dense_layers, self.n_layers)
        return self.n_layers // k - first // k if self.is_moe else 0  # multiples of k in (first, n_layers]

    @property
    def v_width(self) -> int:
        """Width of a value head (the q/k head's unless latent attention makes it narrower)."""
        return self.v_head_dim or self.head_dim


@functools.lru_cache(maxsize=2)
def _traced_facts(sdpa: bool) -> ArchitectureFacts:
    return dataclasses.replace(TRACED, sdpa=sdpa)


DEFAULT_AUX_LOSS_COEF = 0.01
"""MoE router load-balancing loss weight: Switch Transformer's α (Fedus et al. 2022, §2.2); Mixtral's
router_aux_loss_coef is 0.02. The run half's DeepSpeed-MoE layers and the Megatron arguments both use it."""

CollectiveName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "reduce"]


class ClusterSpec(BaseModel):
    """A homogeneous cluster: identical nodes, each with identical accelerators.

    Bandwidths are per GPU, unidirectional, in GB/s (1e9 bytes); memories in GiB (2**30 bytes) as tools
    report them. Fields after `hostnames` have defaults so a file that gives only the first group loads.
    """

    model_config = _STRICT

    name: str = "custom"
    """Label used in reports."""
    nodes: int = Field(gt=0)
    """Number of nodes."""
    gpus_per_node: int = Field(gt=0)
    """Accelerators (or CPU ranks) per node."""
    accelerator: Accelerator = "cuda"
    """DeepSpeed accelerator name."""
    gpu_memory_gib: float = Field(gt=0)
    """Usable memory per accelerator (for `cpu`: host memory available to one rank)."""
    gpu_peak_tflops: float = Field(gt=0)
    """Dense bf16/fp16 peak per accelerator, TFLOP/s (no sparsity)."""
    intra_node_gb_per_s: float = Field(gt=0)
    """Accelerator-to-accelerator bandwidth inside a node (NVLink/NVSwitch), per GPU, GB/s."""
    inter_node_gb_per_s: float = Field(gt=0)
    """Network bandwidth between nodes, per GPU (NIC share), GB/s."""
    cpu_memory_gib: float = Field(gt=0)
    """Host memory per node."""
    nvme_gib: float = Field(default=0, ge=0)
    """Local NVMe capacity per node; 0 means none (no NVMe offload)."""
    hostnames: list[str] | None = None
    """Node hostnames for the hostfile (default: localhost for one node)."""
    gpu_fp32_peak_tflops: float | None = Field(default=None, gt=0)
    """fp32 (non-tensor-core) peak per accelerator, TFLOP/s (default: gpu_peak_tflops / 16, the A100 ratio)."""
    gpu_fp8_peak_tflops: float | None = Field(default=None, gt=0)
    """Dense FP8 tensor-core peak per accelerator, TFLOP/s (E4M3/E5M2 inputs, fp32 accumulation, no sparsity;
    presets/gpus.yaml's `fp8_tflops`). None: no FP8 tensor cores (before Ada/Hopper), so no `--precision fp8`."""
    gpu_fp8_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Sustained fraction of the FP8 peak that training-sized FP8 GEMMs reach (default: gpu_matmul_efficiency).
    The best FP8 GEMMs reach a smaller share of their doubled peak than bf16 ones — 70.9 % of 1979 against
    80.3 % of 989 on H100 SXM, 73.4 % on H200 (stas00/ml-engineering, "Maximum Achievable Matmul FLOPS") —
    so the H100/H200 presets scale their bf16 efficiency by that ratio."""
    gpu_mxfp8_peak_tflops: float | None = Field(default=None, gt=0)
    """Dense MXFP8 peak, TFLOP/s (gpus.yaml `mxfp8_tflops`); None: no MXFP8 tensor cores (Hopper, CDNA3)."""
    gpu_mxfp8_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Sustained share of the MXFP8 peak its GEMM kernels reach, casts excluded (default: the FP8 one)."""
    gpu_nvfp4_peak_tflops: float | None = Field(default=None, gt=0)
    """Dense NVFP4 peak, TFLOP/s (gpus.yaml `nvfp4_tflops`); None: no NVFP4 tensor cores (all but Blackwell)."""
    gpu_nvfp4_matmul_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Sustained share of the NVFP4 peak its GEMM kernels reach, casts excluded (default: gpu_matmul_efficiency)."""
    supports_bf16: bool = True
    """bf16 arithmetic is available (false on V100-class GPUs)."""
    supports_fp16: bool | None = None
    """fp16 is available (default: false on cpu, where DeepSpeed rejects it, true elsewhere)."""
    gpu_memory_gb_per_s: float = Field(default=2000, gt=0)
    """Accelerator memory (HBM) bandwidth, GB/s; bounds memory-bound kernels and the optimizer step."""
    gpu_matmul_efficiency: float = Field(default=0.75, gt=0, le=1)
    """Sustained fraction of peak that training-sized GEMMs reach (A100 preset 0.7); `dstk calibrate` measures it."""
    gpu_sm_count: int | None = Field(default=None, gt=0)
    """Streaming multiprocessors per GPU (A100 108, H100 SXM 132). With it, each GEMM's efficiency also
    carries its tile and wave quantization (NVIDIA, "Matrix Multiplication Background User's Guide" §3): a
    thin TP shard or a short sequence fills fewer of the GPU's tile slots than a large GEMM. Unset (CPU,
    unknown GPU): one efficiency for every shape."""
    attention_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Fraction of peak the fused attention kernel (SDPA / FlashAttention) sustains forward and backward, its
    FLOPs counted as 4·s·h per token and block (default: gpu_matmul_efficiency). `dstk calibrate` measures it;
    on CPU it is a third of the GEMM figure, on GPUs FlashAttention-2 reaches 50-70 % of peak (Dao 2023)."""
    pcie_gb_per_s: float = Field(default=25, gt=0)
    """Host-to-accelerator bandwidth per GPU, GB/s (PCIe Gen4 x16 ≈ 25 achievable)."""
    nvme_gb_per_s: float = Field(default=6, gt=0)
    """Aggregate NVMe read/write bandwidth per node, GB/s."""
    cpu_memory_gb_per_s: float = Field(default=150, gt=0)
    """Achievable host memory bandwidth per node, GB/s; bounds the CPU Adam step of ZeRO-Offload."""
    collective_bus_gb_per_s: dict[CollectiveName, float] | None = None
    """Intra-node bus bandwidth (nccl-tests' convention) of each collective where the backend's algorithms
    differ — gloo on CPU runs all-gather and reduce-scatter at a third of its all-reduce; `dstk calibrate`
    measures it. Unset (NCCL, whose rings give every collective the same bus bandwidth): intra_node_gb_per_s."""
    nvlink_domain_gpus: int | None = Field(default=None, gt=0)
    """GPUs one NVLink fabric joins, whole nodes (default: a node). NVL72: 72 across 18 trays of 4; a group
    inside the domain runs at the intra-node figures, only one spanning domains crosses the network (comm.py)."""
    intra_node_topology: Literal["switch", "full_mesh"] = "switch"
    """`switch` (NVSwitch) or `full_mesh` (AMD xGMI: one link per pair of GPUs, so a group of g GPUs of a node
    gets (g−1)/(gpus_per_node−1) of its bandwidth; toolkit/plan/cost/comm.py)."""
    collective_latency_us: float = Field(default=10, ge=0)
    """Host cost of issuing one collective call, microseconds, beyond the latency of the algorithm NCCL runs
    (toolkit.plan.cost.comm); on the CPU accelerator the whole per-call cost of gloo, as calibrated."""
    collective_sm_count: int | None = Field(default=None, ge=0)
    """SMs one NCCL collective kernel holds (one CTA per channel) while it runs beside compute on another
    stream: the GEMMs and attention that overlap it run on the rest, with the rest's wave quantization
    (toolkit.plan.cost.timing, `overlap_slowdown`). Unset: overlapped traffic costs compute nothing."""
    nccl_ll128_across_nodes: bool = False
    """NCCL runs its LL128 protocol over the network: on Hopper and newer GPUs only (NCCL tuning.cc:518-536,
    `NCCL_LL128` enabled up to PXN paths on sm90+, up to PXB before), so on an A100 cluster a medium message
    that crosses nodes runs LL (half the bandwidth, capped) or Simple (14 µs network steps)."""
    gpu_power_w: float = Field(default=400, gt=0)
    """Board power per accelerator under training load, W (for energy estimates)."""
    kernel_launch_us: float = Field(default=5, ge=0)
    """Host-side cost of issuing one kernel (or, on CPU, one eager op); small models are bound by it."""
    step_overhead_ms: float = Field(default=0, ge=0)
    """Host time the training engine spends per optimizer step beyond the arithmetic (bookkeeping, clipping,
    scheduler, loss reduction), not hidden behind accelerator work. `dstk calibrate` measures it from a model
    too small to compute anything; on GPUs it overlaps the kernels of the step, hence 0 in their presets."""
    optimizer_ns_per_param: dict[Literal["replicated", "partitioned"], float] | None = None
    """Measured cost of DeepSpeed's 16-bit optimizer step (norm, clipping, AdamW, 16-bit copy; not its
    all-gather) per parameter a rank updates, by code path: `replicated` is ZeRO-0's per-tensor step,
    `partitioned` ZeRO-1/2/3's step over one flat fp32 partition that is flattened and cast afresh every
    step. `dstk calibrate` measures both on the CPU accelerator, where they differ 2–3× (the partition's
    temporaries exceed glibc's 32 MiB mmap ceiling and are page-faulted in anew each step — 506 MB of minor
    faults per ZeRO-1/2 step of a 63M GPT-2 against 200 MB at ZeRO-0, benchmarks/step_memory.py — and its
    extra passes are memory-bound on the same cores). Unset: the analytic bytes-per-parameter model."""
    storage_gb_per_s: float = Field(default=5, gt=0)
    """Checkpoint write bandwidth per node to the shared filesystem, GB/s."""
    node_mtbf_hours: float = Field(default=6300, gt=0)
    """Mean time between failures of one node, hours (Llama 3: 419 unexpected interruptions in 54 days on
    2,048 nodes ≈ 6,300 h; Dubey et al. 2024, §3.3.4)."""
    launcher: Literal["pdsh", "openmpi", "mvapich", "slurm", "mpich", "impi"] = "pdsh"
    """Backend the `deepspeed` launcher uses to start ranks on other nodes."""
    network_interface: str | None = None
    """NIC for NCCL/gloo bootstrap (exported as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME), e.g. ib0."""
    master_addr: str | None = None
    """Address of the rank-0 node (default: the first hostname)."""
    ssh_port: int | None = Field(default=None, gt=0, lt=65536)
    """sshd port on the nodes for the pdsh launcher (`deepspeed --ssh_port`; default: ssh's own, 22)."""
    env: dict[str, str] | None = None
    """Environment every rank on every node gets (`export` before the rank starts, via DeepSpeed's
    `.deepspeed_env`): a remote shell starts from the node's login environment, not the launcher's."""
    framework_overhead_gib: float = Field(default=1.0, ge=0)
    """Memory per rank the engine holds before any tensor: CUDA context, NCCL/gloo buffers, allocator reserve."""

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        data.setdefault("supports_fp16", data.get("accelerator", "cuda") != "cpu")
        peak = data.get("gpu_peak_tflops")
        if isinstance(peak, (int, float)) and peak > 0:
            data.setdefault("gpu_fp32_peak_tflops", peak / 16)
        return data

    @model_validator(mode="after")
    def _check_hosts(self) -> ClusterSpec:
        if self.hostnames is not None and len(self.hostnames) != self.nodes:
            raise ValueError(f"hostnames: {len(self.hostnames)} names given for nodes({self.nodes})")
        if self.nvlink_domain % self.gpus_per_node:
            raise ValueError(f"nvlink_domain_gpus: {self.nvlink_domain} is not a whole number of nodes")
        if self.nvlink_domain != self.gpus_per_node and self.intra_node_topology == "full_mesh":
            raise ValueError("nvlink_domain_gpus: a full_mesh (xGMI) node is its own NVLink domain")
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs one NVLink fabric joins: nvlink_domain_gpus, else one node."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    def peak_flops(self, precision: Precision) -> float:
        """Peak FLOP/s per accelerator at the training precision (fp8, mxfp8, nvfp4: of the linear GEMMs in that
        format, MFU's denominator as NVIDIA's MFU tables take each data type's peak; dgxc-benchmarking README)."""
        if precision in LOW_PRECISION_GEMMS:
            if (tflops := getattr(self, f"gpu_{precision}_peak_tflops")) is None:
                raise ValueError(f"cluster {self.name} has no {precision} peak (gpu_{precision}_peak_tflops)")
            return tflops * 1e12
        tflops = self.gpu_fp32_peak_tflops if precision == "fp32" else self.gpu_peak_tflops
        return tflops * 1e12

    def fp8_matmul_efficiency(self) -> float:
        """The sustained fraction of the FP8 peak (gpu_fp8_matmul_efficiency, else gpu_matmul_efficiency)."""
        return self.gpu_fp8_matmul_efficiency or self.gpu_matmul_efficiency

    def low_precision_matmul_efficiency(self, precision: str) -> float:
        """The sustained share of the fp8, mxfp8 (default: fp8's) or nvfp4 (default: bf16's) peak."""
        own = {"mxfp8": self.gpu_mxfp8_matmul_efficiency, "nvfp4": self.gpu_nvfp4_matmul_efficiency}
        fallback = self.gpu_matmul_efficiency if precision == "nvfp4" else self.fp8_matmul_efficiency()
        return own.get(precision) or fallback

    def supports(self, precision: Precision) -> bool:
        """Whether the accelerator trains in `precision`; fp8, mxfp8, nvfp4 need that format's tensor cores on
        CUDA (ROCm too) and bf16 beside them (everything but the linear layers' GEMMs stays bf16)."""
        if precision in LOW_PRECISION_GEMMS:
            has = getattr(self, f"gpu_{precision}_peak_tflops") is not None
            return self.accelerator == "cuda" and has and self.supports_bf16
        return {"bf16": self.supports_bf16, "fp16": bool(self.supports_fp16), "fp32": True}[precision]
