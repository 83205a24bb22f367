"""One set of numbers (issue #33): on every model preset and several clusters and layouts, each block of
parts in `dstk estimate --json` adds up to its total in whole bytes, there is one MFU (model FLOPs over the
peak of the layout's precision) and the executed TFLOP/s are never below the model TFLOP/s; the text says the
same in one unit; and tables stay whole when piped or narrow."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli import dstk, dstk_process
from toolkit.errors import UserError
from toolkit.plan.cost.estimate import Estimate, estimate
from toolkit.plan.layout import LayoutRequest
from toolkit.plan.load import load_cluster, load_model
from toolkit.plan.presets import preset_names
from toolkit.plan.rules import resolve_layout
from toolkit.plan.units import GIB, KIB, MIB, format_bytes, format_count

MODELS = preset_names("models")
CLUSTERS = ("dgx-a100-80g", "dgx-h100", "v100-32g", "cpu")
LAYOUTS = (
    {},
    {"zero_stage": 1, "micro_batch_size": 2, "global_batch_size": 64},
    {"zero_stage": 2, "offload_optimizer": "cpu", "recompute": "selective"},
    {"zero_stage": 3, "recompute": "full", "micro_batch_size": 2},
    {"zero_stage": 3, "offload_optimizer": "nvme", "offload_param": "cpu"},
    {"zero_stage": 0, "precision": "fp32"},
    {"zero_stage": 1, "pp": 2},
    {"zero_stage": 1, "ep": 2},
    {"zero_stage": 2, "lora": "r=8"},
)
UNIT = {"B": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB}


def _estimates(model_name: str, cluster_name: str, nodes: int = 2) -> list[Estimate]:
    """The layouts of LAYOUTS that the rules accept for this model on `nodes` nodes of this cluster."""
    model = load_model(model_name)
    cluster = load_cluster(cluster_name, {"nodes": nodes})
    out = []
    for fields in LAYOUTS:
        if "ep" in fields and not model.is_moe:
            continue
        try:
            layout = resolve_layout(model, cluster, LayoutRequest(**fields))
        except UserError:
            continue  # a layout this model or cluster cannot take (a rule says which)
        out.append(estimate(model, cluster, layout))
    assert len(out) >= 5, (model_name, cluster_name)
    return out


def _assert_whole_bytes(data: dict, path: str = "") -> None:
    """Every figure under a key that says bytes is an integer (no 85040352460.8)."""
    for key, value in data.items():
        if "bytes" not in key:
            continue
        if isinstance(value, dict):
            assert all(type(v) is int for v in value.values()), (path + key, value)
        else:
            assert type(value) is int, (path + key, value)


def _assert_adds_up(block: dict) -> None:
    parts = {k: v for k, v in block.items() if k != "total"}
    assert sum(parts.values()) == block["total"], block
    assert all(v >= 0 for v in parts.values()), block


@pytest.mark.parametrize("cluster_name", CLUSTERS)
@pytest.mark.parametrize("model_name", MODELS)
def test_estimate_json_adds_up_with_one_mfu(model_name: str, cluster_name: str) -> None:
    for est in _estimates(model_name, cluster_name):
        d = est.to_dict()
        _assert_whole_bytes(d)
        mem = d["memory_per_gpu_bytes"]
        # the documented keys, and every part the peak is made of: they add up to the total exactly
        assert {"params", "gradients", "optimizer_states", "activations", "total"} <= set(mem)
        for block in ("memory_per_gpu_bytes", "engine_model_states_bytes", "host_memory_per_node_bytes"):
            _assert_adds_up(d[block])
        assert abs(mem["total"] - est.memory.total) <= len(mem)  # rounding each part to a byte
        # the peak is backward's or the optimizer step's, whichever is larger
        busy = mem["activations"] + mem["buffers"]
        assert abs(mem["step_transient_excess"] - max(0, d["step_transient_bytes"] - busy)) <= 2
        assert d["peak_phase"] == ("optimizer step" if mem["step_transient_excess"] else "backward")
        # one parameter count: the per-GPU params are the engine's working copy (F72)
        engine = d["engine_model_states_bytes"]
        assert mem["params"] == engine["low_precision_params"]
        assert mem["gradients"] == engine["gradients"]
        assert abs(mem["optimizer_states"] - engine["master_params"] - engine["optimizer_moments"]) <= 1
        # the host's parts: offload (what the fit checks) and the snapshots of asynchronous saves
        host = d["host_memory_per_node_bytes"]
        offload = host["offloaded_states"] + host["nvme_swap_buffers"] + host["activation_checkpoints"]
        assert abs(offload - d["cpu_memory_per_node_bytes"]) <= 3
        assert d["fits_gpu"] == (est.memory.total <= d["gpu_memory_bytes"] + 1)
        # one MFU: model FLOPs per token × tokens/s per GPU over the peak of the layout's precision
        world = d["layout"]["world_size"]
        assert d["peak_flops_per_gpu"] == est.cluster.peak_flops(d["layout"]["precision"])
        assert d["tflops_per_gpu"] == pytest.approx(
            d["model_flops_per_token"] * d["tokens_per_s"] / world / 1e12, rel=1e-12
        )
        assert d["mfu"] == pytest.approx(d["tflops_per_gpu"] * 1e12 / d["peak_flops_per_gpu"], rel=1e-12)
        # hardware FLOPs are model FLOPs plus what is computed again or padded: never fewer
        assert d["hardware_flops_per_token"] >= d["model_flops_per_token"]
        assert d["hardware_tflops_per_gpu"] >= d["tflops_per_gpu"] * (1 - 1e-12)
        # Llama 4's HF block computes every expert (toolkit.plan.cost.moe.routed_copies)
        dense_experts = est.model.family.hf_dense_experts and d["layout"]["ep"] == 1
        if d["layout"]["recompute"] == "none" and est.model.moe_capacity_factor <= 1 and not dense_experts:
            assert d["hardware_flops_per_token"] == d["model_flops_per_token"]
        assert sum(d["step_time_breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=1e-12)


def _memory_rows(text: str) -> dict[str, float]:
    """The per-GPU memory table of `print_estimate`'s text, label → bytes (the sizes as printed)."""
    table = text[text.index("Memory per GPU") : text.index("Host memory per node")]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 2 and (m := re.fullmatch(r"([\d,.]+) (B|KiB|MiB|GiB)", cells[1])):
            rows[cells[0]] = float(m[1].replace(",", "")) * UNIT[m[2]]
    return rows


@pytest.mark.parametrize("model_name", MODELS)
def test_estimate_text_rows_add_up_in_one_unit(model_name: str) -> None:
    """The text table's rows sum to its total (to the printed rounding), memory is never printed in GB/MB,
    and a tiny model's figures keep their digits (MiB, not 0.00 GiB)."""
    cluster = "cpu" if model_name.startswith("tiny") else "dgx-a100-80g"
    r = dstk("estimate", "--model", model_name, "--cluster", cluster, "--nodes", "2", "--zero-stage", "3")
    assert r.code == 0, r.err
    rows = _memory_rows(r.out)
    total, parts = rows.pop("total"), {k: v for k, v in rows.items() if k != "capacity"}
    assert len(parts) == 7
    assert sum(parts.values()) == pytest.approx(total, abs=len(parts) * 0.005 * GIB)
    assert not re.search(r"\d [KMGT]B\b(?!/s)", r.out), "memory in decimal units"
    assert not re.search(r"\b0\.00 GiB", r.out)
    # one line says the throughput: the MFU, the peak it is against, and the executed TFLOP/s
    (line,) = [line for line in r.out.splitlines() if "MFU" in line]
    assert "peak" in line and "executed" in line and line.startswith(("fits", "does not fit"))


def test_the_f4_example_has_a_row_for_the_optimizer_step() -> None:
    """Catalogue F4: llama-7b at ZeRO-0 peaks in the optimizer step (at 2048 tokens: at 4096, HF's eager
    modules' activations make backward the peak); its table now has that row."""
    args = ["--model", "llama-7b", "--cluster", "dgx-a100-80g", "--zero-stage", "0", "--global-batch", "8"]
    args += ["--seq-length", "2048"]
    d = json.loads(dstk("estimate", *args, "--json").out)
    mem = d["memory_per_gpu_bytes"]
    assert d["peak_phase"] == "optimizer step" and mem["step_transient_excess"] > 4 * GIB
    rows = _memory_rows(dstk("estimate", *args).out)
    assert rows["optimizer step above activations + buffers"] == pytest.approx(
        mem["step_transient_excess"], abs=0.005 * GIB
    )
    assert rows["total"] == pytest.approx(mem["total"], abs=0.005 * GIB)


def test_plan_prints_one_mfu_and_memory_in_one_unit() -> None:
    """Catalogue F1-F3, F8: the plan's table, Why and training cost share one MFU and GiB; host memory per
    node is a table of its own, and the JSON has its figures."""
    args = ["plan", "--model", "llama-13b", "--cluster", "dgx-a100-80g", "--tokens", "300e9"]
    text = dstk(*args).out
    data = json.loads(dstk(*args, "--json").out)
    assert data["training"]["mfu"] == pytest.approx(data["estimate"]["mfu"], rel=1e-12)
    mfus = set(re.findall(r"MFU (\d+\.\d)%", text))
    assert mfus == {f"{100 * data['estimate']['mfu']:.1f}"}, mfus
    assert not re.search(r"\d [KMGT]B\b(?!/s)", text), "memory in decimal units"
    per_gpu = text[text.index("Memory per GPU") : text.index("Host memory per node")]
    assert "host" not in per_gpu.lower() and "snapshot" not in per_gpu
    snapshots = data["estimate"]["host_memory_per_node_bytes"]["checkpoint_snapshots"]
    assert snapshots == data["checkpoint"]["snapshot_host_bytes"] > 0
    assert f"Snapshots hold {format_bytes(snapshots, 1)}" in text
    assert all(type(v) is int for k, v in data["checkpoint"].items() if k.endswith("bytes"))


def test_hardware_flops_include_what_recomputation_repeats() -> None:
    model, cluster = load_model("llama-7b"), load_cluster("dgx-a100-80g")
    ests = {
        r: estimate(model, cluster, resolve_layout(model, cluster, LayoutRequest(zero_stage=3, recompute=r)))
        for r in ("none", "selective", "full")
    }
    model_flops = ests["none"].model_flops_per_token
    assert {e.model_flops_per_token for e in ests.values()} == {model_flops}
    assert ests["none"].hardware_flops_per_token == model_flops
    assert model_flops < ests["selective"].hardware_flops_per_token < ests["full"].hardware_flops_per_token
    # at ZeRO-3 dstk train's linear layers are DeepSpeed's autograd.Function, whose checkpoint replays whole
    # blocks: 4/3 of the model FLOPs less the LM head's forward; at ZeRO-1 torch's non-reentrant checkpoint
    # stops before each block's down projection (Layout.recompute_stops_early)
    assert ests["full"].hardware_flops_per_token == pytest.approx(4 / 3 * model_flops, rel=0.01)
    request = LayoutRequest(zero_stage=1, recompute="full")
    early = estimate(model, cluster, resolve_layout(model, cluster, request))
    down = 2 * model.n_layers * model.ffn_hidden_size * model.hidden_size
    assert early.hardware_flops_per_token == pytest.approx(ests["full"].hardware_flops_per_token - down)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (512, "512 B"), (2 * KIB, "2.00 KiB"), (64 * MIB, "64.00 MiB"), (79.2 * GIB, "79.20 GiB")],
)
def test_bytes_in_binary_units(n: float, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [(3_716_608, "3.72M"), (820_992, "821K"), (124_439_808, "124M"), (6_738_415_616, "6.74B"),
     (1_008_038_758_400, "1.01T"), (999_600_000, "1B"), (12, "12")],
)  # fmt: skip
def test_counts_keep_three_figures(n: float, text: str) -> None:
    assert format_count(n) == text


@pytest.mark.parametrize("columns", ["80", "100"])
def test_presets_piped_at_any_width_show_every_name_whole(columns: str) -> None:
    r = dstk_process("presets", env={"COLUMNS": columns})
    assert r.code == 0, r.err
    first_cells = {line.split()[0] for line in r.out.splitlines() if line.strip()}
    for name in [*MODELS, *preset_names("clusters"), "local"]:
        assert name in first_cells, name
    assert "…" not in r.out and "0.00B" not in r.out
    tiny = next(line for line in r.out.splitlines() if line.startswith("tiny-gpt2 "))
    assert "3.72M" in tiny


def test_piped_estimate_keeps_each_record_on_one_line() -> None:
    """Catalogue G5: at 80 columns, piped, the header, the layout and the throughput line are not broken."""
    args = ["estimate", "--model", "llama-7b", "--cluster", "dgx-a100-80g", "--zero-stage", "3"]
    r = dstk_process(*args, "--recompute", "selective", env={"COLUMNS": "80"})
    lines = r.out.splitlines()
    assert lines[0].endswith("ranks of 79.2 GiB)")
    assert lines[1].startswith("layout: ") and lines[1].endswith("recompute=selective bf16")
    (mfu,) = [line for line in lines if "MFU" in line]
    assert mfu.startswith("fits; ") and mfu.endswith("(recomputation included)")


def test_env_fields_never_run_into_their_source() -> None:
    """Catalogue G7: a dict value pushes only its own source comment right."""
    from toolkit.report.render import field_lines

    lines = field_lines(
        {"gpu_memory_gib": 10.59, "collective_bus_gb_per_s": {"all_reduce": 0.812, "all_to_all": 0.959}},
        {"gpu_memory_gib": "90 % of MemTotal", "collective_bus_gb_per_s": "cpu preset"},
    )
    assert lines[0].split("  # ")[1] == "90 % of MemTotal"
    assert lines[1].endswith("0.959}  # cpu preset")
