"""FP8 training as the runtimes run it: which GEMMs run in FP8, what the casts around them cost, what memory
they change. Pure; no torch.

What runs in FP8 — Transformer Engine's docs (introduction.rst:243-247): "Linear operations: run in low
precision. Attention computations: run in high precision by default ... Other operations (layer
normalization, softmax, etc.): run in high precision." So the linear layers of every block (QKV, attention
output, the MLP or the experts) run their forward and both backward GEMMs in FP8 (TE's 12 per layer,
speedups.rst:9-13) at the cluster's FP8 peak and `fp8_matmul_efficiency`; the attention core, norms, softmax,
the LM head, the embedding, routers and the loss stay bf16, as TE's TransformerLayer (blocks only) and dstk's
torchao filter (the LM head left out) leave them. Weights, gradients, optimizer states and the activations
between ops stay bf16, so model states, ZeRO traffic and the optimizer cost what a bf16 run's do.

Per-tensor recipes, by the runtime that casts (`Layout.fp8_recipe`):
- `delayed` — Megatron-DeepSpeed's `--transformer-impl transformer_engine` builds TE's DelayedScaling with the
  data-parallel group as `fp8_group` and passes `is_first_microbatch` (megatron/model/transformer.py:1715-1731,
  2067-2077 @ f1feb88). A cast reads the bf16 tensor once ("other recipes ... typically require only a single
  memory read", fp8_current_scaling.rst:69-76) and writes the rowwise and, on Hopper/Ada, the physically
  transposed columnwise FP8 copy in one kernel (performance_considerations.rst:96-100, 122-126): e + 2 bytes
  per element, for each linear input in forward and each output gradient in backward; the weights once per
  optimizer step, their FP8 copies (rowwise + columnwise, 2 bytes per weight) kept between micro-batches.
  The amaxes are all-reduced over the data-parallel group after forward and after backward (`reduce_amax`).
- `current` — Megatron-Core's `--fp8-recipe tensorwise`, TE's Float8CurrentScaling (NVIDIA's Megatron-Bridge
  fp8_cs recipes): one FP32 scale per tensor from that tensor's own amax, so "Quantization is a memory-bound
  operation that requires reading the tensor twice: First read: compute amax ... Second read: apply the
  scaling factor and cast to FP8" (fp8_current_scaling.rst @d0067d0): 2e + 2 bytes per element on Hopper
  (rowwise and transposed copies), two kernels per cast. Weights, the saved FP8 input and the FP8 weight
  copies as in `delayed`; no amax history and no data-parallel amax all-reduce (tensors gathered for
  sequence parallelism all-reduce one amax over TP before the cast: a latency, left out).
- `tensorwise` — `dstk train` swaps the HF model's nn.Linear for torchao.float8's Float8Linear (dynamic
  tensorwise scaling) and runs it eagerly (no torch.compile, which would fuse the casts). Read from torchao
  0.18.0: each cast is `torch.max(torch.abs(x))`, a scale, then `x.to(float32) * scale`, a clamp and `.to(fp8)`
  (float8_utils.py tensor_to_amax/to_fp8_saturated, float8_training_tensor.py:153-154) — 33 bytes moved per
  bf16 element in ten kernels. Per linear layer forward casts the input and the weight; backward casts the
  output gradient twice (for dgrad and wgrad), the input and the weight again (it saved them in bf16,
  float8_linear.py `ctx.save_for_backward(input_hp, weight_hp_t)`), and `_scaled_mm`'s layout rule copies
  three FP8 operands (float8_ops.py preprocess_addmm: `a.contiguous()`, `b.t().contiguous().t()`). Saved
  activations do not change (torchao measures 47.65 vs 47.77 GB, docs training.md); two fp32 temporaries of
  the largest cast tensor exist at once.

- `tensorwise` compiled — PyTorch FSDP runs (`--fsdp`; torchtitan) use torchao.float8 too, and with
  `--fused-kernels` (torch.compile) its casts are generated into fused kernels: priced as Transformer
  Engine's single-pass casts (e + 2 bytes per element, one kernel each) of every linear input and weight in
  forward and output gradient in backward — an approximation, not a measurement. As in eager torchao, no FP8
  weight copies are kept between micro-batches and no amaxes are all-reduced.

Two block-scaled recipes (`Layout.fp8_recipe` "mxfp8", "nvfp4"; `--precision mxfp8|nvfp4`), priced as
Transformer Engine runs them (NVIDIA/TransformerEngine @d0067d0, transformer_engine/common/recipe/__init__.py,
docs/features/low_precision_training/{mxfp8,nvfp4}): the same GEMMs as above — Fprop, Dgrad and Wgrad of every
linear layer — at the format's peak (`gpu_mxfp8_peak_tflops`, `gpu_nvfp4_peak_tflops`) and its kernels'
sustained share of it (`ClusterSpec.low_precision_matmul_efficiency`), the casts as HBM traffic beside them:
- `mxfp8` — MXFP8BlockScaling: E4M3 elements with one E8M0 (power-of-two) scale per 32 consecutive values,
  1 + 1/32 bytes per element. A tensor used both ways (a linear input: rowwise for Fprop, columnwise for Wgrad;
  an output gradient: rowwise for Dgrad, columnwise for Wgrad; a weight: rowwise for Fprop, columnwise for
  Dgrad) is quantized twice from the bf16 tensor — 1×32 and 32×1 blocks are numerically different, so the
  columnwise copy is no transpose of the rowwise one (mxfp8.rst) — in one pass: e + 2·(1 + 1/32) bytes per
  element, one kernel. Scales are local to their block: no amax, no all-reduce. Weights as in `delayed`: cast
  once per optimizer step, both copies kept between micro-batches; the saved linear input is the columnwise copy.
- `nvfp4` — NVFP4BlockScaling: E2M1 elements (half a byte), one E4M3 scale per 16 values and one FP32 scale
  per tensor, 0.5 + 1/16 bytes per element. The per-tensor scale needs the tensor's amax first ("the extra
  memory pass for per-tensor amax computation", docs/examples/gemm_profiling), so each cast reads the bf16
  tensor twice (the amax, then the quantization) and writes both copies: 2e + 2·(0.5 + 1/16) bytes, two
  kernels. The default recipe applies a 16×16 random Hadamard transform to the Wgrad operands (the
  columnwise copies of inputs and output gradients) and stochastic rounding to the gradients — both fused
  into the cast, arithmetic on data already read, so no further bytes — and quantizes weights in 16×16 blocks
  (one quantization serves both directions, but the TN-only GEMM takes the columnwise copy stored transposed:
  two copies).
TE's measured B300 GEMMs (docs/examples/gemm_profiling/gemm_profiling.rst @8f2e635, a 5B model's 12 GEMMs per
layer at 15,872 tokens) bound what these recipes gain: kernels alone run 1.83× (MXFP8) and 3.48× (NVFP4)
faster than bf16, with TE's quantization inside each timed GEMM 1.42× and 1.98×. The cluster presets take the
kernel-only shares as their efficiencies (the casts are priced here, not folded in): MXFP8's kernels reach
1.829 × 2250/4500 = 0.915 of the bf16 GEMMs' share of their peak, NVFP4's 3.481 × 2250/13500 = 0.580.

Left out: the amax history (5 values per GEMM, kilobytes), Blackwell's native columnwise access for the
tensorwise recipes (one FP8 copy instead of two), TE's fusion of a norm with the following cast, the
swizzle of block scales into cuBLAS's layout (fused into the cast unless an all-gather intervenes; scales are
1/32 and 1/16 of the data), NVFP4's amax all-reduce over the tensor-parallel group for sequence-parallel
inputs (one value per tensor, a latency), and the layers the NVFP4 paper keeps in bf16 for stability
(Megatron's `first_last_layers_bf16`, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from toolkit.plan.specs import ClusterSpec

Recipe = Literal["delayed", "current", "tensorwise", "mxfp8", "nvfp4"]

TE_TENSORWISE: dict[str, int] = {"delayed": 1, "current": 2}
"""Transformer Engine's per-tensor recipes and how often each cast reads the bf16 tensor (module docstring)."""

TE_COPIES = 2
"""FP8 copies TE writes per cast on Hopper/Ada: rowwise and the physically transposed columnwise one (and,
block-scaled, the rowwise and columnwise quantizations)."""


@dataclass(frozen=True)
class BlockScaled:
    """A block-scaled format as TE's recipe casts it (module docstring)."""

    element_bytes: float
    """Stored bytes per element: the payload plus its share of the block scale."""
    reads: int
    """Passes over the bf16 tensor per cast: the quantization, and before it the amax for a per-tensor scale."""


BLOCK_SCALED: dict[str, BlockScaled] = {
    "mxfp8": BlockScaled(element_bytes=1 + 1 / 32, reads=1),
    "nvfp4": BlockScaled(element_bytes=0.5 + 1 / 16, reads=2),
}
"""MXFP8: an E4M3 byte and an E8M0 scale per 32; NVFP4: an E2M1 nibble and an E4M3 scale per 16 (the FP32
per-tensor scale is negligible)."""


def gemm_format(recipe: Recipe) -> str:
    """The precision whose peak a recipe's GEMMs run at: fp8 for the tensorwise recipes, else the recipe's."""
    return recipe if recipe in BLOCK_SCALED else "fp8"


def operand_bytes(recipe: Recipe) -> float:
    """Bytes per element of a GEMM operand in the recipe's format (scales included)."""
    return BLOCK_SCALED[recipe].element_bytes if recipe in BLOCK_SCALED else 1.0


def saved_input_bytes(recipe: Recipe | None) -> float:
    """Bytes per element of the copy of a linear layer's input that Transformer Engine saves for Wgrad (0: the
    runtime saves its bf16 input): the FP8 one in `delayed`/`current`, the columnwise block-scaled one in
    mxfp8/nvfp4."""
    if recipe in TE_TENSORWISE:
        return 1.0
    return BLOCK_SCALED[recipe].element_bytes if recipe in BLOCK_SCALED else 0.0


EAGER_CAST_BYTES = 33
"""Bytes per bf16 element of one eager torchao cast: abs (read 2, write 2), max (2), to fp32 (2 + 4), × scale
(4 + 4), clamp (4 + 4), to fp8 (4 + 1)."""
EAGER_CAST_KERNELS = 10
"""Kernels of one eager torchao cast: abs, max; amax_to_scale's to(float64), clamp, division, to(float32);
to(float32), multiplication, clamp, to(fp8)."""
LAYOUT_COPY_BYTES = 2
"""An FP8 operand copied into the layout `torch._scaled_mm` takes (read 1 byte, write 1)."""
EAGER_TRANSIENT_BYTES = 8
"""Per element of the tensor being cast: `x.to(float32) * scale` and its clamped copy, both fp32, alive at once."""
AMAX_BYTES = 4 * (3 + 2)
"""fp32 amaxes per GEMM TE reduces: 3 forward (input, weight, output), 2 backward (fp8_delayed_scaling.rst:70-73)."""


@dataclass(frozen=True)
class Linear:
    """One linear layer's GEMM on one rank for one micro-batch: (m × k)·(k × n), with the weight elements
    behind it (k·n, times the experts the rank holds) and whether a bias follows. A grouped GEMM (the experts
    a rank holds) is `groups` GEMMs of m / groups rows each against its own k × n weight."""

    m: float
    k: float
    n: float
    weights: float
    bias: bool = False
    groups: float = 1.0
    in_flight: float | None = None
    """Of a grouped GEMM, how many groups run at once and share the GPU's waves (None: all of them, one
    grouped kernel; toolkit.plan.cost.moe.ExpertPlacement.gemm_streams)."""


@dataclass(frozen=True)
class Fp8Gemms:
    """Where a layout's linear GEMMs run: the format's peak, the share of it they sustain, and the recipe."""

    peak: float
    efficiency: float
    recipe: Recipe
    compiled: bool = False
    """torchao's casts generated by torch.compile (`--fused-kernels` with `--fsdp`), not eager."""
    operand_bytes: float = 1.0
    """Bytes per element the GEMM reads of each operand (its memory roofline)."""


def fp8_gemms(cluster: ClusterSpec, recipe: Recipe | None, compiled: bool = False) -> Fp8Gemms | None:
    """The GEMM rate of `cluster` for a layout's recipe (FP8, MXFP8 or NVFP4); None when the linear layers
    run in the training precision."""
    if recipe is None:
        return None
    fmt = gemm_format(recipe)
    return Fp8Gemms(
        cluster.peak_flops(fmt),
        cluster.low_precision_matmul_efficiency(fmt),
        recipe,
        compiled,
        operand_bytes(recipe),
    )


@dataclass(frozen=True)
class CastTraffic:
    """HBM bytes and kernels of the FP8 casts around a block's linear layers, per micro-batch."""

    forward_bytes: float
    backward_bytes: float
    forward_kernels: int
    backward_kernels: int
    per_step_bytes: float = 0.0
    """Weight casts done once per optimizer step (TE with `is_first_microbatch`)."""


def cast_traffic(linears: list[Linear], e: int, recipe: Recipe, compiled: bool = False) -> CastTraffic:
    """The casts around `linears` (one block) under `recipe` (module docstring), `e` bytes per bf16 element;
    `compiled`: torchao's casts fused by torch.compile."""
    inputs = sum(x.m * x.k for x in linears)
    grads = sum(x.m * x.n for x in linears)
    weights = sum(x.weights for x in linears)
    if recipe in BLOCK_SCALED:
        fmt = BLOCK_SCALED[recipe]
        cast = fmt.reads * e + TE_COPIES * fmt.element_bytes
        n = fmt.reads * len(linears)
        return CastTraffic(inputs * cast, grads * cast, n, n, weights * cast)
    if recipe in TE_TENSORWISE:
        reads = TE_TENSORWISE[recipe]
        cast, n = reads * e + TE_COPIES, reads * len(linears)
        return CastTraffic(inputs * cast, grads * cast, n, n, weights * cast)
    cast = e + TE_COPIES
    if compiled:
        return CastTraffic((inputs + weights) * cast, grads * cast, 2 * len(linears), len(linears))
    c, n = EAGER_CAST_BYTES, len(linears)
    # Float8Linear adds its bias as a separate kernel on the bf16 output (F.linear fuses it into the GEMM)
    bias = sum(2 * e * x.m * x.n for x in linears if x.bias)
    forward = (inputs + weights) * c + bias
    backward = (inputs + weights) * (c + LAYOUT_COPY_BYTES) + grads * (2 * c + LAYOUT_COPY_BYTES)
    n_bias = sum(1 for x in linears if x.bias)
    return CastTraffic(
        forward, backward, 2 * n * EAGER_CAST_KERNELS + n_bias, 4 * n * EAGER_CAST_KERNELS + 3 * n
    )


def weight_copies_bytes(linears: list[Linear], blocks: int, recipe: Recipe | None) -> float:
    """Low-precision weight copies a rank keeps between micro-batches: TE's rowwise + columnwise workspace (2
    bytes per linear weight in FP8, performance_considerations.rst "Master weights"; two block-scaled copies
    with their scales in mxfp8/nvfp4); torchao casts afresh and keeps none."""
    if recipe in BLOCK_SCALED:
        return blocks * TE_COPIES * BLOCK_SCALED[recipe].element_bytes * sum(x.weights for x in linears)
    if recipe not in TE_TENSORWISE:
        return 0.0
    return blocks * TE_COPIES * sum(x.weights for x in linears)


def cast_transient_bytes(linears: list[Linear], recipe: Recipe | None, compiled: bool = False) -> float:
    """Temporaries of an eager torchao cast of the largest input or output gradient (fp32 twice); TE's fused
    casts and compiled ones keep none."""
    if recipe != "tensorwise" or compiled or not linears:
        return 0.0
    return EAGER_TRANSIENT_BYTES * max(max(x.m * x.k, x.m * x.n) for x in linears)


def amax_bytes(linears: list[Linear], blocks: int) -> float:
    """fp32 amaxes of one stage's FP8 GEMMs that TE all-reduces (forward and backward together)."""
    return blocks * len(linears) * AMAX_BYTES
