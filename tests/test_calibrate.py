"""`dstk calibrate` on this machine: 2 ranks measure at once, its GEMM probes sized by time so that a host
whose bf16 is emulated finishes as fast as one with native bf16; the cluster file it writes loads, carries
every measured figure the cost model reads, is cached for this host, and `--cluster local` then uses it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.cli import dstk_process
from toolkit.plan.load import load_cluster

pytestmark = pytest.mark.multiprocess


def test_calibrate_writes_a_cluster_the_planner_loads_and_caches_it_for_local(tmp_path) -> None:
    out = tmp_path / "cal.yaml"
    proc = dstk_process("calibrate", "--ranks", "2", "-o", str(out), env={"OMP_NUM_THREADS": "1"})
    assert proc.code == 0, proc.err[-3000:]
    took = float(re.search(r"measured in (\d+) s", proc.out).group(1))
    print(f"dstk calibrate --ranks 2: {took:.0f} s")  # the time box is ≤ 60 s; the header records it too
    cluster = load_cluster(str(out))
    assert cluster.accelerator == "cpu" and cluster.gpus_per_node == 2
    bus = cluster.collective_bus_gb_per_s or {}
    assert set(bus) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert all(v > 0 for v in bus.values()) and cluster.intra_node_gb_per_s == bus["all_reduce"]
    assert cluster.gpu_peak_tflops > 0 and 0 < cluster.gpu_matmul_efficiency <= 1
    # DeepSpeed's optimizer step per parameter, on both of its code paths
    measured = cluster.optimizer_ns_per_param or {}
    assert set(measured) == {"replicated", "partitioned"} and all(v > 0 for v in measured.values())
    text = out.read_text()
    assert "optimizer_ns_per_param" in yaml.safe_load(text)
    # the precision it measured fastest is the one the planner will pick from the file
    from toolkit.plan.layout import default_precision

    fastest = re.search(r"training precision measured fastest: (\w+)", text).group(1)
    assert default_precision(cluster) == fastest

    # cached for this host: --cluster local now carries the measurement and says so
    cache = Path(os.environ["DSTK_CACHE_DIR"]) / "calibration"
    assert [p.read_text() for p in cache.glob("*.yaml")] == [text]
    plan = dstk_process("plan", "--model", "tiny-gpt2", "--cluster", "local", "--json")
    assert plan.code == 0 and "calibrated (" in plan.err, plan.err
    best = json.loads(plan.out)
    assert best["layout"]["precision"] == fastest
    # --reuse takes the cache instead of measuring again
    again = dstk_process("calibrate", "--reuse", "-o", str(tmp_path / "again.yaml"))
    assert again.code == 0 and "using this host's calibration" in again.out
    assert (tmp_path / "again.yaml").read_text() == text
