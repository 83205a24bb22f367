"""Where fp8 can run: the hardware, dstk train's torchao conversion, Megatron-DeepSpeed's Transformer Engine
layer; and where Transformer Engine's block-scaled recipes (`--precision mxfp8|nvfp4`) can: the hardware only,
for `dstk estimate` — neither runtime dstk configures runs them. Each check returns the one-line reason it
cannot (None: it can); `toolkit.plan.rules` lists them as named rules, `toolkit.run.preflight` asks them again
before a rank starts.
"""

from __future__ import annotations

from toolkit.plan.architectures import ARCHITECTURES
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.specs import ClusterSpec, ModelSpec


def fp8_gpus() -> list[str]:
    """The GPUs of presets/gpus.yaml with FP8 tensor cores (a dense `fp8_tflops`), in table order."""
    from toolkit.plan.presets import gpu_table

    return [name for name, entry in gpu_table().items() if entry.get("fp8_tflops") is not None]


def hardware_problem(c: ClusterSpec) -> str | None:
    """Why `c` cannot train in fp8. FP8 GEMMs need FP8 tensor cores: Ada (compute capability 8.9), Hopper (9.0)
    and newer; A100, V100 and CPUs have none (torchao.float8: "requires CUDA compute capability ≥8.9";
    Transformer Engine likewise)."""
    if c.supports("fp8"):
        return None
    has = "has no FP8 tensor cores" if c.accelerator == "cuda" else f"is {c.accelerator}, not CUDA"
    if c.accelerator == "cuda" and c.gpu_fp8_peak_tflops is not None:
        has = "has no bf16 for what stays out of FP8"
    return (
        f"fp8 needs FP8 tensor cores (compute capability >= 8.9), and cluster {c.name} {has}; "
        f"GPUs with FP8: {', '.join(fp8_gpus())} (or a cluster file with gpu_fp8_peak_tflops); use bf16 here"
    )


def needs_fp8_tensor_cores(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    problem = hardware_problem(c) if r.precision == "fp8" else None
    return None if problem is None else f"--precision: {problem}"


BLOCK_SCALED_NAMES = {"mxfp8": "MXFP8", "nvfp4": "NVFP4"}
"""The block-scaled precisions and how their format is written."""


def block_scaled_gpus(precision: str) -> list[str]:
    """The GPUs of presets/gpus.yaml whose tensor cores run `precision` ("mxfp8", "nvfp4"), in table order."""
    from toolkit.plan.presets import gpu_table

    column = f"{precision}_tflops"
    return [name for name, entry in gpu_table().items() if entry.get(column) is not None]


def block_scaled_problem(c: ClusterSpec, precision: str) -> str | None:
    """Why `c` cannot train with Transformer Engine's MXFP8 or NVFP4 recipe: the GEMMs need tensor cores that
    take the block-scaled format (TE: MXFP8BlockScaling and NVFP4BlockScaling train on SM 10.0 and 10.3 only,
    "MXFP8 and NVFP4 require Blackwell"; AMD's CDNA4 has OCP MXFP8, no NVFP4), which presets/gpus.yaml records
    as `mxfp8_tflops` / `nvfp4_tflops`."""
    if c.supports(precision):
        return None
    name = BLOCK_SCALED_NAMES[precision]
    if c.accelerator != "cuda":
        has = f"is {c.accelerator}, not a GPU"
    elif getattr(c, f"gpu_{precision}_peak_tflops") is not None:
        has = "has no bf16 for what stays out of it"
    else:
        has = f"has no {name} tensor cores"
    return (
        f"--precision {precision}: {name} GEMMs need {name} tensor cores, and cluster {c.name} {has}; GPUs with "
        f"{name}: {', '.join(block_scaled_gpus(precision))} (or a cluster file with gpu_{precision}_peak_tflops)"
    )


def needs_block_scaled_tensor_cores(m: ModelSpec, c: ClusterSpec, r: LayoutRequest, dp: int) -> str | None:
    if r.precision not in BLOCK_SCALED_NAMES:
        return None
    return block_scaled_problem(c, r.precision)


def estimate_only(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """MXFP8 and NVFP4 are Transformer Engine's recipes as Megatron-Core runs them (`--fp8-recipe mxfp8`,
    `--fp4-format e2m1 --fp4-recipe nvfp4`), which the other runtimes dstk configures do not build: dstk train's
    low precision is torchao.float8's tensorwise scaling (toolkit/run/fp8.py), and Megatron-DeepSpeed's is TE's
    DelayedScaling, built for transformer-engine < 2.0, with no recipe flag in its parser — only
    --fp8-e4m3/--fp8-hybrid and the amax settings (tests/data/megatron_deepspeed_flags.txt, from
    megatron/arguments.py @ f1feb88)."""
    if r.precision not in BLOCK_SCALED_NAMES:
        return None
    return (
        f"--precision {r.precision}: Transformer Engine's {BLOCK_SCALED_NAMES[r.precision]} recipe, which neither "
        "dstk train (torchao.float8, tensorwise) nor Megatron-DeepSpeed (no --fp8-recipe/--fp4-recipe) runs; "
        "use --target megatron-core, or train in fp8"
    )


def torchao_converts(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """dstk train's fp8 is torchao.float8's `convert_to_float8_training`, which swaps `torch.nn.Linear` modules
    for Float8Linear before `deepspeed.initialize` (toolkit/run/fp8.py): HF GPT-2's projections are
    transformers' Conv1D, HF MoE experts fused 3-D tensors (or DeepSpeed-MoE copies), AutoTP and the pipeline
    conversion replace the swapped modules, and peft wraps them. At ZeRO-3, Float8Linear saves `weight.t()` — a
    view of the gathered weight — for backward, and ZeRO-3 frees a parameter by pointing `param.data` elsewhere
    (partition_parameters.py `free_param`), so every gathered weight would stay alive until backward."""
    if r.precision != "fp8":
        return None
    problems = []
    if m.family.conv1d:
        problems.append(f"{m.family_label} projections are Conv1D, not nn.Linear")
    if m.is_moe:
        problems.append("MoE experts are not nn.Linear modules")
    if r.tp > 1 or r.pp > 1:
        problems.append(f"tp={r.tp}, pp={r.pp} (AutoTP and the pipeline replace the converted modules)")
    if r.zero_stage == 3:
        problems.append("ZeRO-3 (Float8Linear's saved weight view keeps each gathered weight until backward)")
    if r.lora is not None:
        problems.append("LoRA wraps the linear layers")
    if not problems:
        return None
    dense = ", ".join(n for n, f in ARCHITECTURES.items() if not (f.conv1d or f.native_moe))
    return (
        f"--precision: dstk train's fp8 (torchao.float8) converts the nn.Linear layers of dense {dense} models "
        f"with data parallelism, ZeRO-0/1/2 and sequence parallelism; here {'; '.join(problems)}; use bf16, "
        "or --target megatron"
    )


def te_layer_builds(m: ModelSpec, r: LayoutRequest, dp: int) -> str | None:
    """Megatron-DeepSpeed's fp8 is `--transformer-impl transformer_engine`, which builds
    `transformer_engine.pytorch.TransformerLayer` from the hidden and FFN sizes and the heads only — LayerNorm,
    GeLU and biases being its defaults — and asserts "Transformer_engine does not support GQA"
    (megatron/model/transformer.py:1757-1800 @ f1feb88); `megatron/training.py:386-390` allows TE for `GPTModel`
    only, which pretrain_gpt.py builds with `--no-pipeline-parallel`; the Ulysses attention wraps the local
    layer's attention, not TE's; MoE layers are the local layer's."""
    if r.precision != "fp8":
        return None
    problems = []
    if m.n_kv_heads != m.n_heads:
        problems.append(f"grouped-query attention (n_kv_heads {m.n_kv_heads} of {m.n_heads} heads)")
    if m.norm != "layernorm" or m.gated_mlp:
        problems.append("RMSNorm or a gated MLP (the TE layer is built with LayerNorm and GeLU)")
    if not (m.attention_bias and m.mlp_bias):
        problems.append("linear layers without biases (the TE layer has them)")
    if m.is_moe:
        problems.append("MoE layers (the TE layer is dense)")
    if r.pp > 1:
        problems.append(f"pp={r.pp} (TE needs GPTModel, built only with --no-pipeline-parallel)")
    if r.sp > 1:
        problems.append(f"sp={r.sp} (Ulysses wraps the local attention, not TE's)")
    if not problems:
        return None
    return (
        f"--precision: Megatron-DeepSpeed's fp8 (Transformer Engine's TransformerLayer) cannot run {m.name} as "
        f"planned: {'; '.join(problems)}; use --precision bf16"
    )


def block_scaled_refusal(c: ClusterSpec, precision: str, scopes: tuple[str, ...]) -> str | None:
    """Why no layout can run `precision` (mxfp8, nvfp4) on `c` under the rule `scopes`, whatever the layout
    (the hardware, then the runtime); None otherwise. The planner says it once instead of per layout."""
    if precision not in BLOCK_SCALED_NAMES:
        return None
    request = LayoutRequest(precision=precision)  # type: ignore[arg-type]
    found = [block_scaled_problem(c, precision)]
    if "core" in scopes:
        found.append(estimate_only(None, request, 1))  # type: ignore[arg-type]
    return "; ".join(p for p in found if p) or None


def run_problems(model: ModelSpec, cluster: ClusterSpec | None, request: LayoutRequest) -> list[str]:
    """What stands between an fp8 layout and dstk train (toolkit/run/preflight.py): the hardware when the
    cluster is known, and what torchao's conversion covers."""
    found = [torchao_converts(model, request, 1), estimate_only(model, request, 1)]
    if cluster is not None:
        found.insert(0, needs_fp8_tensor_cores(model, cluster, request, 1))
        found.insert(1, needs_block_scaled_tensor_cores(model, cluster, request, 1))
    return [m for m in found if m]
