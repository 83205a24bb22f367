"""Every reference config in ds_configs/ is what dstk generates today, and DeepSpeed accepts it."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tests.cli import REPO, dstk
from toolkit.plan.load import load_model

SCENARIOS = yaml.safe_load((REPO / "ds_configs" / "scenarios.yaml").read_text())


def _world_size(args: list[str]) -> int:
    from toolkit.commands import CLUSTER_OVERRIDES
    from toolkit.plan.load import load_cluster

    opts = dict(zip(args[::2], args[1::2], strict=False))
    overrides = {
        k: float(opts[f"--{k.replace('_', '-')}"])
        for k in CLUSTER_OVERRIDES
        if f"--{k.replace('_', '-')}" in opts
    }
    overrides = {k: int(v) if k in ("nodes", "gpus_per_node") else v for k, v in overrides.items()}
    return load_cluster(opts["--cluster"], overrides).world_size


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden_config_regenerates_byte_for_byte_and_validates(name: str, tmp_path) -> None:
    args = shlex.split(SCENARIOS[name]["args"])
    out = tmp_path / "cfg.json"
    r = dstk("config", *args, "-o", str(out))
    assert r.code == 0, r.err
    golden = REPO / "ds_configs" / f"{name}.json"
    assert out.read_bytes() == golden.read_bytes(), f"{golden} is stale: run python ds_configs/regenerate.py"
    r = dstk("validate", str(golden), "--world-size", str(_world_size(args)))
    assert r.code == 0, r.out


def test_golden_configs_have_no_strays() -> None:
    files = {p.stem for p in (REPO / "ds_configs").glob("*.json")}
    assert files == set(SCENARIOS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_estimate_of_a_config_is_the_estimate_of_the_flags_that_wrote_it(name: str) -> None:
    from toolkit.commands import CLUSTER_OVERRIDES
    from toolkit.plan.layout import LAYOUT_FLAGS

    job_flags = {"--model", "--cluster"} | {f"--{k.replace('_', '-')}" for k in CLUSTER_OVERRIDES}
    job, layout = [], []
    for flag, value in _options(shlex.split(SCENARIOS[name]["args"])):
        if flag in job_flags:
            job += [flag, value]
        elif flag in LAYOUT_FLAGS.values() or flag.removeprefix("--no-") in LAYOUT_FLAGS.values():
            layout += [flag] if value is None else [flag, value]
    by_flags = dstk("estimate", *job, *layout, "--json")
    by_config = dstk("estimate", *job, "--config", str(REPO / "ds_configs" / f"{name}.json"), "--json")
    assert by_flags.code == 0 and by_config.code == 0, (by_flags.err, by_config.err)
    assert by_config.out == by_flags.out


def _options(argv: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for i, token in enumerate(argv):
        if token.startswith("--"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            out.append((token, value))
    return out


def test_zero_infinity_config_puts_parameters_on_nvme_and_checkpoints_in_host_memory() -> None:
    """What DeepSpeed 0.19.8 needs to really offload (see toolkit/plan/zero_knobs.py and ds_config.py): a
    parameter swap buffer holds one partition of the largest tensor (not the whole tensor, 32 × larger here),
    `max_in_cpu` 0 (its 1e9 default keeps a rank's parameters in host memory), the aio keys DeepSpeed reads,
    and checkpoints moved by the partitioning path, which `cpu_checkpointing` needs on a synchronized device."""
    cfg = json.loads((REPO / "ds_configs" / "zero_infinity_gpt1t_2x16_v100.json").read_text())
    param = cfg["zero_optimization"]["offload_param"]
    model = load_model("gpt-1t")
    largest = model.hidden_size * model.ffn_hidden_size
    assert largest / 32 <= param["buffer_size"] < largest / 16 and param["max_in_cpu"] == 0
    assert "thread_count" not in cfg["aio"] and cfg["aio"]["intra_op_parallelism"] == 1
    ckpt = cfg["activation_checkpointing"]
    assert ckpt["cpu_checkpointing"] and ckpt["partition_activations"]
