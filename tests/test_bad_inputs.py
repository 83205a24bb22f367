"""The bad-input catalogue: every user mistake exits 2 with one line naming the problem — no traceback, and no
partial output file left behind. Inputs live in tests/bad/ (one file per mistake) or are flags."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.cli import REPO, dstk
from toolkit.launcher.lock import lock_folder

BAD = REPO / "tests" / "bad"
TINY = str(REPO / "tests" / "models" / "tiny-test-gpt2.yaml")
TINY_LLAMA = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")


def _resume_launch(steps: str, resume: str) -> list[str]:
    """`dstk launch --dry-run` of a 2-rank job resuming tests/bad/ckpt (written by 1 rank at step 10)."""
    job = ["launch", "--cluster", "cpu", "--config", f"{BAD}/micro1.json", "--run-dir", "{out}", "--dry-run"]
    return [
        *job,
        "--",
        "--model",
        TINY,
        "--steps",
        steps,
        "--checkpoint-dir",
        f"{BAD}/ckpt",
        "--resume",
        resume,
    ]


# (id, argv with {out} for an output path that must not exist afterwards, pattern the one line must match)
CASES: list[tuple[str, list[str], str]] = [
    # fp8: FP8 tensor cores, and what each runtime converts
    (
        "fp8-on-a100",
        ["estimate", "--model", "llama-7b", "--cluster", "dgx-a100-80g", "--precision", "fp8"],
        r"--precision: fp8 needs FP8 tensor cores .* dgx-a100-80g has no FP8 tensor cores; GPUs with FP8: h100",
    ),
    (
        "fp8-on-cpu",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--precision", "fp8"],
        r"cluster cpu is cpu, not CUDA; GPUs with FP8",
    ),
    (
        "allow-fp8-on-v100",
        ["plan", "--model", "llama-7b", "--cluster", "v100-32g", "--allow-fp8"],
        r"--allow-fp8: fp8 needs FP8 tensor cores .* v100-32g has no FP8 tensor cores",
    ),
    (
        "allow-fp8-with-a-precision",
        ["plan", "--model", "llama-7b", "--cluster", "dgx-h100", "--allow-fp8", "--precision", "fp8"],
        r"--allow-fp8: --precision fp8 pins the precision; drop one",
    ),
    (
        "fp8-megatron-gqa",
        [
            "config",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100",
            "--precision",
            "fp8",
            "--megatron",
            "-o",
            "{out}",
        ],
        r"Transformer Engine's TransformerLayer\) cannot run llama3-8b as planned: grouped-query attention",
    ),
    (
        "fp8-hf-trainer",
        [
            "config",
            "--model",
            TINY_LLAMA,
            "--cluster",
            "dgx-h100",
            "--precision",
            "fp8",
            "--hf-trainer",
            "-o",
            "{out}",
        ],
        r"--hf-trainer: fp8 is dstk train's torchao.float8 conversion",
    ),
    (
        "fp8-gpt2-conv1d",
        ["config", "--model", "gpt2", "--cluster", "dgx-h100", "--precision", "fp8", "-o", "{out}"],
        r"dstk train's fp8 \(torchao.float8\) converts the nn.Linear .* gpt2 projections are Conv1D",
    ),
    (
        "launch-fp8-on-cpu",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/fp8_h100_2_ranks.json",
            "--run-dir",
            "{out}",
            "--dry-run",
            "--",
            "--model",
            TINY_LLAMA,
            "--steps",
            "2",
            "--snapshot-every",
            "0",
        ],
        r"^dstk launch: error: --config: its layout is fp8: fp8 needs FP8 tensor cores .* cluster cpu is cpu",
    ),
    # model descriptions
    (
        "unknown-model-preset",
        ["estimate", "--model", "gpt-5", "--cluster", "cpu"],
        r"--model: 'gpt-5' is neither a preset",
    ),
    (
        "misspelt-model-field",
        ["estimate", "--model", f"{BAD}/misspelt_model.yaml", "--cluster", "cpu"],
        r"n_layer: unknown field \(did you mean n_layers",
    ),
    (
        "negative-layers",
        ["estimate", "--model", f"{BAD}/negative_layers.yaml", "--cluster", "cpu"],
        r"n_layers: input should be greater than 0",
    ),
    (
        "zero-hidden",
        ["estimate", "--model", f"{BAD}/zero_hidden.yaml", "--cluster", "cpu"],
        r"hidden_size: input should be greater than 0",
    ),
    (
        "heads-not-dividing-hidden",
        ["estimate", "--model", f"{BAD}/heads_not_dividing.yaml", "--cluster", "cpu"],
        r"not divisible by n_heads\(5\)",
    ),
    ("kv-heads", ["estimate", "--model", f"{BAD}/kv_heads.yaml", "--cluster", "cpu"], r"n_kv_heads"),
    (
        "malformed-yaml",
        ["estimate", "--model", f"{BAD}/malformed.yaml", "--cluster", "cpu"],
        r"malformed YAML at line \d+",
    ),
    (
        "yaml-not-a-mapping",
        ["estimate", "--model", f"{BAD}/list.yaml", "--cluster", "cpu"],
        r"expected a mapping",
    ),
    (
        "missing-model-file",
        ["estimate", "--model", f"{BAD}/absent.yaml", "--cluster", "cpu"],
        r"absent.yaml: file not found",
    ),
    ("model-is-a-directory", ["estimate", "--model", str(BAD), "--cluster", "cpu"], r"is a directory"),
    (
        "unsupported-hf-architecture",
        ["estimate", "--model", f"{BAD}/t5_config.json", "--cluster", "cpu"],
        r"model_type: 't5' is not a causal language model",
    ),
    (
        # Phi3Config's default pad_token_id (32000) outside a small vocabulary: transformers' embedding refuses it
        "hf-config-pad-outside-vocabulary",
        ["estimate", "--model", f"{BAD}/pad_outside_vocab", "--cluster", "cpu"],
        r"pad_token_id: 32000 is outside the vocabulary \(vocab_size 512\)",
    ),
    (
        "params-out-of-range",
        ["estimate", "--params", "1e20", "--cluster", "cpu"],
        r"--params: 1e\+20 is out of range",
    ),
    (
        "params-not-a-number",
        ["estimate", "--params", "lots", "--cluster", "cpu"],
        r"argument --params: .lots. is not a parameter count; write e.g. 175e9, 7B or 1.3T",
    ),
    (
        "one-expert",
        ["estimate", "--model", f"{BAD}/one_expert.yaml", "--cluster", "cpu"],
        r"num_experts: 1 expert",
    ),
    (
        "top-k-above-experts",
        ["estimate", "--model", f"{BAD}/topk.yaml", "--cluster", "cpu"],
        r"moe_top_k: 3 exceeds",
    ),
    (
        "sequence-beyond-positions",
        ["estimate", "--model", f"{BAD}/seq_too_long.yaml", "--cluster", "cpu"],
        r"seq_length: 128 exceeds max_position_embeddings",
    ),
    (
        "seq-length-override-zero",
        ["estimate", "--model", "gpt2", "--seq-length", "0", "--cluster", "cpu"],
        r"^dstk estimate: error: --seq-length: input should be greater than 0 \(got 0\)",
    ),
    # cluster descriptions
    (
        "unknown-cluster-preset",
        ["estimate", "--model", "gpt2", "--cluster", "tpu-v5"],
        r"--cluster: 'tpu-v5' is neither a preset",
    ),
    (
        "misspelt-cluster-field",
        ["estimate", "--model", "gpt2", "--cluster", f"{BAD}/misspelt_cluster.yaml"],
        r"gpus_per_nod: unknown field",
    ),
    (
        "negative-nodes",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--nodes", "-3"],
        r"nodes: input should be greater than 0",
    ),
    (
        "zero-gpu-memory",
        ["estimate", "--model", "gpt2", "--cluster", f"{BAD}/zero_memory.yaml"],
        r"gpu_memory_gib: input should be greater than 0",
    ),
    (
        "unknown-accelerator",
        ["estimate", "--model", "gpt2", "--cluster", f"{BAD}/bad_accelerator.yaml"],
        r"accelerator: input should be",
    ),
    (
        "hostname-count",
        ["estimate", "--model", "gpt2", "--cluster", f"{BAD}/hostnames_count.yaml"],
        r"hostnames: 1 names given for nodes\(2\)",
    ),
    (
        "efficiency-above-one",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--gpu-matmul-efficiency", "1.5"],
        r"^dstk estimate: error: --gpu-matmul-efficiency: input should be less than or equal to 1 \(got 1.5\)",
    ),
    # layouts
    (
        "tp-not-dividing-heads",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--tp", "8"],
        r"--tp: n_heads\(12\)",
    ),
    (
        "world-not-divisible",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--tp", "3"],
        r"is not divisible by tp\(3\)",
    ),
    (
        "global-batch-not-divisible",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--global-batch", "20"],
        r"global_batch_size\(20\) is not divisible",
    ),
    (
        "grad-accum-disagrees",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--global-batch", "64", "--grad-accum", "3"],
        r"!= global_batch_size\(64\)",
    ),
    (
        "micro-batch-zero",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--micro-batch", "0"],
        r"--micro-batch: input should be greater than 0",
    ),
    (
        "zero-stage-choice",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--zero-stage", "5"],
        r"argument --zero-stage: invalid choice",
    ),
    (
        "pp-beyond-layers",
        ["estimate", "--model", TINY, "--cluster", "dgx-h100", "--pp", "4"],
        r"--pp: pp\(4\) exceeds n_layers\(2\)",
    ),
    (
        "pipeline-with-zero2",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--pp", "2", "--zero-stage", "2"],
        r"only with ZeRO stage 0 or 1",
    ),
    (
        "param-offload-below-zero3",
        [
            "estimate",
            "--model",
            "gpt2",
            "--cluster",
            "dgx-h100",
            "--zero-stage",
            "1",
            "--offload-param",
            "cpu",
        ],
        r"needs ZeRO stage 3",
    ),
    (
        "nvme-without-nvme",
        [
            "estimate",
            "--model",
            "gpt2",
            "--cluster",
            "dgx-h100",
            "--nvme-gib",
            "0",
            "--zero-stage",
            "3",
            "--offload-param",
            "nvme",
        ],
        r"nvme_gib=0",
    ),
    (
        "fp16-on-cpu",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--precision", "fp16"],
        r"fp16 is not supported on cpu",
    ),
    (
        "ep-on-dense",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-h100", "--ep", "2"],
        r"needs an MoE model",
    ),
    (
        "zeropp-on-cpu",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--zero-stage", "3", "--zeropp"],
        r"need CUDA",
    ),
    (
        "onebit-with-zero",
        [
            "estimate",
            "--model",
            "gpt2",
            "--cluster",
            "dgx-h100",
            "--zero-stage",
            "1",
            "--optimizer",
            "onebit-adam",
        ],
        r"needs ZeRO stage 0",
    ),
    (
        "autotp-gpt2-config",
        ["config", "--model", "gpt2", "--cluster", "dgx-h100", "--tp", "2", "-o", "{out}"],
        r"AutoTP cannot shard gpt2",
    ),
    (
        "bad-memory-margin",
        ["plan", "--model", "gpt2", "--cluster", "cpu", "--memory-margin", "1.5", "--report", "{out}"],
        r"--memory-margin: 1.5 must be in",
    ),
    (
        "bad-elastic-range",
        ["plan", "--model", "gpt2", "--cluster", "cpu", "--elastic", "8..2"],
        r"--elastic: '8..2' is not MIN..MAX",
    ),
    (
        "nothing-fits",
        ["plan", "--model", "gpt-1t", "--cluster", "cpu", "--report", "{out}"],
        r"does not fit on 1 × cpu",
    ),
    # DeepSpeed configs
    (
        "validate-malformed-json",
        ["validate", f"{BAD}/broken.json", "--world-size", "2"],
        r"broken.json: malformed config at line \d+: .*neither JSON nor hjson",
    ),
    (
        "validate-duplicate-key",
        ["validate", f"{BAD}/duplicate_keys.json", "--world-size", "2"],
        r"duplicate key 'stage' \(DeepSpeed refuses duplicate keys\)",
    ),
    (
        "validate-unfilled-template",
        ["validate", f"{BAD}/template.json", "--world-size", "2"],
        r"train_batch_size: CONFIG_BATCH_SIZE is an unfilled template placeholder \(and 1 more: CONFIG_MBSIZE\)",
    ),
    ("validate-wrong-types", ["validate", f"{BAD}/wrong_types.json", "--world-size", "2"], r"2 problem"),
    (
        "validate-bogus-accelerator",
        ["validate", f"{BAD}/bad_batch.json", "--world-size", "2", "--accelerator", "tpu9"],
        r"--accelerator: invalid choice: 'tpu9'",
    ),
    (
        "estimate-config-wrong-type",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--config", f"{BAD}/wrong_types.json"],
        r'--config: train_batch_size: "8" is not a positive integer',
    ),
    (
        "estimate-config-auto-needs-a-flag",
        [
            "estimate",
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-a100-80g",
            "--config",
            str(REPO / "tests/data/real_configs/transformers__tests_deepspeed_ds_config_zero3.json"),
        ],
        r'--config: train_micro_batch_size_per_gpu is "auto" .*; give --micro-batch',
    ),
    (
        "estimate-config-batch",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--config", f"{BAD}/bad_batch.json"],
        r"--config: train_batch_size: 30 is not a positive multiple of train_micro_batch_size_per_gpu\(4\) × 2",
    ),
    (
        "launch-refuses-a-bad-config",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/bad_batch.json",
            "--run-dir",
            "{out}",
            "--dry-run",
            *("--", "--model", TINY, "--steps", "5"),
        ],
        r"--config: train_batch_size: 30 is not a positive multiple",
    ),
    (
        "launch-resume-from-another-world",
        _resume_launch("20", "auto"),
        r"--resume: .*step00000010 was written by 1 ranks and this job has 2; convert it first: dstk checkpoint",
    ),
    (
        "launch-resume-with-nothing-to-do",
        _resume_launch("10", "auto"),
        r"--steps: the checkpoint .*step00000010 is at step 10 already, so --steps 10 leaves nothing to train",
    ),
    (
        "launch-resume-missing-tag",
        _resume_launch("20", "step99"),
        r"--resume: .*step99 is not a complete checkpoint \(no such checkpoint\); complete ones: step00000010",
    ),
    (
        "abbreviated-flag",
        ["estimate", "--model", "gpt2", "--cluster", "cpu", "--gpus", "16"],
        r"unrecognized arguments: --gpus 16",
    ),
    (
        "data-empty-validation-split",
        [
            "data",
            "prepare",
            "--input",
            f"{BAD}/tiny_corpus.jsonl",
            "--out",
            "{out}",
            "--train-tokenizer",
            "300",
            "--seq-length",
            "64",
            "--min-words",
            "1",
        ],
        r"--validation-fraction: 0.02 of 2 documents leaves no validation row of 64 tokens",
    ),
    (
        "plan-excluded-by-rules",
        [
            "plan",
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-a100-80g",
            "--nodes",
            "16",
            "--tp",
            "8",
            "--pp",
            "16",
        ],
        r"no layout of llama-7b meets the rules .*--target megatron lifts them.*hf_pipeline_is_data_parallel_only",
    ),
    (
        "config-unwritable-output",
        ["config", "--model", "gpt2", "--cluster", "cpu", "-o", "/proc/dstk-forbidden/ds.json"],
        r"^dstk config: error: -o: cannot create /proc/dstk-forbidden/ds.json: No such file or directory",
    ),
    (
        "plan-unwritable-report",
        ["plan", "--model", "gpt2", "--cluster", "cpu", "--report", "/proc/dstk-forbidden/report"],
        r"^dstk plan: error: --report: cannot create /proc/dstk-forbidden/report: No such file or directory",
    ),
    (
        "data-unwritable-output",
        ["data", "generate", "--out", "/proc/dstk-forbidden/raw", "--docs-per-domain", "10"],
        r"--out: cannot create /proc/dstk-forbidden/raw",
    ),
    (
        "validate-missing-file",
        ["validate", f"{BAD}/absent.json", "--world-size", "2"],
        r"absent.json: file not found",
    ),
    (
        "validate-world-size-zero",
        ["validate", f"{BAD}/bad_batch.json", "--world-size", "0"],
        r"--world-size: 0 must be a positive",
    ),
    ("validate-bad-batch", ["validate", f"{BAD}/bad_batch.json", "--world-size", "2"], r"1 problem"),
    (
        "train-missing-config",
        ["train", "--model", TINY, "--config", f"{BAD}/absent.json", "--run-dir", "{out}"],
        r"--config: .*absent.json not found",
    ),
    (
        "train-no-steps",
        ["train", "--model", TINY, "--config", f"{BAD}/bad_batch.json", "--run-dir", "{out}"],
        r"--steps: give a positive number",
    ),
    (
        "train-resume-needs-dir",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--resume",
            "step00000002",
            "--run-dir",
            "{out}",
        ],
        r"--resume: needs --checkpoint-dir",
    ),
    (
        "train-snapshots-need-a-checkpoint-dir",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--snapshot-every",
            "2",
        ],
        r"--snapshot-every: needs --checkpoint-dir",
    ),
    (
        "train-negative-snapshot-interval",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--snapshot-every",
            "-1",
        ],
        r"--snapshot-every: must not be negative",
    ),
    (
        "train-snapshots-beyond-dev-shm",
        [
            "train",
            "--model",
            "llama-70b",
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--checkpoint-dir",
            "{out}",
            "--snapshot-every",
            "2",
        ],
        r"--snapshot-every: the shared-memory tier needs [\d,.]+ GiB in /dev/shm .*[KMG]iB free",
    ),
    (
        "train-init-from-missing",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--init-from",
            f"{BAD}/absent",
            "--run-dir",
            "{out}",
        ],
        r"--init-from: .*absent not found",
    ),
    (
        "train-init-from-other-model",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--init-from",
            f"{BAD}/other_model",
            "--run-dir",
            "{out}",
        ],
        r"--init-from: .* holds a different model than --model .*n_layer=3 \(--model: 2\)",
    ),
    (
        "train-data-missing",
        [
            "train",
            "--model",
            TINY,
            "--config",
            f"{BAD}/bad_batch.json",
            "--steps",
            "2",
            "--data",
            f"{BAD}/absent",
            "--run-dir",
            "{out}",
        ],
        r"--data: .*absent not found",
    ),
    # hostfiles and launches
    (
        "hostile-hostname",
        [
            "launch",
            "--cluster",
            f"{BAD}/hostile_host.yaml",
            "--config",
            f"{BAD}/bad_batch.json",
            "--dry-run",
            "--run-dir",
            "{out}",
        ],
        r"'b && reboot' is not a valid hostname",
    ),
    (
        "multi-node-without-hostnames",
        [
            "launch",
            "--cluster",
            "dgx-h100",
            "--nodes",
            "2",
            "--config",
            f"{BAD}/bad_batch.json",
            "--dry-run",
            "--run-dir",
            "{out}",
        ],
        r"list their hostnames",
    ),
    (
        "include-and-exclude",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/bad_batch.json",
            "--include",
            "localhost:0",
            "--exclude",
            "localhost:1",
            "--dry-run",
            "--run-dir",
            "{out}",
        ],
        r"give one, not both",
    ),
    (
        "launch-without-config",
        ["launch", "--cluster", "cpu", "--dry-run", "--run-dir", "{out}"],
        r"--config: dstk train needs",
    ),
    (
        "negative-restarts",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/bad_batch.json",
            "--max-restarts",
            "-1",
            "--run-dir",
            "{out}",
        ],
        r"--max-restarts: must not be negative",
    ),
    # data
    (
        "data-missing-input",
        ["data", "prepare", "--input", f"{BAD}/absent.jsonl", "--out", "{out}", "--train-tokenizer", "300"],
        r"absent.jsonl",
    ),
    (
        "data-seq-length-one",
        [
            "data",
            "prepare",
            "--input",
            f"{BAD}/list.yaml",
            "--out",
            "{out}",
            "--seq-length",
            "1",
            "--train-tokenizer",
            "300",
        ],
        r"--seq-length: 1 must be at least 2",
    ),
    (
        "data-tiny-vocab",
        ["data", "prepare", "--input", f"{BAD}/list.yaml", "--out", "{out}", "--train-tokenizer", "10"],
        r"--train-tokenizer: vocabulary 10",
    ),
    (
        "data-needs-a-tokenizer",
        ["data", "prepare", "--input", f"{BAD}/list.yaml", "--out", "{out}"],
        r"one of the arguments --tokenizer --train-tokenizer is required",
    ),
    # checkpoints
    (
        "export-missing-checkpoint",
        ["export", "--model", TINY, "--checkpoint", f"{BAD}/absent", "--out", "{out}"],
        r"--checkpoint: .*absent not found",
    ),
    (
        "export-no-complete-checkpoint",
        ["export", "--model", TINY, "--checkpoint", str(BAD), "--out", "{out}"],
        r"holds no complete checkpoint",
    ),
    (
        "convert-no-complete-checkpoint",
        ["checkpoint", "convert", "--checkpoint", str(BAD), "--out", "{out}"],
        r"holds no complete checkpoint",
    ),
]


LAUNCH = ["launch", "--cluster", "cpu", "--config", f"{BAD}/micro1.json", "--run-dir", "{out}"]
TRAIN = ["--model", TINY, "--steps", "5"]
# the first hour (#33): each class of mistake a newcomer made, caught before any rank starts or file is written
CASES += [
    # a file taken for another
    (
        "cluster-is-the-gpu-table",
        [
            "estimate",
            "--model",
            "tiny-gpt2",
            "--cluster",
            str(REPO / "toolkit" / "plan" / "presets" / "gpus.yaml"),
        ],
        r"^dstk estimate: error: --cluster: .*gpus.yaml looks like a table of GPUs \(a100-sxm4-80gb, .*gpu: a100-sxm4-80gb",
    ),
    # the train command's mistakes, before any rank starts
    (
        "launch-config-given-after-the-double-dash",
        [
            "launch",
            "--cluster",
            "cpu",
            "--gpus-per-node",
            "2",
            "--dry-run",
            "--run-dir",
            "{out}",
            "--",
            "--model",
            "tiny-gpt2",
            "--config",
            "ds.json",
            "--steps",
            "5",
        ],
        r"^dstk launch: error: --config: give it to dstk launch, before --",
    ),
    (
        "train-steps-zero",
        [
            "launch",
            "--cluster",
            "cpu",
            "--gpus-per-node",
            "2",
            "--dry-run",
            "--config",
            str(REPO / "ds_configs" / "cpu_demo_tiny_gpt2_2_ranks.json"),
            "--run-dir",
            "{out}",
            "--",
            "--model",
            "tiny-gpt2",
            "--steps",
            "0",
        ],
        r"^dstk launch: error: --steps: 0 must be positive",
    ),
    (
        "train-init-from-a-folder-without-config-json",
        [
            "launch",
            "--cluster",
            "cpu",
            "--gpus-per-node",
            "2",
            "--dry-run",
            "--config",
            str(REPO / "ds_configs" / "cpu_demo_tiny_gpt2_2_ranks.json"),
            "--run-dir",
            "{out}",
            "--",
            "--model",
            "tiny-gpt2",
            "--steps",
            "5",
            "--init-from",
            str(REPO / "docs"),
        ],
        r"^dstk launch: error: --init-from: .*docs has no config.json",
    ),
    # a check of the description that a flag failed: named by the flag, not by the preset
    (
        "seq-length-beyond-the-positions-named-by-its-flag",
        ["estimate", "--model", "tiny-gpt2", "--cluster", "cpu", "--seq-length", "100000"],
        r"^dstk estimate: error: --seq-length: 100000 exceeds max_position_embeddings\(128\)$",
    ),
    # knobs that price other stacks' runs: the planner cannot honour them, so it refuses them
    (
        "plan-with-a-knob-it-does-not-plan",
        ["plan", "--model", "llama-7b", "--cluster", "dgx-h100", "--comm-overlap"],
        r"^dstk plan: error: --comm-overlap: the planner neither searches nor pins this knob; price a layout "
        r"with it with dstk estimate$",
    ),
    (
        "config-plan-with-fsdp-knobs",
        [
            "config",
            "--plan",
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-h100",
            "--fsdp",
            "bf16",
            "--fsdp-backward-prefetch",
            "post",
            "-o",
            "{out}",
        ],
        r"^dstk config: error: --fsdp, --fsdp-backward-prefetch: the planner neither searches nor pins these knobs",
    ),
    (
        "plan-with-torchtitans-op-recomputation",
        ["plan", "--model", "llama-7b", "--cluster", "dgx-h100", "--recompute", "ops"],
        r"^dstk plan: error: --recompute ops: the planner neither searches nor pins this knob",
    ),
    (
        "config-with-torchtitans-op-recomputation",
        ["config", "--model", "llama-7b", "--cluster", "dgx-h100", "--recompute", "ops", "-o", "{out}"],
        r"^dstk config: error: --recompute ops: torchtitan's op-level selective checkpointing, priced with --fsdp",
    ),
    # batch arithmetic: a pinned micro-batch that splits the global batch on no layout
    (
        "plan-micro-batch-that-divides-no-per-rank-batch",
        ["plan", "--model", "llama-7b", "--cluster", "dgx-h100", "--global-batch", "7", "--micro-batch", "2"],
        r"^dstk plan: error: --global-batch: 7 cannot be split into micro-batches of 2 on 8 GPUs",
    ),
    (
        "config-plan-micro-batch-that-divides-no-per-rank-batch",
        [
            "config",
            "--plan",
            "--model",
            "llama-7b",
            "--cluster",
            "dgx-h100",
            "--global-batch",
            "7",
            "--micro-batch",
            "2",
            "-o",
            "{out}",
        ],
        r"^dstk config: error: --global-batch: 7 cannot be split",
    ),
    # help and flags
    (
        "verb-flag-misspelt-named-by-its-verb",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--micro-bach", "2"],
        r"^dstk estimate: error: unrecognized arguments: --micro-bach 2 \(did you mean: --micro-bach → --micro-batch\?\)",
    ),
    (
        "calibrate-unknown-flag",
        ["calibrate", "--bogus"],
        r"^dstk calibrate: error: unrecognized arguments: --bogus",
    ),
    (
        "params-with-a-bad-suffix",
        ["estimate", "--params", "7X", "--cluster", "cpu"],
        r"'7X' is not a parameter count",
    ),
    # paths taken for something else
    (
        "model-is-a-deepspeed-config",
        ["estimate", "--model", f"{REPO}/ds_configs/zero3_llama7b_1x8_a100_80g.json", "--cluster", "cpu"],
        r"^dstk estimate: error: --model: .* looks like a DeepSpeed config \(train_batch_size.*give it as --config",
    ),
    (
        "model-preset-in-other-case",
        ["estimate", "--model", "LLaMA-7B", "--cluster", "cpu"],
        r"did you mean llama-7b\?",
    ),
    (
        "config-output-is-a-folder",
        ["config", "--model", "gpt2", "--cluster", "cpu", "-o", str(BAD)],
        r"^dstk config: error: -o: .*tests/bad is a folder; give a file name",
    ),
    (
        "plan-report-is-a-folder",
        ["plan", "--model", "gpt2", "--cluster", "cpu", "--report", str(BAD)],
        r"^dstk plan: error: --report: .*tests/bad is a folder",
    ),
    (
        "launch-slurm-script-is-a-folder",
        [*LAUNCH, "--slurm", str(BAD), "--", *TRAIN],
        r"^dstk launch: error: --slurm: .*tests/bad is a folder",
    ),
    (
        "launch-config-is-a-folder",
        ["launch", "--cluster", "cpu", "--config", str(BAD), "--run-dir", "{out}", "--dry-run", "--", *TRAIN],
        r"^dstk launch: error: --config: .*tests/bad is a folder; expected a DeepSpeed JSON config",
    ),
    (
        "export-a-tag-folder-as-the-checkpoint-folder",
        ["export", "--model", TINY, "--checkpoint", f"{BAD}/ckpt/step00000010", "--out", "{out}"],
        r"is one checkpoint, not a folder of them; give --checkpoint .*ckpt --tag step00000010",
    ),
    (
        "convert-a-tag-that-is-not-there",
        ["checkpoint", "convert", "--checkpoint", f"{BAD}/ckpt", "--tag", "step00000099", "--out", "{out}"],
        r"^dstk checkpoint: error: --tag: .*ckpt has no checkpoint step00000099",
    ),
    # checked before any rank starts or a script is written
    (
        "launch-train-flag-misspelt",
        [*LAUNCH, "--dry-run", "--", "--model", TINY, "--stepz", "100"],
        r"^dstk launch: after --: dstk train: error: unrecognized arguments: --stepz 100 \(did you mean: --stepz → --steps\?\)",
    ),
    (
        "slurm-script-not-written-for-a-train-typo",
        [*LAUNCH, "--slurm", "{out}", "--", "--model", TINY, "--stepz", "100"],
        r"unrecognized arguments: --stepz",
    ),
    (
        "launch-data-never-prepared",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--data", f"{BAD}/raw_corpus"],
        r"^dstk launch: error: --data: .*raw_corpus has no manifest.json \(it holds docs.jsonl\); make it with dstk data prepare",
    ),
    (
        "launch-data-vocabulary-larger-than-the-model",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--data", f"{BAD}/data_big_vocab"],
        r"--data: tokenizer vocabulary 99999 exceeds the model's vocab_size 512; prepare the data with --train-tokenizer 512",
    ),
    (
        "launch-checkpoint-dir-unwritable",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--checkpoint-dir", "/proc/dstk-ckpt"],
        r"^dstk launch: error: --checkpoint-dir: cannot create /proc/dstk-ckpt",
    ),
    (
        "launch-checkpoint-dir-is-a-file",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--checkpoint-dir", f"{BAD}/micro1.json"],
        r"--checkpoint-dir: .*micro1.json is a file; give a folder",
    ),
    (
        "launch-run-dir-unwritable",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--run-dir", "/proc/dstk-run"],
        r"^dstk launch: error: --run-dir: cannot create /proc/dstk-run",
    ),
    (
        "launch-save-every-without-a-checkpoint-dir",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--save-every", "2"],
        r"--save-every: needs --checkpoint-dir",
    ),
    (
        "launch-resume-without-a-checkpoint-dir",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--resume", "auto"],
        r"--resume: needs --checkpoint-dir",
    ),
    # flags named, not the preset they override
    (
        "nodes-negative-named-by-its-flag",
        ["estimate", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--nodes", "-2"],
        r"^dstk estimate: error: --nodes: input should be greater than 0 \(got -2\)$",
    ),
    (
        "gpus-zero-named-by-its-flag",
        ["plan", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--gpus-per-node", "0"],
        r"^dstk plan: error: --gpus-per-node: input should be greater than 0",
    ),
]

SCRIPT = f"{BAD}/train_script.py"  # never run: the launch is refused first
# the second newcomer pass (#46): state lost without a word, each class a few ways
CASES += [
    # checkpoints clobbered: a folder with checkpoints is resumed or started over, never written over silently
    (
        "relaunch-into-checkpoints-without-resume",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--checkpoint-dir", f"{BAD}/ckpt"],
        r"^dstk launch: error: --checkpoint-dir: .*ckpt holds checkpoints \(step00000010\) and --resume is never: "
        r"continue them with --resume auto, or start over in a new folder or with --overwrite-checkpoints",
    ),
    (
        "slurm-script-not-written-over-checkpoints",
        [*LAUNCH, "--slurm", "{out}", "--", *TRAIN, "--checkpoint-dir", f"{BAD}/ckpt"],
        r"--checkpoint-dir: .*ckpt holds checkpoints \(step00000010\) and --resume is never",
    ),
    (
        "relaunch-with-resume-never-said-aloud",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--checkpoint-dir", f"{BAD}/ckpt", "--resume", "never"],
        r"--checkpoint-dir: .*holds checkpoints \(step00000010\) and --resume is never",
    ),
    (
        "overwrite-checkpoints-and-resume",
        [
            *LAUNCH,
            "--dry-run",
            "--",
            *TRAIN,
            "--checkpoint-dir",
            f"{BAD}/ckpt",
            "--resume",
            "auto",
            "--overwrite-checkpoints",
        ],
        r"--overwrite-checkpoints: starts over from step 0, --resume auto continues; give one",
    ),
    # a folder the user owns is not written over
    (
        "data-generate-into-a-folder-of-the-users",
        ["data", "generate", "--out", f"{BAD}/raw_corpus"],
        r"^dstk data: error: --out: .*raw_corpus already holds files \(docs.jsonl\); give an empty or new folder, "
        r"or --overwrite",
    ),
    (
        "data-prepare-into-a-folder-of-the-users",
        [
            "data",
            "prepare",
            "--input",
            f"{BAD}/tiny_corpus.jsonl",
            "--out",
            f"{BAD}/raw_corpus",
            "--train-tokenizer",
            "300",
        ],
        r"--out: .*raw_corpus already holds files \(docs.jsonl\); give an empty or new folder, or --overwrite",
    ),
    (
        "export-into-a-folder-of-the-users",
        ["export", "--model", TINY, "--checkpoint", f"{BAD}/ckpt", "--out", f"{BAD}/raw_corpus"],
        r"^dstk export: error: --out: .*raw_corpus already holds files \(docs.jsonl\)",
    ),
    # found late before: each now one line before any rank starts
    (
        "estimate-config-with-fp16-and-bf16",
        ["estimate", "--model", TINY, "--cluster", "dgx-a100-80g", "--config", f"{BAD}/fp16_and_bf16.json"],
        r"^dstk estimate: error: --config: fp16.enabled, bf16.enabled: both true; DeepSpeed refuses that",
    ),
    (
        "estimate-config-with-fp16-on-cpu",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--config", f"{BAD}/fp16_and_bf16.json"],
        r"--config: fp16.enabled, bf16.enabled: both true; .* \(and 1 more: dstk validate",
    ),
    (
        "estimate-config-with-a-batch-validate-refuses",
        ["estimate", "--model", TINY, "--cluster", "cpu", "--config", f"{BAD}/bad_batch.json"],
        r"^dstk estimate: error: --config: train_batch_size",
    ),
    (
        "launch-a-script-with-a-config-that-is-not-there",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            "nope.json",
            "--run-dir",
            "{out}",
            "--dry-run",
            "--",
            SCRIPT,
        ],
        r"^dstk launch: error: --config: nope.json not found$",
    ),
    (
        "launch-a-script-with-a-config-deepspeed-refuses",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/bad_batch.json",
            "--run-dir",
            "{out}",
            "--dry-run",
            "--",
            SCRIPT,
            "--lr",
            "1e-4",
        ],
        r"^dstk launch: error: --config: train_batch_size",
    ),
    (
        "launch-a-module-with-a-config-deepspeed-refuses",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/bad_batch.json",
            "--run-dir",
            "{out}",
            "--dry-run",
            "--",
            "-m",
            "my_project.train",
        ],
        r"^dstk launch: error: --config: train_batch_size",
    ),
    # SLURM as SLURM users run it
    (
        "slurm-job-without-a-checkpoint-folder",
        [*LAUNCH, "--slurm", "{out}", "--", *TRAIN],
        r"^dstk launch: error: --checkpoint-dir: a SLURM job of dstk train saves there when the time limit nears",
    ),
    (
        "slurm-job-of-a-real-model-without-data",
        [
            "launch",
            "--cluster",
            "cpu",
            "--config",
            f"{BAD}/micro1.json",
            "--run-dir",
            "{out}",
            "--slurm",
            "{out}",
            "--",
            "--model",
            "llama-7b",
            "--steps",
            "5",
            "--checkpoint-dir",
            "{out}",
        ],
        r"--data: none given, so every run of the job would train llama-7b \(6.74B parameters\) on the generated "
        r"demo corpus",
    ),
    (
        "slurm-job-with-include",
        [*LAUNCH, "--slurm", "{out}", "--include", "node1", "--", *TRAIN, "--checkpoint-dir", "{out}"],
        r"^dstk launch: error: --include: not with --slurm: SLURM chooses the nodes",
    ),
    (
        "slurm-time-in-words",
        [*LAUNCH, "--slurm", "{out}", "--time", "2 days", "--", *TRAIN, "--checkpoint-dir", "{out}"],
        r"^dstk launch: error: --time: '2 days' cannot go into an #SBATCH line",
    ),
    (
        "config-tokens-not-a-count",
        ["config", "--model", TINY, "--cluster", "cpu", "--tokens", "300 billion", "-o", "{out}"],
        r"^dstk config: error: --tokens: '300 billion' is not a token count; write e.g. 300e9, 3e11, 300B",
    ),
    (
        "config-tokens-and-train-steps",
        [
            "config",
            "--model",
            TINY,
            "--cluster",
            "cpu",
            "--tokens",
            "3B",
            "--train-steps",
            "10",
            "-o",
            "{out}",
        ],
        r"--tokens: sizes the schedule as --train-steps does; give one",
    ),
    # conventions
    (
        "misspelt-verb",
        ["estiamte", "--model", TINY, "--cluster", "cpu"],
        r"^dstk: error: argument VERB: invalid choice: 'estiamte' .*; did you mean estimate\?$",
    ),
    (
        "misspelt-verb-launch",
        ["lanuch", "--cluster", "cpu"],
        r"invalid choice: 'lanuch' .*; did you mean launch\?$",
    ),
    (
        "train-flag-before-the-dashes",
        [*LAUNCH, "--steps", "100", "--dry-run", "--", "--model", TINY],
        r"^dstk launch: error: --steps: a dstk train flag: put it after -- \(dstk launch \[launch flags\] -- "
        r"\[train flags\]\)$",
    ),
    (
        "launch-flag-after-the-dashes",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--max-restarts", "2"],
        r"^dstk launch: after --: dstk train: error: --max-restarts: a dstk launch flag: put it before --",
    ),
    (
        "keep-last-negative",
        [*LAUNCH, "--dry-run", "--", *TRAIN, "--checkpoint-dir", "{out}", "--keep-last", "-1"],
        r"--keep-last: must not be negative",
    ),
    (
        "data-prepare-utf16-input",
        [
            "data",
            "prepare",
            "--input",
            f"{BAD}/utf16_corpus.jsonl",
            "--out",
            "{out}",
            "--train-tokenizer",
            "300",
        ],
        r"^dstk data: error: --input: .*utf16_corpus.jsonl is UTF-16 text \(it starts with the byte-order mark FF "
        r"FE\); convert it to UTF-8 first",
    ),
]


@pytest.mark.parametrize(
    ("verb", "flag"),
    [
        (["launch", "--cluster", "cpu", "--config", f"{BAD}/micro1.json", "--dry-run", "--run-dir", "{held}",
          "--", "--model", TINY, "--steps", "5"], "--run-dir"),
        (["launch", "--cluster", "cpu", "--config", f"{BAD}/micro1.json", "--dry-run", "--run-dir", "{out}",
          "--", "--model", TINY, "--steps", "5", "--checkpoint-dir", "{held}"], "--checkpoint-dir"),
        (["data", "generate", "--out", "{held}"], "--out"),
        (["data", "prepare", "--input", f"{BAD}/tiny_corpus.jsonl", "--out", "{held}", "--train-tokenizer",
          "300"], "--out"),
        (["export", "--model", TINY, "--checkpoint", f"{BAD}/ckpt", "--out", "{held}"], "--out"),
        (["checkpoint", "convert", "--checkpoint", f"{BAD}/ckpt", "--out", "{held}"], "--out"),
    ],
    ids=["launch-run-dir", "launch-checkpoint-dir", "data-generate", "data-prepare", "export", "convert"],
)  # fmt: skip
def test_every_verb_refuses_a_folder_another_job_holds(tmp_path, verb, flag) -> None:
    """Two jobs, one folder: each verb that writes into a folder the user may own is refused while another
    job holds it, in one line naming that job, and writes nothing there."""
    held, out = tmp_path / "held", tmp_path / "out"
    holder = lock_folder(held, flag)  # this process stands in for the other job
    try:
        r = dstk(*[a.replace("{held}", str(held)).replace("{out}", str(out)) for a in verb])
    finally:
        holder.release()
    lines = [line for line in r.err.splitlines() if line.strip() and "[WARNING]" not in line]
    assert r.code == 2 and len(lines) == 1, r.err
    assert f"{flag}: {held} is in use by another job: pid {os.getpid()} on " in lines[0], lines[0]
    assert sorted(p.name for p in held.iterdir()) == [] and not out.exists()


def test_data_smaller_than_one_global_batch_is_refused_before_any_rank_starts(
    tmp_path, prepared_data
) -> None:
    """The pre-flight had both numbers: the data's training sequences (its manifest) and the config's global
    batch. A batch larger than the data was a failure on every rank after start-up, 43 s in."""
    rows = json.loads((prepared_data / "manifest.json").read_text())["rows"]["train"]
    cfg = tmp_path / "big_batch.json"
    micro = rows // 2 + 1  # two ranks: one global batch is more than the data holds
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1}))
    out = tmp_path / "out"
    r = dstk("launch", "--cluster", "cpu", "--config", str(cfg), "--run-dir", str(out), "--dry-run", "--",
             "--model", TINY, "--steps", "5", "--data", str(prepared_data))  # fmt: skip
    lines = [line for line in r.err.splitlines() if line.strip() and "[WARNING]" not in line]
    assert r.code == 2 and len(lines) == 1, r.err
    assert f"holds {rows} training sequences, fewer than one global batch of {2 * micro}" in lines[0]
    assert not out.exists()


def test_launch_says_a_run_past_the_schedule_once_and_the_ranks_do_not_again(tmp_path: Path) -> None:
    """`--steps` beyond the config's schedule trains on at the floor rate: said once, by dstk launch (the
    ranks see DSTK_PREFLIGHT_DONE and stay quiet)."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(
        '{"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupCosineLR", '
        '"params": {"total_num_steps": 100, "warmup_num_steps": 1, "cos_min_ratio": 0.1}}}'
    )
    r = dstk(
        "launch",
        "--cluster",
        "cpu",
        "--config",
        str(cfg),
        "--run-dir",
        str(tmp_path / "r"),
        "--dry-run",
        "--",
        "--model",
        TINY,
        "--steps",
        "200",
    )
    assert r.code == 0, r.err
    assert (
        r.err.count("runs past the config's schedule (total_num_steps 100): steps 101–200 train at 0.1") == 1
    )


def test_dstk_help_verb_is_the_verbs_help() -> None:
    r = dstk("help", "estimate")
    assert r.code == 0 and r.out.startswith("usage: dstk estimate")


def test_catalogue_is_large() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(tmp_path: Path, argv: list[str], pattern: str) -> None:
    out = tmp_path / "output"
    r = dstk(*[a.replace("{out}", str(out)) for a in argv])
    assert r.code == 2, (r.code, r.out[-500:], r.err[-2000:])
    lines = [line for line in r.err.splitlines() if line.strip() and "[WARNING]" not in line]
    assert len(lines) == 1, r.err
    assert "Traceback" not in r.err and re.search(pattern, lines[0]), lines[0]
    assert not out.exists(), f"{out} was left behind"
