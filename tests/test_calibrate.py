"""`dstk calibrate` on this machine: 2 ranks measure at once and the cluster file it writes loads and carries
every measured figure the cost model reads (the `cpu` preset is this command's output)."""

from __future__ import annotations

import pytest
import yaml

from tests.cli import dstk_process
from toolkit.load import load_cluster

pytestmark = pytest.mark.multiprocess


def test_calibrate_writes_a_cluster_the_planner_loads(tmp_path) -> None:
    out = tmp_path / "cal.yaml"
    proc = dstk_process("calibrate", "--ranks", "2", "-o", str(out), env={"OMP_NUM_THREADS": "1"})
    assert proc.code == 0, proc.err[-3000:]
    cluster = load_cluster(str(out))
    assert cluster.accelerator == "cpu" and cluster.gpus_per_node == 2
    bus = cluster.collective_bus_gb_per_s or {}
    assert set(bus) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
    assert all(v > 0 for v in bus.values()) and cluster.intra_node_gb_per_s == bus["all_reduce"]
    assert cluster.gpu_peak_tflops > 0 and 0 < cluster.gpu_matmul_efficiency <= 1
    # DeepSpeed's optimizer step per parameter, on both of its code paths
    measured = cluster.optimizer_ns_per_param or {}
    assert set(measured) == {"replicated", "partitioned"} and all(v > 0 for v in measured.values())
    assert "optimizer_ns_per_param" in yaml.safe_load(out.read_text())
