"""Megatron-LM (Megatron-Core) `pretrain_gpt.py` arguments for how a plan runs: parallel sizes and the pipeline,
batch, precision, recomputation, attention kernel, optimizer and schedule. The model's own arguments are
:mod:`toolkit.integrations.megatron_core`'s; references are to NVIDIA/Megatron-LM d98e8a64 (A =
megatron/training/arguments.py, TC = megatron/core/transformer/transformer_config.py).

- Context parallelism is dstk's `--sp`: `--context-parallel-size N --cp-comm-type a2a`, the all-to-all
  (Ulysses-like) exchange dstk prices, not Megatron's default ring (p2p).
- ZeRO-1 is Megatron's distributed optimizer (`--use-distributed-optimizer`); ZeRO-0 plain data parallelism.
- The pipeline: there is no `--virtual-pipeline-model-parallel-size` (A:2307-2308). Blocks that split evenly over
  pp × v stages with no MTP layer take `--num-layers-per-virtual-pipeline-stage` (interleaving) or nothing;
  otherwise dstk writes the split it priced as `--pipeline-model-parallel-layout` (the user's `--pipeline-layout`,
  or dstk's even split, earlier stages taking the remainder, MTP layers beside the loss), from which Megatron
  takes the virtual stages too (A:941-950).
- `--comm-overlap`: `--overlap-grad-reduce`, with the distributed optimizer `--overlap-param-gather` (it needs
  both, A:1024-1029), and with TP and sequence parallelism `--tp-comm-overlap` (A:1441-1442).
- fp8 is `--fp8-format hybrid` (E4M3 forward, E5M2 backward) with the recipe dstk priced (`delayed`, with
  Transformer Engine's own amax defaults 1024 / max as the Megatron-DeepSpeed target writes them, or with
  `--fp8-scaling current` Megatron's `tensorwise`, TE's Float8CurrentScaling, megatron/core/fp8_utils.py);
  mxfp8 `--fp8-format e4m3 --fp8-recipe mxfp8` (TE's MXFP8BlockScaling format); nvfp4
  `--fp4-format e2m1 --fp4-recipe nvfp4`. Megatron's default recipe is `delayed` (TC:594), so it is always given.
- `--cuda-graphs` is `--cuda-graph-impl full_iteration` with `--no-check-for-nan-in-loss-and-grad` (dense
  models; `check_layout` says why not MoE ones).
- Attention: fused attention (dstk's `--flash-attention`, the default for this target) is `--attention-backend
  auto`, Transformer Engine's choice of FlashAttention or cuDNN's fused kernel (latent attention's q/k and v heads
  differ in width, which not every FlashAttention build takes); without it `unfused`, which keeps the scores as
  dstk then prices.
"""

from __future__ import annotations

import itertools
from typing import Any

from toolkit.errors import UserError
from toolkit.integrations.megatron import schedule_args
from toolkit.plan import pipeline_layout
from toolkit.plan.layout import Layout, engine_precision
from toolkit.plan.specs import ClusterSpec, ModelSpec


def layout_string(model: ModelSpec, layout: Layout) -> str | None:
    """The `--pipeline-model-parallel-layout` dstk writes: the user's, else its even split where Megatron's own
    (every stage the same number of blocks) would differ or cannot place MTP layers as priced; None where
    `--num-layers-per-virtual-pipeline-stage` (or nothing) says the same."""
    if layout.pipeline_layout is not None:
        return layout.pipeline_layout.replace(" ", "")
    stages = layout.pp * layout.virtual_stages
    if layout.pp == 1 or (model.n_layers % stages == 0 and not model.mtp_layers):
        return None
    even = pipeline_layout.even_layout(model.n_layers, layout.pp, layout.virtual_stages, model.mtp_layers)
    return grouped(pipeline_layout.parse(even))


def grouped(stages: list[str]) -> str:
    """A layout string for `stages` with each run of equal stages written once, `(t*3|)*29`, and each run of one
    symbol `t*3` (what Megatron's parser unrolls back, pipeline_parallel_layer_layout.py:288-301)."""
    out = []
    for stage, run in itertools.groupby(stages[:-1]):
        text = pipeline_layout.compact([stage]) + "|"
        count = len(list(run))
        out.append(f"({text})*{count}" if count > 1 else text)
    return "".join(out) + pipeline_layout.compact(stages[-1:])


def _parallel_args(model: ModelSpec, layout: Layout) -> list[str]:
    args = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(layout.pp),
    ]  # fmt: skip
    if layout.tp > 1 and layout.tp_sequence_parallel:
        args.append("--sequence-parallel")
    if layout.sp > 1:
        args += ["--context-parallel-size", str(layout.sp), "--cp-comm-type", "a2a"]
    text = layout_string(model, layout)
    if text is not None:
        args += ["--pipeline-model-parallel-layout", text]
    elif layout.virtual_stages > 1:
        per = model.n_layers // (layout.pp * layout.virtual_stages)
        args += ["--num-layers-per-virtual-pipeline-stage", str(per)]
    if layout.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    if layout.comm_overlap:
        args.append("--overlap-grad-reduce")
        if layout.zero_stage == 1:
            args.append("--overlap-param-gather")
        if layout.tp > 1 and layout.tp_sequence_parallel:
            args.append("--tp-comm-overlap")
    return args


def _precision_args(layout: Layout) -> list[str]:
    args = ["--transformer-impl", "transformer_engine"]
    if layout.precision != "fp32":
        args.append(f"--{engine_precision(layout.precision)}")
    if layout.precision == "fp8":
        recipe = "tensorwise" if layout.fp8_recipe == "current" else "delayed"
        args += ["--fp8-format", "hybrid", "--fp8-recipe", recipe]
        if layout.fp8_recipe == "delayed":
            args += ["--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
    elif layout.precision == "mxfp8":
        args += ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    elif layout.precision == "nvfp4":
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    args += ["--attention-backend", "auto" if layout.flash_attention else "unfused"]
    if layout.cuda_graphs:  # its NaN check syncs with the host, which a graph cannot (A:1235-1237)
        args += ["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"]
    return args


def check_layout(model: ModelSpec, layout: Layout) -> None:
    """What dstk cannot write for Megatron-Core as priced (one line): the full-iteration CUDA graph of an MoE
    model needs static expert shapes — `--moe-paged-stash` with a per-rank token budget
    (`--moe-expert-rank-capacity-factor`, tokens beyond it dropped), HybridEP and Transformer Engine's op fuser
    (Megatron-LM docs/user-guide/features/cuda_graph.md, "MoE Model Training") — a budget dstk does not price;
    and a graphed step cannot recompute attention with dropout (TC:2878-2886)."""
    if not layout.cuda_graphs:
        return
    if model.is_moe:
        raise UserError(
            "--cuda-graphs: Megatron-Core graphs an MoE model's step only with static expert shapes "
            "(--moe-paged-stash, a --moe-expert-rank-capacity-factor budget that drops tokens beyond it); dstk "
            "prices no budget and does not write them: drop --cuda-graphs"
        )
    if model.dropout and layout.recompute == "selective":
        raise UserError(
            "--cuda-graphs: Megatron-Core cannot recompute attention with dropout inside a CUDA graph; use "
            "--recompute full or none"
        )


def _recompute_args(layout: Layout) -> list[str]:
    if layout.recompute == "full":
        return [
            "--recompute-granularity", "full",
            "--recompute-method", "uniform",
            "--recompute-num-layers", "1",
        ]  # fmt: skip
    if layout.recompute == "selective":
        modules = (layout.recompute_modules or "core_attn").split(",")
        return ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    return []


def _training_args(cfg: dict[str, Any], layout: Layout) -> list[str]:
    """Batch, AdamW and the warm-up + cosine schedule, the numbers of the plan's DeepSpeed config; Megatron-LM
    also wants the optimizer named and the decay's length (it defaults to --train-iters there too)."""
    steps = cfg["scheduler"]["params"]["total_num_steps"]
    return [*schedule_args(cfg, layout), "--optimizer", "adam", "--lr-decay-iters", str(steps)]


def run_args(model: ModelSpec, layout: Layout, cfg: dict[str, Any]) -> list[str]:
    """The arguments of how the plan runs (module docstring)."""
    return (
        _parallel_args(model, layout)
        + _precision_args(layout)
        + _recompute_args(layout)
        + _training_args(cfg, layout)
    )


def run_notes(cluster: ClusterSpec, layout: Layout) -> list[str]:
    """The launcher's part: Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP on GPUs before
    Blackwell unless the EP overlap runs (A:1453-1479); NVFP4 tensor cores are how dstk's cluster description
    tells Blackwell (presets/gpus.yaml)."""
    out = []
    blackwell = cluster.gpu_nvfp4_peak_tflops is not None
    if (layout.tp > 1 or layout.sp > 1) and not layout.ep_comm_overlap and not blackwell:
        out.append(
            "set CUDA_DEVICE_MAX_CONNECTIONS=1 in every rank's environment: Megatron-LM asserts it with TP or "
            "CP > 1 on GPUs before Blackwell (megatron/training/arguments.py:1453-1479)"
        )
    if layout.precision == "nvfp4":
        out.append(
            "nvfp4: Megatron-LM's --fp4-format needs transformer-engine >= 2.7 (arguments.py:1108-1109)"
        )
    return out
