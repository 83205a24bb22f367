"""Megatron-DeepSpeed: the `pretrain_gpt.py` arguments and DeepSpeed config for the same plan.

Flag names come from the project's own argument parser, read (not guessed) from
deepspeedai/Megatron-DeepSpeed (formerly microsoft/Megatron-DeepSpeed; GitHub redirects the old name)
`megatron/arguments.py` at commit f1feb8877d760b4ceaa0551debbf1cb4026fc9be, plus `--deepspeed` and
`--deepspeed_config` from `deepspeed.add_config_arguments` (DeepSpeed 0.19.8, `_add_core_arguments`), which that
parser calls; `pretrain_gpt.py` (commit dd16deb) adds none. The copy of microsoft/Megatron-DeepSpeed at
bb4ac1c predates `--sequence-parallel`, `--ds-sequence-parallel-size`, `--num-key-value-heads`, `--swiglu`,
`--normalization` and the `--recompute-*` flags, so that fork is not the reference. Verified flags dstk may emit
(`tests/data/megatron_deepspeed_flags.txt` lists them with their arity; a test parses every emitted list):
  network size: --num-layers --hidden-size --ffn-hidden-size --num-attention-heads --num-key-value-heads
    --kv-channels --max-position-embeddings --normalization --use-rotary-position-embeddings
    --no-position-embedding --swiglu --untie-embeddings-and-output-weights --use-flash-attn-v2
  MoE: --num-experts --topk --expert-interval --moe-expert-parallel-size --moe-train-capacity-factor
    --moe-loss-coeff --create-moe-param-group
  regularization: --attention-dropout --hidden-dropout --weight-decay --clip-grad --adam-beta1 --adam-beta2
    --adam-eps
  training: --micro-batch-size --global-batch-size --train-iters --recompute-granularity --recompute-method
    --recompute-num-layers --disable-bias-linear --cpu-optimizer --no-pipeline-parallel --sequence-parallel
    --ds-sequence-parallel-size
  learning rate: --lr --min-lr --lr-decay-style --lr-warmup-iters
  precision / data / distributed: --bf16 --fp16 --seq-length --tensor-model-parallel-size
    --pipeline-model-parallel-size --distributed-backend
  ZeRO / activation checkpointing: --zero-stage --remote-device --use-pin-memory
    --deepspeed-activation-checkpointing --partition-activations
  DeepSpeed: --deepspeed --deepspeed_config
  Transformer-Engine (fp8): --transformer-impl --fp8-hybrid --fp8-amax-history-len --fp8-amax-compute-algo

How the plan maps (from the same repository's code):
- Megatron builds TP (its own column/row-parallel layers, the word embedding always vocabulary-parallel),
  the pipeline (`GPTModelPipe`, a DeepSpeed PipelineModule with its own topology), the optimizer
  (`get_megatron_optimizer`) and the LR schedule, and hands them to `deepspeed.initialize` with its mpu. The
  JSON therefore drops `tensor_parallel`, `pipeline`, `optimizer`, `scheduler`, `sequence_parallel_size` and
  `expert_parallel`; DeepSpeed then counts only data-parallel ranks, so `train_batch_size` is the global
  batch (not × tp as for AutoTP), and the optimizer numbers become `--lr`, `--adam-*`, `--weight-decay`.
- `--no-pipeline-parallel` whenever pp = 1: otherwise `GPTModelPipe` is built anyway, and DeepSpeed's
  PipelineEngine refuses ZeRO-2/3 (the project's own examples add it for ZeRO > 1).
- `--zero-stage` must agree with the JSON: `pretrain_gpt.py` enables `deepspeed.zero.Init` from it.
- Full recomputation: `--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`
  (what `GPTModelPipe` turns into `activation_checkpoint_interval`) and `--deepspeed-activation-checkpointing`,
  with `--partition-activations` when TP > 1 without sequence parallelism, the same choice as the JSON's
  `activation_checkpointing` block (with sequence parallelism the checkpointed input is already sharded;
  Megatron likewise ignores `distribute_saved_activations` then). Selective: `--recompute-granularity selective`.
- MoE layers are DeepSpeed-MoE (`--num-experts`), which the engine refuses at ZeRO-3; layer k (from 1) is MoE
  when k % `--expert-interval` == 0, dstk's `moe_layer_interval` convention. Experts are not split over TP
  (no `--enable-expert-tensor-parallelism`), as the memory estimate assumes.
- Optimizer offload needs `--cpu-optimizer` (DeepSpeedCPUAdam as the client optimizer; DeepSpeed refuses
  ZeRO-Offload with another client optimizer); parameter offload needs `--remote-device` for `zero.Init`.
- fp8: `--transformer-impl transformer_engine --fp8-hybrid` (E4M3 forward, E5M2 backward: TE's own default
  format) with TE's default amax history, 1024 steps reduced by `max` (TE's DelayedScaling since v0.8, commit
  80542a0 "Change FP8 recipe defaults"; Megatron's own defaults are 1 and `most_recent`). That path builds
  `transformer_engine.pytorch.TransformerLayer` with the hidden and FFN sizes, the heads, biases on, LayerNorm
  and GeLU (its defaults; megatron/model/transformer.py:1760-1800) and asserts "Transformer_engine does not support
  GQA"; `megatron/training.py:386-390` refuses TE for anything but `GPTModel`, i.e. without
  `--no-pipeline-parallel`; its DelayedScaling(interval=..., override_linear_precision=...) needs
  transformer-engine < 2.0 (both fields are gone from 2.0; v1.13 has them). `check_layout` refuses what that
  layer cannot express, and TE's DotProductAttention replaces `--use-flash-attn-v2`.
Data, tokenizer, checkpoint and logging flags are the user's (the vocabulary comes from the tokenizer files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.integrations.targets import without_dstk_block
from toolkit.plan.fp8_support import te_layer_builds
from toolkit.plan.layout import Layout, engine_precision
from toolkit.plan.specs import ClusterSpec, ModelSpec

SOURCE = (
    "deepspeedai/Megatron-DeepSpeed megatron/arguments.py @ f1feb8877d760b4ceaa0551debbf1cb4026fc9be; "
    "deepspeed 0.19.8 deepspeed.add_config_arguments"
)
# Megatron's --distributed-backend choices are nccl, gloo, ccl, hccl (nccl is its default).
_BACKENDS = {"cpu": "gloo", "xpu": "ccl", "hpu": "hccl", "npu": "hccl"}
# Keys Megatron-DeepSpeed builds itself and hands to deepspeed.initialize (module docstring).
_OWNED_BY_MEGATRON = (
    "tensor_parallel",
    "pipeline",
    "optimizer",
    "scheduler",
    "sequence_parallel_size",
    "expert_parallel",
)


def _architecture_problems(model: ModelSpec) -> list[str]:
    problems = []
    if model.position_embedding == "alibi":
        problems.append("ALiBi positions")
    if model.embedding_norm:
        problems.append("a LayerNorm after the word embedding")
    if not (model.attention_bias == model.attention_out_bias == model.mlp_bias):
        problems.append("biases on some linear layers only (--disable-bias-linear is all or none)")
    if model.gated_mlp and model.activation != "silu":
        problems.append(f"a gated {model.activation} MLP (--swiglu is SiLU)")
    if not model.gated_mlp and model.activation in ("silu", "relu"):
        problems.append(f"an ungated {model.activation} MLP (GeLU or --swiglu)")
    if model.qk_norm:
        problems.append("q/k norms")
    if model.family.norms_per_block != 2:
        problems.append(f"{model.family.norms_per_block} norms per block (pre-norm only)")
    if model.family.embedding_scale:
        problems.append("embeddings scaled by √h")
    if model.sliding_window is not None:
        problems.append("sliding-window layers")
    if model.is_moe and model.moe_ffn_hidden_size != model.ffn_hidden_size:
        problems.append("experts narrower or wider than the dense MLP (one --ffn-hidden-size)")
    return problems


def check_model(model: ModelSpec) -> None:
    """Refuse models Megatron-DeepSpeed's GPT cannot express, before any layout is resolved or planned."""
    problems = _architecture_problems(model)
    if problems:
        raise UserError(
            f"--megatron: Megatron-DeepSpeed's GPT model cannot express {'; '.join(problems)} "
            f"({model.name}, {model.architecture})"
        )


def check_layout(model: ModelSpec, layout: Layout) -> None:
    """Refuse plans Megatron-DeepSpeed cannot run as planned (one line, naming the fix)."""
    if layout.optimizer != "adamw":
        raise UserError(
            f"--megatron: Megatron builds its own Adam (get_megatron_optimizer); --optimizer {layout.optimizer} "
            "exists only in dstk train; use --optimizer adamw"
        )
    if getattr(layout, "lora", None):  # the LoRA field arrives with the LoRA work (toolkit/plan/lora.py)
        raise UserError("--lora: Megatron-DeepSpeed's pretrain_gpt.py has no LoRA adapters; use dstk train")
    if model.n_layers % layout.pp:
        raise UserError(
            f"--pp: Megatron-DeepSpeed gives every pipeline stage the same number of layers; n_layers"
            f"({model.n_layers}) is not divisible by pp({layout.pp})"
        )
    if layout.tp > 1 and not layout.tp_vocab_parallel:
        raise UserError(
            "--tp-vocab-parallel: Megatron always splits the word embedding over TP (VocabParallelEmbedding), "
            "but the plan keeps it whole; drop --no-tp-vocab-parallel"
        )
    if layout.sp > 1 and layout.tp_sequence_parallel:
        raise UserError(
            "--sp: Megatron-DeepSpeed's --ds-sequence-parallel-size cannot be combined with --sequence-parallel "
            "(Megatron's TP sequence parallelism); use --no-tp-sequence-parallel or --sp 1"
        )
    problem = te_layer_builds(model, layout, layout.dp)
    if problem:
        raise UserError(problem)
    if model.is_moe and layout.zero_stage == 3:
        raise UserError(
            "--zero-stage: Megatron-DeepSpeed's MoE layers are DeepSpeed-MoE, which the engine refuses at ZeRO "
            "stage 3 ('Native DeepSpeed MoE is not supported with ZeRO Stage 3'); use --zero-stage 2 or lower"
        )


FP8_ARGS = (
    "--transformer-impl", "transformer_engine",
    "--fp8-hybrid",
    "--fp8-amax-history-len", "1024",
    "--fp8-amax-compute-algo", "max",
)  # fmt: skip
FP8_NOTE = (
    "fp8: Megatron-DeepSpeed builds Transformer Engine's DelayedScaling with interval and "
    "override_linear_precision, which need transformer-engine < 2.0"
)


def _num(x: float) -> str:
    """12 significant digits: `6e-05`, not the `5.9999999999999995e-05` of 6e-4 × 0.1."""
    return f"{x:.12g}"


def _partition_activations(layout: Layout) -> bool:
    return layout.tp > 1 and not layout.tp_sequence_parallel


def megatron_ds_config(cfg: dict[str, Any], layout: Layout) -> dict[str, Any]:
    """The plan's DeepSpeed config without what Megatron builds itself (module docstring)."""
    out = without_dstk_block(cfg)
    for key in _OWNED_BY_MEGATRON:
        out.pop(key, None)
    out["train_batch_size"] = layout.global_batch_size
    if "activation_checkpointing" in out:
        out["activation_checkpointing"]["partition_activations"] = _partition_activations(layout)
    return out


def _model_args(model: ModelSpec, layout: Layout) -> list[str]:
    args = [
        "--num-layers", str(model.n_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.n_heads),
    ]  # fmt: skip
    if model.n_kv_heads != model.n_heads:
        args += ["--num-key-value-heads", str(model.n_kv_heads)]
    if model.head_dim * model.n_heads != model.hidden_size:
        args += ["--kv-channels", str(model.head_dim)]
    args += [
        "--seq-length",
        str(model.seq_length),
        "--max-position-embeddings",
        str(model.max_position_embeddings),
    ]
    if model.norm == "rmsnorm":
        args += ["--normalization", "rmsnorm"]
    if model.position_embedding == "rope":
        args += ["--use-rotary-position-embeddings", "--no-position-embedding"]
    if model.gated_mlp:
        args.append("--swiglu")
    if not model.attention_bias:
        args.append("--disable-bias-linear")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    dropout = "0.1" if model.dropout else "0.0"  # HF GPT-2's 0.1; Llama-family models have none
    args += ["--attention-dropout", dropout, "--hidden-dropout", dropout]
    if layout.flash_attention and layout.precision != "fp8":  # fp8: TE's own fused attention
        args.append("--use-flash-attn-v2")  # needs the flash-attn package; CoreAttention otherwise
    if model.is_moe:
        from toolkit.plan.specs import DEFAULT_AUX_LOSS_COEF

        args += [
            "--num-experts", str(model.num_experts),
            "--topk", str(model.moe_top_k),
            "--expert-interval", str(model.moe_layer_interval),
            "--moe-expert-parallel-size", str(layout.ep),
            "--moe-train-capacity-factor", _num(model.moe_capacity_factor),
            "--moe-loss-coeff", _num(DEFAULT_AUX_LOSS_COEF),
        ]  # fmt: skip
        if layout.zero_stage > 0:
            args.append("--create-moe-param-group")  # "necessary for techniques like ZeRO" (its help text)
    return args


def _parallel_args(cluster: ClusterSpec, layout: Layout) -> list[str]:
    args = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(layout.pp),
    ]  # fmt: skip
    if layout.pp == 1:
        args.append("--no-pipeline-parallel")
    if layout.tp_sequence_parallel:
        args.append("--sequence-parallel")
    if layout.sp > 1:
        args += ["--ds-sequence-parallel-size", str(layout.sp)]
    if cluster.accelerator in _BACKENDS:
        args += ["--distributed-backend", _BACKENDS[cluster.accelerator]]
    return args


def schedule_args(cfg: dict[str, Any], layout: Layout) -> list[str]:
    """Batch, AdamW and the warm-up + cosine schedule: the numbers of the plan's DeepSpeed config, under the
    flag names Megatron-DeepSpeed and Megatron-LM share (megatron/training/arguments.py in both)."""
    adam, sched = cfg["optimizer"]["params"], cfg["scheduler"]["params"]
    lr = adam["lr"]
    return [
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.global_batch_size),
        "--train-iters", str(sched["total_num_steps"]),
        "--lr", _num(lr),
        "--min-lr", _num(lr * sched["cos_min_ratio"]),
        "--lr-decay-style", "cosine",
        "--lr-warmup-iters", str(sched["warmup_num_steps"]),
        "--weight-decay", _num(adam["weight_decay"]),
        "--adam-beta1", _num(adam["betas"][0]),
        "--adam-beta2", _num(adam["betas"][1]),
        "--adam-eps", _num(adam["eps"]),
        "--clip-grad", _num(cfg["gradient_clipping"]),
    ]  # fmt: skip


def _training_args(cfg: dict[str, Any], layout: Layout) -> list[str]:
    args = schedule_args(cfg, layout)
    if layout.precision != "fp32":
        args.append(f"--{engine_precision(layout.precision)}")
    if layout.precision == "fp8":
        args += FP8_ARGS
    if layout.recompute == "full":
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
        args.append("--deepspeed-activation-checkpointing")
        if _partition_activations(layout):
            args.append("--partition-activations")
    elif layout.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    return args


def megatron_args(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, cfg: dict[str, Any], ds_config_path: Path
) -> list[str]:
    """`pretrain_gpt.py` arguments for the plan; `cfg` is the plan's full DeepSpeed config (for the optimizer
    and schedule numbers), `ds_config_path` where the Megatron flavour of it is written."""
    args = _model_args(model, layout) + _parallel_args(cluster, layout) + _training_args(cfg, layout)
    if layout.offload_optimizer != "none":
        args.append("--cpu-optimizer")
    if layout.offload_param != "none":
        args += ["--remote-device", layout.offload_param, "--use-pin-memory"]
    args += ["--zero-stage", str(layout.zero_stage), "--deepspeed", "--deepspeed_config"]
    return [*args, str(ds_config_path.resolve())]
