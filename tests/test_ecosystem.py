"""`dstk config --hf-trainer / --accelerate / --megatron`: one plan, checked by each runtime's own code.

- HF Trainer: transformers' own `HfTrainerDeepSpeedConfig` resolves the generated "auto" values from the
  generated `TrainingArguments` to exactly the plan, and refuses a launch on another world size; the real
  `Trainer` on 2 CPU ranks (this file run as a script under the deepspeed launcher) resolves and trains the plan.
- Accelerate cannot run DeepSpeed on CPU, so nothing launches: the YAML goes through Accelerate's own config
  loader and launch-environment builder, then `DeepSpeedPlugin`, and every planned value must come out.
- Megatron-DeepSpeed: every emitted argument list parses with a parser built from the verified flag list
  (tests/data/megatron_deepspeed_flags.txt, copied from the project's argument parser) and carries the plan.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as the 2-rank Trainer script: make `tests` and `toolkit` importable
    sys.path.insert(0, str(REPO))

from tests.cli import dstk  # noqa: E402
from tests.megatron_flags import MEGATRON_DEEPSPEED, parse_verified  # noqa: E402
from toolkit.integrations.targets import get_path  # noqa: E402

TINY = str(REPO / "tests" / "models" / "tiny-test-gpt2.yaml")
TINY_MOE = str(REPO / "tests" / "models" / "tiny-test-moe.yaml")
TINY_LLAMA = str(REPO / "tests" / "models" / "tiny-test-llama.yaml")
TWO_NODES = {
    "name": "two-a100-nodes",
    "nodes": 2,
    "gpus_per_node": 8,
    "gpu_memory_gib": 80,
    "gpu_peak_tflops": 312,
    "intra_node_gb_per_s": 300,
    "inter_node_gb_per_s": 25,
    "cpu_memory_gib": 1024,
    "hostnames": ["node-a", "node-b"],
}


def generate(path: Path, *flags: str) -> dict[str, Any]:
    """`dstk config ... -o path` in process (DeepSpeed validates it as always); the written JSON."""
    res = dstk("config", *flags, "-o", str(path))
    assert res.code == 0, res.err
    return json.loads(path.read_text())


def leaves(cfg: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def comparable(cfg: dict[str, Any]) -> dict[str, Any]:
    """A resolved config as DeepSpeed will read it: without dstk's block and the logging cadence Accelerate
    overrides (`steps_per_print = inf`), and with a disabled precision block equal to an absent one (Accelerate
    adds `{"enabled": false}` for the precision not used)."""
    out = {k: v for k, v in cfg.items() if k not in ("dstk", "steps_per_print")}
    for precision in ("fp16", "bf16"):
        if out.get(precision) == {"enabled": False}:
            del out[precision]
    return out


def plan_layout(plan: dict[str, Any]) -> dict[str, Any]:
    return plan["dstk"]["layout"]


# ------------------------------------------------------------------------------------------ HF Trainer


def test_hf_trainer_config_is_auto_exactly_where_the_trainer_fills(tmp_path) -> None:
    from toolkit.integrations.hf_trainer import AUTO_FIELDS

    flags = [
        "--model",
        TINY,
        "--cluster",
        "cpu",
        "--zero-stage",
        "3",
        "--micro-batch",
        "2",
        "--global-batch",
        "8",
    ]
    plan = generate(tmp_path / "plan.json", *flags)
    hf = generate(tmp_path / "hf.json", *flags, "--hf-trainer")
    autos = {k for k, v in leaves(hf).items() if v == "auto"}
    assert autos == {k for k in AUTO_FIELDS if get_path(plan, k) is not None}
    assert "fp16.enabled" not in autos and "bf16.enabled" in autos  # a bf16 plan has no fp16 block
    assert hf["train_batch_size"] == plan["train_batch_size"] == 8  # checked by HF, never overridden
    zero = hf["zero_optimization"]  # HF would fill these from the model; the plan's numbers stay
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
        assert zero[key] == plan["zero_optimization"][key] and isinstance(zero[key], int)
    assert "dstk" not in hf
    args = json.loads((tmp_path / "hf.training_args.json").read_text())
    assert args["per_device_train_batch_size"] == 2 and args["gradient_accumulation_steps"] == 2
    assert args["bf16"] is True and args["fp16"] is False and args["use_cpu"] is True
    assert args["dataloader_drop_last"] is True and args["gradient_checkpointing"] is False


def _hf_resolve(ds_path: Path, args_path: Path, out: Path, world_size: int) -> Any:
    """What transformers makes of the two files: `trainer_config_process` (TrainingArguments) then
    `trainer_config_finalize` (deepspeed_init), with a real tiny model, as the Trainer calls them. The model is
    built before the DeepSpeed config object exists (it registers itself globally), so ZeRO-3 does not try to
    partition it in this single, non-distributed process."""
    from transformers import AutoModelForCausalLM, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    from toolkit.plan.load import load_model
    from toolkit.run.models import hf_config

    model = AutoModelForCausalLM.from_config(hf_config(load_model(TINY)))
    args = TrainingArguments(output_dir=str(out), report_to="none", **json.loads(args_path.read_text()))
    assert args.world_size == world_size  # one process here: plans for 1 rank resolve, others must not
    hf = HfTrainerDeepSpeedConfig(str(ds_path))
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(
            args, model, args.max_steps
        )  # the Trainer's num_training_steps for max_steps
    finally:
        unset_hf_deepspeed_config()
    return hf


@pytest.mark.parametrize(
    "extra",
    [
        ["--zero-stage", "2", "--precision", "bf16"],
        ["--zero-stage", "3", "--precision", "fp32", "--recompute", "full"],
        ["--zero-stage", "1", "--offload-optimizer", "cpu", "--recompute", "selective"],
    ],
    ids=["zero2-bf16", "zero3-fp32-recompute", "zero1-offload"],
)
def test_hf_resolves_the_autos_to_the_plan(tmp_path, extra) -> None:
    """One rank, so HF's world size (1) is the plan's: every resolved value, every key, equals the plan."""
    flags = ["--model", TINY, "--cluster", "cpu", "--gpus-per-node", "1", "--micro-batch", "2"]
    flags += ["--global-batch", "8", "--lr", "3e-4", "--train-steps", "20", "--warmup-steps", "4", *extra]
    plan = generate(tmp_path / "plan.json", *flags)
    generate(tmp_path / "hf.json", *flags, "--hf-trainer")
    hf = _hf_resolve(tmp_path / "hf.json", tmp_path / "hf.training_args.json", tmp_path / "out", 1)
    assert comparable(hf.config) == comparable(plan)
    assert hf.mismatches == []
    args = json.loads((tmp_path / "hf.training_args.json").read_text())
    assert args["gradient_checkpointing"] is (plan_layout(plan)["recompute"] == "full")


def test_hf_refuses_a_launch_on_another_world_size(tmp_path) -> None:
    """The plan is for 2 ranks; started on 1, HF's computed train_batch_size (1 × 2 × 4) disagrees with the
    concrete 16 and transformers stops before training instead of running another global batch."""
    flags = [
        "--model",
        TINY,
        "--cluster",
        "cpu",
        "--zero-stage",
        "2",
        "--micro-batch",
        "2",
        "--global-batch",
        "16",
    ]
    generate(tmp_path / "hf.json", *flags, "--hf-trainer")
    with pytest.raises(ValueError, match=r"train_batch_size=16 vs hf train_batch_size \(calculated\)=8"):
        _hf_resolve(tmp_path / "hf.json", tmp_path / "hf.training_args.json", tmp_path / "out", 1)


def test_the_dstk_block_is_ignored_by_hf_and_accelerate_and_left_out(tmp_path) -> None:
    """transformers and Accelerate accept a config that still carries dstk's block (DeepSpeed ignores unknown
    top-level keys); dstk leaves it out of every target's file anyway, so no number appears twice."""
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    flags = ["--model", TINY, "--cluster", "cpu", "--gpus-per-node", "1", "--zero-stage", "2"]
    plan = generate(tmp_path / "plan.json", *flags)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, bf16=True)
    hf = HfTrainerDeepSpeedConfig(plan)
    try:
        hf.trainer_config_process(args)
    finally:
        unset_hf_deepspeed_config()
    assert hf.config["dstk"] == plan["dstk"]
    assert DeepSpeedPlugin(hf_ds_config=plan).deepspeed_config["dstk"] == plan["dstk"]
    for target in ("--hf-trainer", "--megatron"):
        assert "dstk" not in generate(tmp_path / f"{target[2:]}.json", *flags, target)


def test_config_help_lists_the_targets() -> None:
    res = dstk("config", "--help")
    assert res.code == 0 and all(flag in res.out for flag in ("--hf-trainer", "--accelerate", "--megatron"))


# ------------------------------------------------------------------------------------------ Accelerate

ACCELERATE_CASES = {
    "zero3-bf16-two-nodes": [
        "--model", "gpt2", "--cluster", "{two_nodes}", "--zero-stage", "3", "--micro-batch", "4",
        "--global-batch", "128",
    ],
    "zero2-offload-one-node": [
        "--model", "gpt2-xl", "--cluster", "dgx-a100-40g", "--zero-stage", "2", "--offload-optimizer", "cpu",
        "--micro-batch", "2", "--global-batch", "64", "--recompute", "full",
    ],
    "zero3-param-offload-fp16": [
        "--model", "llama-7b", "--cluster", "v100-32g", "--zero-stage", "3", "--offload-optimizer", "cpu",
        "--offload-param", "cpu", "--precision", "fp16", "--micro-batch", "1", "--global-batch", "32",
    ],
}  # fmt: skip


def _accelerate_files(tmp_path: Path, case: str, *extra: str) -> tuple[dict[str, Any], Path, Path]:
    two_nodes = tmp_path / "two-nodes.yaml"
    two_nodes.write_text(yaml.safe_dump(TWO_NODES))
    flags = [f.format(two_nodes=two_nodes) for f in ACCELERATE_CASES[case]]
    plan = generate(tmp_path / "plan.json", *flags)
    ds = tmp_path / "run" / "ds.json"
    generate(ds, *flags, "--accelerate", *extra)
    return plan, ds, tmp_path / "run" / "ds.accelerate.yaml"


def _check_plugin(plugin: Any, plan: dict[str, Any]) -> None:
    layout = plan_layout(plan)
    assert plugin.zero_stage == layout["zero_stage"]
    assert plugin.gradient_accumulation_steps == layout["gradient_accumulation_steps"]
    assert plugin.gradient_clipping == plan["gradient_clipping"]
    assert plugin.offload_optimizer_device == layout["offload_optimizer"]
    assert plugin.offload_param_device == layout["offload_param"]
    assert plugin.zero3_init_flag is (layout["zero_stage"] == 3)
    assert plugin.hf_ds_config.is_zero3() is (layout["zero_stage"] == 3)
    assert comparable(plugin.deepspeed_config) == comparable(plan)  # micro, global, precision, optimizer, ...


@pytest.mark.parametrize("case", list(ACCELERATE_CASES))
def test_accelerate_loader_and_plugin_resolve_the_plan(tmp_path, case) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    plan, ds, config_yaml = _accelerate_files(tmp_path, case)
    layout = plan_layout(plan)
    cc = load_config_from_file(str(config_yaml))
    assert isinstance(cc, ClusterConfig) and cc.distributed_type == DistributedType.DEEPSPEED
    assert cc.num_processes == layout["world_size"]
    nodes = 2 if case.endswith("two-nodes") else 1
    assert (cc.num_machines, cc.machine_rank, cc.use_cpu) == (nodes, 0, False)
    assert (
        cc.mixed_precision is None
    )  # precision lives in the JSON (module docstring of ecosystem.accelerate)
    assert cc.deepspeed_config["deepspeed_config_file"] == str(ds.resolve())
    if nodes > 1:
        assert (cc.main_process_ip, cc.main_process_port) == ("node-a", 29500)
        assert cc.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
    plugin = DeepSpeedPlugin(
        hf_ds_config=cc.deepspeed_config["deepspeed_config_file"],
        zero3_init_flag=cc.deepspeed_config["zero3_init_flag"],
    )
    plugin.set_mixed_precision("no")  # what `accelerate launch` exports when the YAML names no precision
    _check_plugin(plugin, plan)


def _launch_environment(config_yaml: Path, *launch_args: str) -> tuple[argparse.Namespace, dict[str, str]]:
    """What `accelerate launch --config_file` computes before it starts anything: its own parser, validation
    and DeepSpeed environment (`launch_command` passes the YAML's deepspeed_config keys, and mixed_precision
    when the YAML sets it, as `deepspeed_fields_from_accelerate_config`; that one step is repeated here)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(config_yaml), *launch_args, "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    return args, {k: v for k, v in env.items() if k.startswith("ACCELERATE_")}


def test_accelerate_launch_environment_resolves_the_plan(tmp_path, monkeypatch) -> None:
    """Node 2 of 2 as `accelerate launch --machine_rank 1` starts it: torchrun geometry from the YAML, and the
    plugin each rank builds from the exported environment holds the plan."""
    from accelerate.utils import DeepSpeedPlugin

    plan, ds, config_yaml = _accelerate_files(tmp_path, "zero3-bf16-two-nodes")
    args, env = _launch_environment(config_yaml, "--machine_rank", "1")
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", 1, "8")
    assert args.rdzv_endpoint == "node-a:29500"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(ds.resolve())
    assert env["ACCELERATE_MIXED_PRECISION"] == "no" and env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    _check_plugin(plugin, plan)


def test_accelerate_refuses_mixed_precision_beside_a_config_file(tmp_path, monkeypatch) -> None:
    """Why dstk's YAML names no mixed_precision: Accelerate itself refuses it next to deepspeed_config_file."""
    from accelerate.utils import DeepSpeedPlugin

    _, _, config_yaml = _accelerate_files(tmp_path, "zero3-bf16-two-nodes")
    data = yaml.safe_load(config_yaml.read_text())
    config_yaml.write_text(yaml.safe_dump({**data, "mixed_precision": "bf16"}))
    # as node 2 starts it: on machine rank 0 Accelerate raises ConnectionError when the YAML's port (29500) is
    # in use on *this* host, which a launch on the other pytest worker may hold; the main process is node-a's
    _, env = _launch_environment(config_yaml, "--machine_rank", "1")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match="will be ignored"):
        DeepSpeedPlugin()


def test_trainer_under_accelerate_launch_resolves_the_plan(tmp_path, monkeypatch) -> None:
    """--hf-trainer --accelerate: the YAML points at the HF config; under `accelerate launch` the Trainer takes
    the plugin Accelerate built from the environment and fills its "auto" values from the TrainingArguments."""
    from accelerate.utils import DeepSpeedPlugin

    # fp32: TrainingArguments refuses bf16 on a machine without a GPU, and nothing runs here
    flags = ["--model", TINY, "--cluster", "dgx-a100-80g", "--gpus-per-node", "1", "--zero-stage", "2"]
    flags += ["--micro-batch", "4", "--global-batch", "16", "--train-steps", "50", "--warmup-steps", "5"]
    flags += ["--precision", "fp32"]
    plan = generate(tmp_path / "plan.json", *flags)
    ds = tmp_path / "run" / "ds.json"
    generate(ds, *flags, "--hf-trainer", "--accelerate")
    _, env = _launch_environment(tmp_path / "run" / "ds.accelerate.yaml")
    with monkeypatch.context() as scoped:
        for key, value in env.items():
            scoped.setenv(key, value)
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    seen = tmp_path / "as_accelerate_passes_it.json"
    seen.write_text(json.dumps(plugin.deepspeed_config))
    hf = _hf_resolve(seen, tmp_path / "run" / "ds.training_args.json", tmp_path / "out", 1)
    assert comparable(hf.config) == comparable(plan)


# ------------------------------------------------------------------------------------- Megatron-DeepSpeed


MEGATRON_CASES = {
    "gpt3-13b-3d-recompute": [
        "--model", "gpt3-13b", "--cluster", "dgx-a100-80g", "--nodes", "4", "--tp", "4", "--pp", "2",
        "--zero-stage", "1", "--micro-batch", "2", "--global-batch", "512", "--recompute", "full",
    ],
    "llama-70b-gqa-selective-zero1": [
        "--model", "llama-70b", "--cluster", "dgx-h100", "--nodes", "8", "--tp", "8", "--pp", "4",
        "--zero-stage", "1", "--micro-batch", "1", "--global-batch", "256", "--recompute", "selective",
        "--flash-attention",
    ],
    "llama-7b-ulysses-zero3-offload": [
        "--model", "llama-7b", "--cluster", "dgx-a100-40g", "--nodes", "2", "--tp", "2", "--sp", "2",
        "--no-tp-sequence-parallel", "--zero-stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu",
        "--micro-batch", "1", "--global-batch", "64", "--recompute", "full",
    ],
    "mixtral-ep8-zero2": [
        "--model", "mixtral-8x7b", "--cluster", "h200", "--nodes", "4", "--tp", "2", "--ep", "8",
        "--zero-stage", "2", "--micro-batch", "1", "--global-batch", "256", "--recompute", "full",
    ],
    "gpt3-13b-fp8-transformer-engine": [
        "--model", "gpt3-13b", "--cluster", "dgx-h100", "--nodes", "2", "--tp", "8", "--zero-stage", "1",
        "--micro-batch", "1", "--global-batch", "256", "--recompute", "selective", "--precision", "fp8",
    ],
    "tiny-cpu-fp32": [
        "--model", TINY, "--cluster", "cpu", "--zero-stage", "2", "--precision", "fp32", "--micro-batch", "2",
        "--global-batch", "8",
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(MEGATRON_CASES))
def test_megatron_arguments_are_verified_flags_with_the_plans_values(tmp_path, case) -> None:
    from toolkit.integrations.ds_layout import ModelParallel
    from toolkit.integrations.validate import validate_config
    from toolkit.plan.load import load_model

    flags = MEGATRON_CASES[case]
    # --megatron runs TP with Megatron's sequence parallelism and vocabulary-parallel embedding unless told
    # otherwise (as the planner does for --target megatron); the reference plan states them explicitly
    tp_flags = [f for f in ("--tp-sequence-parallel", "--tp-vocab-parallel") if f"--no-{f[2:]}" not in flags]
    tp = int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1
    plan = generate(tmp_path / "plan.json", *flags, "--target", "megatron", *(tp_flags if tp > 1 else []))
    out = tmp_path / "megatron.json"
    res = dstk("config", *flags, "--megatron", "-o", str(out))
    assert res.code == 0, res.err
    ns = parse_verified(shlex.split(res.out), MEGATRON_DEEPSPEED)  # printed shell-quoted, one line

    layout, model = plan_layout(plan), load_model(flags[1])
    ds_sp = ns.ds_sequence_parallel_size or 1
    dp = layout["world_size"] // (ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * ds_sp)
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ds_sp) == (
        layout["tp"],
        layout["pp"],
        layout["sp"],
    )
    assert dp == layout["dp"]
    assert (ns.micro_batch_size, ns.global_batch_size) == (
        layout["micro_batch_size"],
        layout["global_batch_size"],
    )
    assert ns.global_batch_size // (ns.micro_batch_size * dp) == layout["gradient_accumulation_steps"]
    assert ns.sequence_parallel is layout["tp_sequence_parallel"]
    assert ns.no_pipeline_parallel is (layout["pp"] == 1)
    assert ns.zero_stage == layout["zero_stage"]
    fp8 = layout["precision"] == "fp8"  # bf16 training with Transformer Engine's FP8 linear GEMMs
    assert ns.bf16 is (layout["precision"] in ("bf16", "fp8")) and ns.fp16 is (layout["precision"] == "fp16")
    assert ns.fp8_hybrid is fp8 and not ns.fp8_e4m3
    assert ns.transformer_impl == ("transformer_engine" if fp8 else None)
    if fp8:  # Transformer Engine's own DelayedScaling defaults, not Megatron's 1 / most_recent
        assert (ns.fp8_amax_history_len, ns.fp8_amax_compute_algo) == (1024, "max")
    granularity = {"none": None, "selective": "selective", "full": "full"}[layout["recompute"]]
    assert ns.recompute_granularity == granularity
    assert ns.deepspeed_activation_checkpointing is (layout["recompute"] == "full")
    if layout["recompute"] == "full":
        assert (ns.recompute_method, ns.recompute_num_layers) == ("uniform", 1)
    assert (ns.num_layers, ns.hidden_size, ns.num_attention_heads) == (
        model.n_layers,
        model.hidden_size,
        model.n_heads,
    )
    assert ns.ffn_hidden_size == model.ffn_hidden_size and ns.seq_length == model.seq_length
    assert (ns.num_key_value_heads or model.n_heads) == model.n_kv_heads
    assert ns.swiglu is bool(model.gated_mlp)
    # CoreAttention unless the plan prices FlashAttention-2; in fp8 Transformer Engine's own fused attention
    assert ns.use_flash_attn_v2 is ("--flash-attention" in flags)
    assert layout["flash_attention"] is ("--flash-attention" in flags or fp8)
    if model.is_moe:
        assert (ns.num_experts, ns.topk, ns.moe_expert_parallel_size) == (
            [model.num_experts],
            model.moe_top_k,
            layout["ep"],
        )
    assert ns.cpu_optimizer is (layout["offload_optimizer"] != "none")
    assert (ns.remote_device or "none") == layout["offload_param"]
    adam, sched = plan["optimizer"]["params"], plan["scheduler"]["params"]
    assert ns.lr == pytest.approx(adam["lr"]) and ns.min_lr == pytest.approx(
        adam["lr"] * sched["cos_min_ratio"]
    )
    assert (ns.train_iters, ns.lr_warmup_iters) == (sched["total_num_steps"], sched["warmup_num_steps"])
    assert [ns.adam_beta1, ns.adam_beta2] == adam["betas"] and ns.clip_grad == plan["gradient_clipping"]

    assert ns.deepspeed and ns.deepspeed_config == str(out.resolve())
    cfg = json.loads(out.read_text())
    assert cfg["train_batch_size"] == layout["global_batch_size"]  # Megatron's mpu: data-parallel ranks only
    assert cfg["train_micro_batch_size_per_gpu"] == layout["micro_batch_size"]
    assert cfg["gradient_accumulation_steps"] == layout["gradient_accumulation_steps"]
    assert cfg["zero_optimization"] == plan["zero_optimization"]
    assert cfg["gradient_clipping"] == ns.clip_grad
    for owned in ("optimizer", "scheduler", "tensor_parallel", "pipeline", "dstk", "sequence_parallel_size"):
        assert owned not in cfg
    accelerator = "cpu" if flags[flags.index("--cluster") + 1] == "cpu" else "cuda"
    # DeepSpeed under Megatron's mpu counts data-parallel ranks only
    assert validate_config(cfg, dp, accelerator, ModelParallel()).texts == []


# ------------------------------------------------------------------------------------------ bad combinations

BAD_TARGETS = [
    (
        "hf-pipeline",
        ["--model", TINY, "--cluster", "cpu", "--zero-stage", "1", "--pp", "2", "--hf-trainer"],
        r"--hf-trainer: HF Trainer has no DeepSpeed pipeline engine",
    ),
    (
        "hf-onebit",
        ["--model", TINY, "--cluster", "cpu", "--optimizer", "onebit-adam", "--precision", "fp32", "--hf-trainer"],
        r"--hf-trainer: --optimizer onebit-adam is dstk's own client optimizer",
    ),
    (
        "hf-ulysses",  # a layout dstk train runs (Llama, accumulation a multiple of sp): the Trainer cannot
        ["--model", TINY_LLAMA, "--cluster", "cpu", "--sp", "2", "--global-batch", "2", "--hf-trainer"],
        r"--hf-trainer: DeepSpeed-Ulysses \(sp=2\)",
    ),
    (
        "hf-dstk-moe",
        ["--model", TINY_MOE, "--cluster", "cpu", "--zero-stage", "2", "--hf-trainer"],
        r"--hf-trainer: tiny-test-moe is a gpt2 model made MoE by dstk",
    ),
    (
        "accelerate-on-cpu",
        ["--model", TINY, "--cluster", "cpu", "--accelerate"],
        r"--accelerate: Accelerate cannot run DeepSpeed on the cpu accelerator",
    ),
    (
        "accelerate-pipeline",
        ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--zero-stage", "1", "--pp", "2", "--accelerate"],
        r"--accelerate: HF Trainer has no DeepSpeed pipeline engine",
    ),
    (
        "accelerate-two-nodes-without-hostnames",
        ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--nodes", "2", "--zero-stage", "2", "--accelerate"],
        r"hostnames: cluster dgx-a100-80g has 2 nodes",
    ),
    (
        "megatron-alibi",
        ["--model", "bloom-176b", "--cluster", "dgx-a100-80g", "--nodes", "48", "--tp", "8", "--pp", "14",
         "--zero-stage", "1", "--megatron"],
        r"--megatron: Megatron-DeepSpeed's GPT model cannot express ALiBi positions",
    ),
    (
        "megatron-moe-zero3",
        ["--model", TINY_MOE, "--cluster", "cpu", "--zero-stage", "3", "--megatron"],
        r"--zero-stage: Megatron-DeepSpeed's MoE layers are DeepSpeed-MoE",
    ),
    (
        "megatron-whole-embedding",
        ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--tp", "2", "--no-tp-vocab-parallel", "--megatron"],
        r"--tp-vocab-parallel: Megatron always splits the word embedding",
    ),
    (
        "megatron-ulysses-with-tp-sequence-parallel",
        ["--model", "llama-7b", "--cluster", "dgx-a100-80g", "--tp", "2", "--sp", "2", "--megatron"],
        r"--sp: Megatron-DeepSpeed's --ds-sequence-parallel-size cannot be combined with --sequence-parallel",
    ),
    (
        "megatron-uneven-stages",
        ["--model", "gpt2", "--cluster", "dgx-a100-80g", "--pp", "8", "--zero-stage", "1", "--megatron"],
        r"--pp: Megatron-DeepSpeed gives every pipeline stage the same number of layers",
    ),
    (
        "megatron-onebit",
        ["--model", TINY, "--cluster", "cpu", "--optimizer", "zero-one-adam", "--precision", "fp32", "--megatron"],
        r"--megatron: Megatron builds its own Adam",
    ),
    (
        "megatron-with-hf",
        ["--model", TINY, "--cluster", "cpu", "--megatron", "--hf-trainer"],
        r"--megatron: Megatron-DeepSpeed has its own launcher and trainer",
    ),
]  # fmt: skip


@pytest.mark.parametrize("argv,pattern", [c[1:] for c in BAD_TARGETS], ids=[c[0] for c in BAD_TARGETS])
def test_bad_target_combinations_exit_2_with_one_line(tmp_path, argv, pattern) -> None:
    out = tmp_path / "out" / "ds.json"
    res = dstk("config", *argv, "-o", str(out))
    assert res.code == 2, res.err
    lines = [line for line in res.err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.parent.exists() or not any(out.parent.iterdir())  # nothing half-written


def test_targets_need_an_output_file(tmp_path) -> None:
    res = dstk("config", "--model", TINY, "--cluster", "cpu", "--hf-trainer", "-o", "-")
    assert res.code == 2 and "-o: --hf-trainer/--accelerate write files next to the DeepSpeed JSON" in res.err


# ------------------------------------------------------------------------------------ the real HF Trainer

STEPS = 4


@pytest.mark.multiprocess
def test_hf_trainer_on_two_cpu_ranks_runs_the_plan(tmp_path) -> None:
    """The real Trainer, 2 gloo ranks, ZeRO-3 bf16 with accumulation and full recomputation: the config it
    resolved is the plan, key for key, and the engine it built runs the plan's batch, clipping, optimizer,
    schedule and precision; its blocks checkpoint through the reentrant function the layout was priced for
    (ZeRO-3 replays whole blocks)."""
    from tests.distributed import run_script

    flags = [
        "--model",
        TINY,
        "--cluster",
        "cpu",
        "--zero-stage",
        "3",
        "--precision",
        "bf16",
        "--recompute",
        "full",
    ]
    flags += ["--micro-batch", "2", "--global-batch", "8", "--lr", "1e-3", "--train-steps", str(STEPS)]
    flags += ["--warmup-steps", "2", "--log-dir", str(tmp_path / "logs")]
    plan = generate(tmp_path / "plan.json", *flags)
    generate(tmp_path / "hf.json", *flags, "--hf-trainer")
    result = tmp_path / "result.json"
    proc = run_script(
        Path(__file__),
        [str(tmp_path / "hf.json"), str(tmp_path / "hf.training_args.json"), str(result)],
        timeout=300,
    )
    assert result.exists(), (proc.stdout + proc.stderr)[-4000:]
    got = json.loads(result.read_text())
    assert comparable(got["resolved"]) == comparable(plan)
    layout, adam, sched = plan_layout(plan), plan["optimizer"]["params"], plan["scheduler"]["params"]
    assert got["engine"] == {
        "world_size": 2,
        "train_batch_size": layout["global_batch_size"],
        "micro_batch_size": layout["micro_batch_size"],
        "gradient_accumulation_steps": layout["gradient_accumulation_steps"],
        "gradient_clipping": plan["gradient_clipping"],
        "zero_stage": 3,
        "bf16": True,
        "fp16": False,
        "optimizer": "AdamW",
        "lr": adam["lr"],
        "betas": adam["betas"],
        "eps": adam["eps"],
        "weight_decay": adam["weight_decay"],
        "scheduler": "WarmupCosineLR",
        "total_num_steps": sched["total_num_steps"],
        "warmup_num_steps": sched["warmup_num_steps"],
        "global_steps": STEPS,
    }
    assert got["checkpointing"] == {"enabled": True, "kwargs": {"use_reentrant": True}}


def _trainer_main(ds_path: str, args_path: str, result_path: str) -> None:
    """Every rank of test_hf_trainer_on_two_cpu_ranks_runs_the_plan: what a user's script does with the files."""
    import datasets
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from toolkit.plan.load import load_model
    from toolkit.run.models import hf_config

    # With use_cpu=True the Trainer sets up torch.distributed but not deepspeed.comm, so ZeRO-3's zero.Init
    # (run when the model is built) would see world size 1 and fail DeepSpeed's batch check.
    deepspeed.init_distributed(dist_backend="gloo")
    args = TrainingArguments(
        **json.loads(Path(args_path).read_text()),
        deepspeed=ds_path,
        output_dir=str(Path(result_path).parent / "trainer"),
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    spec = load_model(TINY)
    model = AutoModelForCausalLM.from_config(hf_config(spec))  # after TrainingArguments: built partitioned
    ids = torch.randint(0, spec.vocab_size, (64, spec.seq_length), generator=torch.Generator().manual_seed(0))
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    engine = trainer.model_wrapped
    adam = engine.basic_optimizer
    result = {
        "resolved": trainer.accelerator.state.deepspeed_plugin.hf_ds_config.config,
        "engine": {
            "world_size": torch.distributed.get_world_size(),
            "train_batch_size": engine.train_batch_size(),
            "micro_batch_size": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "gradient_clipping": engine.gradient_clipping(),
            "zero_stage": engine.zero_optimization_stage(),
            "bf16": engine.bfloat16_enabled(),
            "fp16": engine.fp16_enabled(),
            "optimizer": type(adam).__name__,
            "lr": adam.defaults["lr"],
            "betas": list(adam.defaults["betas"]),
            "eps": adam.defaults["eps"],
            "weight_decay": adam.defaults["weight_decay"],
            "scheduler": type(engine.lr_scheduler).__name__,
            "total_num_steps": engine.lr_scheduler.total_num_steps,
            "warmup_num_steps": engine.lr_scheduler.warmup_num_steps,
            "global_steps": engine.global_steps,
        },
        "checkpointing": {
            "enabled": model.is_gradient_checkpointing,
            "kwargs": args.gradient_checkpointing_kwargs,
        },
    }
    if torch.distributed.get_rank() == 0:
        Path(result_path).write_text(json.dumps(result, sort_keys=True, indent=2, default=str))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    _trainer_main(*sys.argv[1:4])
