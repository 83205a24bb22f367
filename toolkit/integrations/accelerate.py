"""Accelerate: a config YAML for `accelerate launch --config_file` that runs the plan's DeepSpeed JSON.

The YAML names the processes and machines and points `deepspeed_config.deepspeed_config_file` at the JSON;
everything DeepSpeed-specific (ZeRO stage, offload, accumulation, clipping, precision) stays in the JSON. That
is Accelerate 1.16's own rule, not a style choice: `accelerate launch` exports the YAML's `deepspeed_config`
keys, plus `mixed_precision` when the YAML sets it, as `ACCELERATE_CONFIG_DS_FIELDS`, and `DeepSpeedPlugin`
refuses a config file next to any of them ("When using `deepspeed_config_file`, the following accelerate config
variables will be ignored: ... mixed_precision", `_deepspeed_config_checks`). `accelerate config` itself leaves
`mixed_precision` out in that case. Precision is therefore the JSON's `bf16`/`fp16` block; Accelerate then
launches with `ACCELERATE_MIXED_PRECISION=no`, and `set_mixed_precision("no")` fills only "auto" values, so the
JSON's `enabled: true` stands. `zero3_init_flag` (allowed beside a config file) is on exactly for ZeRO-3, so
HF models are built partitioned.

Multi-node jobs use Accelerate's `standard` DeepSpeed launcher (torchrun on every node, static rendezvous at
`main_process_ip:main_process_port`): run the same command on each node with `--machine_rank` set to its index.
Accelerate cannot drive DeepSpeed on the CPU accelerator (it starts independent single-process jobs or drops
DeepSpeed; `../shared/RECIPES.md`), so a CPU cluster is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.layout import Layout
from toolkit.plan.specs import ClusterSpec

MAIN_PROCESS_PORT = 29500


def check_cluster(cluster: ClusterSpec) -> None:
    if cluster.accelerator == "cpu":
        raise UserError(
            f"--accelerate: Accelerate cannot run DeepSpeed on the cpu accelerator of cluster {cluster.name} (it "
            "starts independent single-process jobs or drops DeepSpeed); use --hf-trainer under torchrun, or dstk launch"
        )


def accelerate_config(cluster: ClusterSpec, layout: Layout, ds_config_path: Path) -> dict[str, Any]:
    """The `ClusterConfig` fields (as `accelerate config` writes them) for the plan on `cluster`."""
    from toolkit.launcher.command import check_hostname, hosts

    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {
            "deepspeed_config_file": str(ds_config_path.resolve()),
            "zero3_init_flag": layout.zero_stage == 3,
        },
        "num_machines": cluster.nodes,
        "num_processes": cluster.world_size,
        "machine_rank": 0,
        "gpu_ids": "all",
        "rdzv_backend": "static",
        "same_network": True,
        "main_training_function": "main",
        "use_cpu": False,
        "debug": False,
        "enable_cpu_affinity": False,
    }
    if cluster.nodes > 1:
        main = cluster.master_addr or hosts(cluster)[0]
        config["main_process_ip"] = check_hostname(main, "master_addr")
        config["main_process_port"] = MAIN_PROCESS_PORT
        config["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
    return config


def dumps(config: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=True, default_flow_style=False)
