"""From the measurements of `toolkit.run.calibrate` (one dict per rank) to the cluster description the planner
reads: the slowest rank's figure wherever ranks differ, efficiencies at the precision training will run in.
Pure: the probes that produce the measurements live in the run half."""

from __future__ import annotations

import statistics
from typing import Any

from toolkit.host.detect import cpu_rank_memory_gib, host_memory_gib
from toolkit.plan.cost.compute import kernels_per_block
from toolkit.plan.specs import ModelSpec


def _kernel_us(result: dict[str, Any]) -> float:
    """Host cost per kernel as the cost model counts kernels: one block's measured host cost per micro-batch
    over the kernels its forward and backward issue (3 × `kernels_per_block`); one bare eager op if the
    probe's difference drowned in noise."""

    probe = ModelSpec(
        name="probe",
        architecture="gpt2",
        n_layers=1,
        hidden_size=32,
        n_heads=2,
        vocab_size=128,
        seq_length=16,
    )
    per_kernel = result["engine"]["block_s"] / (3 * kernels_per_block(probe)) * 1e6
    return per_kernel if per_kernel > result["op_us"] else result["op_us"]


def cluster_description(results: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """A cluster YAML from the measurements: the slowest rank's figure wherever ranks differ."""
    ranks = len(results)
    accel = results[0]["accelerator"]
    sixteen = "bf16" if results[0]["supports_bf16"] or accel == "cpu" else "fp16"
    precision = results[0]["precision"]
    peak = min(r["large_tflops"][sixteen] for r in results)
    fp32 = min(r["large_tflops"]["fp32"] for r in results)
    # efficiencies at the precision training will run in (the fastest one), as the cost model applies them
    eff = min(r["training_tflops"][precision] / r["large_tflops"][precision] for r in results)
    attention = min(r["attention_tflops"] / r["large_tflops"][precision] for r in results)
    coll = {
        name: {
            "bus_gb_per_s": min(r["collectives"][name]["bus_gb_per_s"] for r in results),
            "latency_us": statistics.median(r["collectives"][name]["latency_us"] for r in results),
        }
        for name in results[0]["collectives"]
    }
    # all-reduce is the collective everyone quotes (nccl-tests); the others are kept beside it because on gloo
    # they differ several-fold
    busbw = coll["all_reduce"]["bus_gb_per_s"] if coll else 100.0
    latency = statistics.median(c["latency_us"] for c in coll.values()) if coll else 10.0
    total_ram = host_memory_gib() or 0.0
    desc: dict[str, Any] = {
        "name": name,
        "nodes": 1,
        "gpus_per_node": ranks,
        "accelerator": accel,
        "gpu_memory_gib": cpu_rank_memory_gib(total_ram, ranks)
        if accel == "cpu"
        else round(min(r["device_memory_gib"] for r in results), 2),
        "gpu_peak_tflops": round(peak, 4),
        "gpu_fp32_peak_tflops": round(fp32, 4),
        "supports_bf16": bool(results[0]["supports_bf16"]),
        "supports_fp16": accel != "cpu",
        "gpu_memory_gb_per_s": round(min(r["elementwise_gb_per_s"] for r in results), 2),
        "gpu_matmul_efficiency": round(min(eff, 1.0), 3),
        "attention_efficiency": round(min(attention, 1.0), 3),
        "intra_node_gb_per_s": round(busbw, 3),
        "inter_node_gb_per_s": round(busbw, 3),
        "pcie_gb_per_s": round(min(r.get("pcie_gb_per_s", r["copy_gb_per_s"]) for r in results), 2),
        "cpu_memory_gib": round(total_ram, 1),
        "cpu_memory_gb_per_s": round(
            sum(r.get("host_copy_gb_per_s", r["copy_gb_per_s"]) for r in results), 2
        ),
        "nvme_gib": 0,
        "collective_latency_us": round(latency, 1),
        "collective_bus_gb_per_s": {k: round(v["bus_gb_per_s"], 3) for k, v in coll.items()} or None,
        "kernel_launch_us": round(max(_kernel_us(r) for r in results), 2),
        # on a GPU what the device holds outside torch's pool (context, NCCL); on the CPU accelerator the
        # rank's RSS once torch, DeepSpeed and transformers are loaded
        "framework_overhead_gib": round(
            max(r.get("device_outside_gib", r["engine"]["rss_gib"]) for r in results), 3
        ),
        "step_overhead_ms": round(max(r["engine"]["step_s"] for r in results) * 1e3, 2),
    }
    if results[0].get("optimizer_ns_per_param"):
        desc["optimizer_ns_per_param"] = {
            path: round(max(r["optimizer_ns_per_param"][path] for r in results), 2)
            for path in results[0]["optimizer_ns_per_param"]
        }
    if results[0].get("nvme_gb_per_s"):
        desc["nvme_gb_per_s"] = round(results[0]["nvme_gb_per_s"], 2)
    return desc


FIELD_NOTES = """\
# gpu_peak_tflops / gpu_fp32_peak_tflops: large 16-bit (bf16 on CPU, emulated where the ISA lacks it) and
# fp32 GEMMs per rank; the probes run in the fastest precision, `precision` below: gpu_matmul_efficiency is
# training-sized Linear forward + backward over the large GEMM in it, attention_efficiency causal SDPA
# forward + backward over it; gpu_memory_gb_per_s: elementwise kernels; cpu_memory_gb_per_s: host copies, all
# ranks together; collective_bus_gb_per_s / collective_latency_us: alpha-beta fits of each collective (bus
# bandwidth as nccl-tests defines it), intra_node_gb_per_s the all-reduce's; kernel_launch_us: one GPT-2
# block's host cost per micro-batch over its kernels; step_overhead_ms: the engine's fixed cost per step;
# optimizer_ns_per_param (CPU): DeepSpeed's optimizer step per updated parameter, ZeRO-0 (replicated) and
# ZeRO-1/2/3 (partitioned); framework_overhead_gib: on the CPU RSS after imports, process-group set-up and
# a tiny model's training steps, on a GPU what the device holds outside torch's pool (context, NCCL);
# storage_gb_per_s: write + fsync + SHA-256 at --checkpoint-path, a save's cost.
"""


def calibration_file(
    results: list[dict[str, Any]], name: str, storage_gb_per_s: float, ranks: int, took_s: float, host: str
) -> str:
    """The cluster description YAML `dstk calibrate` writes (and caches): where and how it was measured, what
    each field is, then the fields; checked to load as a ClusterSpec before anything is written."""
    import yaml

    from toolkit.plan.load import build
    from toolkit.plan.specs import ClusterSpec

    desc = cluster_description(results, name)
    desc["storage_gb_per_s"] = round(storage_gb_per_s, 3)
    build(ClusterSpec, desc, "calibration")  # what we write must load
    return (
        f"# Written by `dstk calibrate --ranks {ranks}` in {took_s:.0f} s: measured on this machine, {ranks} ranks "
        f"at once.\n# Host: {host}; training precision measured fastest: {results[0]['precision']}.\n"
        + FIELD_NOTES
        + yaml.safe_dump(desc, sort_keys=False)
    )
