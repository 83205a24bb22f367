"""`--cluster local` detection from recorded real outputs (tests/data/hardware, sources in SOURCES.md):
nvidia-smi of A100/H100/H200/V100/T4/B200/B300/GB200 and other nodes, rocm-smi/rocminfo/amd-smi of AMD
Instinct nodes, /proc/cpuinfo with and without native bf16. Each gives
the right peaks, memory, bf16 support and rank count; the precision the planner then picks follows the
hardware; an unknown GPU is named with the fields that are unknown; a cached calibration wins."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from toolkit.host.amd_smi import parse_amd_smi
from toolkit.host.detect import parse_cpuinfo, parse_nvidia_smi
from toolkit.host.local import detect
from toolkit.plan.choice import precision_reason
from toolkit.plan.layout import LayoutRequest, default_precision
from toolkit.plan.presets import match_gpu
from toolkit.plan.rules import resolve_layout
from toolkit.plan.specs import ClusterSpec

DATA = Path(__file__).parent / "data" / "hardware"
AVX2_HOST = (DATA / "cpuinfo_amd-epyc-avx2-host.txt").read_text()
MEMINFO = "MemTotal:       2113929216 kB\nMemAvailable:   2000000000 kB\n"


def _detect(smi: str = "", cpu: str = AVX2_HOST, **kw) -> object:
    return detect(nvidia_smi=smi, cpuinfo=cpu, meminfo=MEMINFO, use_cache=False, versions={}, **kw)


# file, GPUs, table entry, memory GiB (99 % of memory.total), 16-bit peak, bf16, precision the planner picks
GPUS = [
    ("nvidia-smi_a100-sxm4-80gb_x4.txt", 4, "a100-sxm4-80gb", 79.2, 312, True, "bf16"),
    ("nvidia-smi_h100-sxm5-80gb_x8.txt", 8, "h100-sxm5-80gb", 78.9, 989.5, True, "bf16"),
    ("nvidia-smi_h100-nvl_x2.txt", 2, "h100-nvl", 92.6, 835.5, True, "bf16"),
    ("nvidia-smi_h200_x1.txt", 1, "h200-sxm-141gb", 139.0, 989.5, True, "bf16"),
    ("nvidia-smi_v100-sxm2-16gb_x8.txt", 8, "v100-sxm2-16gb", 15.8, 125, False, "fp16"),
    ("nvidia-smi_t4_x1.txt", 1, "t4", 14.6, 65, False, "fp16"),
    ("nvidia-smi_l40s_x2.csv", 2, "l40s", 44.5, 362.05, True, "bf16"),
    ("nvidia-smi_l4_x1.txt", 1, "l4", 22.3, 121, True, "bf16"),
    ("nvidia-smi_a10_x1.txt", 1, "a10", 22.3, 125, True, "bf16"),
    ("nvidia-smi_rtx4090_x8.txt", 8, "rtx-4090", 23.7, 165.2, True, "bf16"),
    ("nvidia-smi_rtx-a6000_x9.txt", 9, "rtx-a6000", 44.5, 154.8, True, "bf16"),
    ("nvidia-smi_b200_x8.txt", 8, "b200", 177.3, 2250, True, "bf16"),
    ("nvidia-smi_b200_r610_excerpt_x2.txt", 2, "b200", 177.3, 2250, True, "bf16"),
    ("nvidia-smi_b300_excerpt_x1.txt", 1, "b300", 265.9, 2250, True, "bf16"),
    ("nvidia-smi_gb200_x4.txt", 4, "gb200", 183.2, 2500, True, "bf16"),
]


@pytest.mark.parametrize("name,count,key,mem,peak,bf16,precision", GPUS, ids=[g[0] for g in GPUS])
def test_recorded_nvidia_smi_gives_the_node(name, count, key, mem, peak, bf16, precision) -> None:
    text = (DATA / name).read_text()
    gpus = parse_nvidia_smi(text)
    assert len(gpus) == count and match_gpu(gpus[0].name)[0] == key
    det = _detect(text)
    spec = ClusterSpec.model_validate(det.cluster)
    assert spec.accelerator == "cuda" and spec.gpus_per_node == count
    assert spec.gpu_memory_gib == pytest.approx(mem, abs=0.05)
    assert spec.gpu_peak_tflops == pytest.approx(peak) and spec.supports_bf16 is bf16
    # the table's fp32 (CUDA cores), not a fixed ratio of the tensor-core peak: 1/16 on A100, 1/2 on an L4
    assert spec.gpu_fp32_peak_tflops == match_gpu(gpus[0].name)[1]["fp32_tflops"] < spec.gpu_peak_tflops
    # FP8 where the table has it (Ada, Hopper), with its source; none elsewhere
    assert spec.gpu_fp8_peak_tflops == match_gpu(gpus[0].name)[1]["fp8_tflops"]
    assert spec.supports("fp8") is (spec.gpu_fp8_peak_tflops is not None)
    assert default_precision(spec) == precision
    assert not det.warnings and det.sources["gpu_peak_tflops"].startswith(f"table {key}")


def test_nvlink_nodes_get_nvlink_bandwidth_and_pcie_cards_pcie() -> None:
    h100 = _detect((DATA / "nvidia-smi_h100-sxm5-80gb_x8.txt").read_text()).cluster
    l4 = _detect((DATA / "nvidia-smi_l4_x1.txt").read_text()).cluster
    assert h100["intra_node_gb_per_s"] > 300 > 50 > l4["intra_node_gb_per_s"]


def test_csv_query_output_without_header_parses_in_query_order() -> None:
    gpus = parse_nvidia_smi("NVIDIA A100-SXM4-40GB, 40960 MiB, 535.104.05, 8.0\n" * 8)
    assert len(gpus) == 8 and gpus[0].memory_mib == 40960 and gpus[0].driver == "535.104.05"
    assert match_gpu(gpus[0].name)[0] == "a100-sxm4-40gb"


def test_unknown_gpu_is_a_warning_naming_what_is_unknown() -> None:
    det = _detect(
        "name, memory.total [MiB], driver_version, compute_cap\nNVIDIA A40, 46068 MiB, 550.54, 8.6\n"
    )
    assert len(det.warnings) == 1 and "'NVIDIA A40'" in det.warnings[0] and "\n" not in det.warnings[0]
    assert any("gpu_peak_tflops" in u for u in det.unknown)
    ClusterSpec.model_validate(det.cluster)  # still a usable description: memory and count are known
    assert det.cluster["gpus_per_node"] == 1 and det.cluster["gpu_memory_gib"] == pytest.approx(44.5, abs=0.1)


@pytest.mark.parametrize(
    "name", ["NVIDIA L40", "NVIDIA A10G", "NVIDIA GH200 480GB", "NVIDIA H800 PCIe", "AMD Instinct MI308X"]
)
def test_gpu_names_match_whole_words(name) -> None:
    assert match_gpu(name) is None


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA GB200", "gb200"),  # "B200" is inside "GB200": whole words at both ends
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB300", "gb300"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA H800", "h800-sxm5-80gb"),
        ("AMD Instinct Mi325X VF", "mi325x"),  # amd-smi's spelling for the SR-IOV function
        ("MI300X-O", "mi300x"),
    ],
)
def test_the_gpus_of_2026_match_their_own_entry(name, key) -> None:
    assert match_gpu(name)[0] == key


def test_driver_r610_header_still_gives_the_driver() -> None:
    """From R610 the table's header says "KMD Version" (and "CUDA UMD Version") where it said "Driver Version"."""
    r610 = parse_nvidia_smi((DATA / "nvidia-smi_b200_r610_excerpt_x2.txt").read_text())
    older = parse_nvidia_smi((DATA / "nvidia-smi_b200_x8.txt").read_text())
    assert [g.driver for g in r610] == ["610.43.02"] * 2 and older[0].driver == "580.95.05"
    assert (
        _detect((DATA / "nvidia-smi_b200_r610_excerpt_x2.txt").read_text()).hardware["driver"] == "610.43.02"
    )


def test_blackwell_nodes_detect_mxfp8_and_nvfp4_and_hopper_neither() -> None:
    b200 = ClusterSpec.model_validate(_detect((DATA / "nvidia-smi_b200_x8.txt").read_text()).cluster)
    h100 = ClusterSpec.model_validate(
        _detect((DATA / "nvidia-smi_h100-sxm5-80gb_x8.txt").read_text()).cluster
    )
    assert (b200.gpu_mxfp8_peak_tflops, b200.gpu_nvfp4_peak_tflops) == (4500, 9000)
    assert b200.supports("mxfp8") and b200.supports("nvfp4")
    assert not h100.supports("mxfp8") and not h100.supports("nvfp4") and h100.supports("fp8")
    assert b200.intra_node_gb_per_s == pytest.approx(0.78 * 900) and b200.intra_node_topology == "switch"


# AMD file, GPUs, table entry, memory GiB (99 % of what the tool reports; the table's usable memory where it
# reports none), driver
AMD = [
    ("rocm-smi_mi300x_x1.txt", 1, "mi300x", 191.5, None),
    ("rocm-smi_mi300x_x4.txt", 4, "mi300x", 191.5, None),
    ("rocm-smi-a_mi300x_x4.txt", 4, "mi300x", 191.5, "6.7.0"),
    ("rocm-smi-i_mi300x_x1.txt", 1, "mi300x", 191.5, None),
    ("rocminfo_mi300x_x4.txt", 4, "mi300x", 190.1, None),
    ("amd-smi-static_mi300x_truncated.txt", 1, "mi300x", 191.5, None),
    ("amd-smi-static_mi350x_excerpt.txt", 1, "mi350x", 287.5, "6.18.3"),
]


@pytest.mark.parametrize("name,count,key,mem,driver", AMD, ids=[a[0] for a in AMD])
def test_recorded_amd_tools_give_the_node(name, count, key, mem, driver) -> None:
    """rocm-smi (its concise table, -i, -a), rocminfo and amd-smi name AMD Instinct GPUs in their own ways
    (`MI300X-O` on some firmware); each is the table's entry, trained as DeepSpeed's "cuda" accelerator on an
    xGMI mesh."""
    text = (DATA / name).read_text()
    gpus = parse_amd_smi(text)
    assert len(gpus) == count and match_gpu(gpus[0].name)[0] == key and gpus[0].driver == driver
    det = detect(
        nvidia_smi="", amd_smi=text, cpuinfo=AVX2_HOST, meminfo=MEMINFO, use_cache=False, versions={}
    )
    spec = ClusterSpec.model_validate(det.cluster)
    entry = match_gpu(gpus[0].name)[1]
    assert spec.accelerator == "cuda" and spec.gpus_per_node == count and not det.warnings
    assert spec.gpu_memory_gib == pytest.approx(mem, abs=0.05)
    assert spec.gpu_peak_tflops == entry["bf16_tflops"] and spec.gpu_sm_count == entry["sm_count"]
    assert spec.intra_node_topology == "full_mesh"  # RCCL's ring share of the 7 xGMI links
    assert spec.intra_node_gb_per_s == pytest.approx(0.7 * entry["nvlink_gb_per_s"], abs=0.05)
    assert default_precision(spec) == "bf16" and spec.supports("fp8") and not spec.supports("nvfp4")
    assert spec.supports("mxfp8") is (key == "mi350x")  # CDNA4 has OCP MXFP8, CDNA3 does not
    assert det.sources["accelerator"].startswith(gpus[0].tool)


CPUS = [
    ("cpuinfo_intel-xeon-platinum-8480plus.txt", True, "bf16"),
    ("cpuinfo_intel-xeon-platinum-8260m.txt", False, "fp32"),
    ("cpuinfo_intel-xeon-e5-2680v3.txt", False, "fp32"),
    ("cpuinfo_amd-epyc-avx2-host.txt", False, "fp32"),
    ("cpuinfo_amd-epyc-zen4-host.txt", True, "bf16"),
]


@pytest.mark.parametrize("name,native,precision", CPUS, ids=[c[0] for c in CPUS])
def test_recorded_cpuinfo_gives_bf16_by_isa(name, native, precision) -> None:
    text = (DATA / name).read_text()
    cpu = parse_cpuinfo(text)
    assert cpu.bf16_native is native
    det = _detect(cpu=text)
    spec = ClusterSpec.model_validate(det.cluster)
    assert spec.accelerator == "cpu" and not spec.supports_fp16
    assert default_precision(spec) == precision
    if not native:
        # emulated bf16 is ~75× slower than fp32 (measured on the AVX2 host), and the reason says so
        assert spec.peak_flops("bf16") < spec.peak_flops("fp32") / 50
        assert "emulated" in precision_reason(spec, "fp32")
    assert "not calibrated" in det.summary() and "dstk calibrate" in det.summary()


@pytest.mark.parametrize(
    "cap,native",
    [
        ("AVX2", False),
        ("avx512_core_vnni", False),
        ("AVX512_CORE_BF16", True),
        ("DEFAULT", True),
        ("foo", True),
    ],
)
def test_onednn_isa_cap_makes_a_native_bf16_host_emulate_it(cap, native) -> None:
    """ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 is how a native-bf16 host reproduces an AVX2-only one
    (measured: 202 → 0.9 GFLOP/s per core); detection plans what torch will then run, and a new fingerprint
    keeps the host's uncapped calibration apart."""
    zen4 = (DATA / "cpuinfo_amd-epyc-zen4-host.txt").read_text()
    plain, capped = _detect(cpu=zen4), _detect(cpu=zen4, environ={"ONEDNN_MAX_CPU_ISA": cap})
    spec = ClusterSpec.model_validate(capped.cluster)
    assert default_precision(spec) == ("bf16" if native else "fp32")
    assert spec.peak_flops("fp32") == ClusterSpec.model_validate(plain.cluster).peak_flops("fp32")
    assert (capped.fingerprint == plain.fingerprint) is native
    if not native:
        assert "hides avx512_bf16" in capped.hardware["isa_cap"]
        assert "emulated" in precision_reason(spec, "fp32")
    elif cap == "foo":
        assert "not a oneDNN ISA level" in capped.hardware["isa_cap"]


def test_cpu_ranks_share_the_cores(tmp_path) -> None:
    eight = "".join(f"processor\t: {i}\n{AVX2_HOST.split(chr(10), 1)[1]}\n" for i in range(8))
    root = tmp_path / "root"
    for node in (0, 1):
        (root / f"sys/devices/system/node/node{node}").mkdir(parents=True)
    one_socket = _detect(cpu=eight).cluster
    two_sockets = detect(
        nvidia_smi="", cpuinfo=eight, meminfo=MEMINFO, root=root, use_cache=False, versions={}
    )
    assert one_socket["gpus_per_node"] == 2 and two_sockets.cluster["gpus_per_node"] == 2
    fp32_per_rank = one_socket["gpu_fp32_peak_tflops"]
    assert fp32_per_rank == pytest.approx(
        4 * parse_cpuinfo(AVX2_HOST).fp32_flops_per_cycle() * 2.445 / 1e3, rel=0.01
    )


def test_a_cached_calibration_for_this_host_replaces_the_table(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DSTK_CACHE_DIR", str(tmp_path))
    first = detect(nvidia_smi="", cpuinfo=AVX2_HOST, meminfo=MEMINFO, versions={"torch": "x"})
    assert first.calibration is None
    path = tmp_path / "calibration" / f"{first.fingerprint}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        yaml.safe_dump({"name": "calibrated", "gpu_peak_tflops": 0.00065, "gpu_fp32_peak_tflops": 0.031})
    )
    again = detect(nvidia_smi="", cpuinfo=AVX2_HOST, meminfo=MEMINFO, versions={"torch": "x"})
    assert again.calibration == path and again.cluster["gpu_fp32_peak_tflops"] == 0.031
    assert again.cluster["name"] == "local" and "calibrated" in again.summary()
    assert "measured by dstk calibrate" in again.sources["gpu_fp32_peak_tflops"]
    # another torch version is another host as far as measurements go
    other = detect(nvidia_smi="", cpuinfo=AVX2_HOST, meminfo=MEMINFO, versions={"torch": "y"})
    assert other.calibration is None and other.fingerprint != first.fingerprint


def test_plan_on_the_local_cluster_imports_no_torch_and_answers_fast(tmp_path) -> None:
    probe = (
        "import sys, time, io, contextlib; t = time.process_time(); from toolkit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out: code = main(['plan', '--model', 'gpt2', "
        "'--cluster', 'local', '--json'])\n"
        "import json; json.loads(out.getvalue())\n"
        "print(code, time.process_time() - t, [m for m in ('torch', 'deepspeed') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        env={"DSTK_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    code, seconds, heavy = proc.stdout.split(maxsplit=2)
    assert code == "0" and heavy.strip() == "[]", proc.stderr
    assert float(seconds) < 1.0  # CPU seconds: the suite runs beside 2-rank jobs, wall time is theirs too
    assert "cluster local:" in proc.stderr  # what was detected is said, on stderr


def test_local_is_a_cluster_name_everywhere() -> None:
    from toolkit.host.local import load_cluster

    t = time.process_time()
    cluster = load_cluster("local", {"gpus_per_node": 2})
    assert cluster.name == "local" and cluster.gpus_per_node == 2 and time.process_time() - t < 1


def test_a_run_far_from_its_prediction_names_the_cause_and_the_fix() -> None:
    from toolkit.plan.load import load_cluster, load_model
    from toolkit.run.summary import reality_check

    model = load_model("tiny-gpt2")
    emulated = ClusterSpec.model_validate(_detect().cluster)  # AVX2 host: bf16 at fp32/75
    layout = resolve_layout(model, emulated, LayoutRequest(precision="bf16", micro_batch_size=8))
    summary = {
        "step_time_s": 8.68,  # what the AVX2 host measured for the demo's bf16 plan
        "peak_memory_bytes": [0.8e9],
        "predicted": {"step_time_s": 0.129, "memory_per_gpu_bytes": {"total": 0.8e9}},
    }
    (warning,) = reality_check(summary, emulated, layout)
    assert "step time ×67.29" in warning and "emulated" in warning and "--precision fp32" in warning
    assert "peak memory" not in warning  # within ×0.5–2
    preset = load_cluster("cpu")
    (warning,) = reality_check(
        summary, preset, resolve_layout(model, preset, LayoutRequest(precision="bf16"))
    )
    assert "'cpu'" in warning and "--cluster local" in warning and "dstk calibrate" in warning
    summary["step_time_s"] = 0.2
    assert reality_check(summary, preset, layout) == []


@pytest.mark.parametrize(
    ("environ", "count"),
    [
        ({}, 8),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 0),
        ({"CUDA_VISIBLE_DEVICES": "0,3"}, 2),
        ({"CUDA_VISIBLE_DEVICES": "1,9,2"}, 1),  # CUDA stops at the first invalid index
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f1c2e4a-0000-0000-0000-000000000000"}, 1),
        ({"DS_ACCELERATOR": "cpu"}, 0),
        ({"DS_ACCELERATOR": "cuda", "CUDA_VISIBLE_DEVICES": "7"}, 1),
    ],
)
def test_hidden_gpus_are_not_planned_for(environ, count) -> None:
    """nvidia-smi lists every GPU of the box whatever CUDA_VISIBLE_DEVICES says; `--cluster local` describes
    what the process may use (found on an H200 node: with CUDA_VISIBLE_DEVICES= the CPU run was planned as
    the H200 and measured ×7.8 slower than predicted)."""
    from toolkit.host.detect import visible_gpus

    gpus = parse_nvidia_smi((DATA / "nvidia-smi_h100-sxm5-80gb_x8.txt").read_text())
    kept, why = visible_gpus(gpus, environ)
    assert len(kept) == count and (why is None) == (not environ)


# `dstk calibrate --json` per-rank measurements recorded on real hosts (tests/data/calibration): the lent H200
# node's GPU and its AMX Xeon (GPUs hidden), this machine kind's Zen 4 EPYC with and without oneDNN's bf16
CALIBRATIONS = DATA.parent / "calibration"


@pytest.mark.parametrize(
    "name,precision",
    [
        ("h200_cuda_1rank.json", "bf16"),
        ("xeon-amx_cpu_2ranks.json", "bf16"),
        ("epyc-zen4_cpu_2ranks.json", "bf16"),
        ("epyc-zen4-onednn-avx2_cpu_2ranks.json", "fp32"),
    ],
)
def test_recorded_calibrations_give_the_precision_and_the_device_memory(name, precision) -> None:
    """From a measurement to the cluster file: the precision the host computes fastest; on a GPU the
    framework overhead is what the device holds outside torch's pool (context, NCCL), not the host RSS the CPU
    accelerator counts, and host memory bandwidth is a host copy, not the device's."""
    from toolkit.host.calibration import cluster_description

    results = json.loads((CALIBRATIONS / name).read_text())
    spec = ClusterSpec.model_validate(cluster_description(results, "calibrated"))
    assert default_precision(spec) == precision == results[0]["precision"]
    if spec.accelerator == "cpu":
        assert spec.framework_overhead_gib == pytest.approx(
            max(r["engine"]["rss_gib"] for r in results), abs=1e-3
        )
        assert spec.cpu_memory_gb_per_s == pytest.approx(sum(r["copy_gb_per_s"] for r in results), abs=0.01)
    else:
        gpu = results[0]
        assert spec.supports_fp16 and spec.framework_overhead_gib == pytest.approx(
            gpu["device_outside_gib"], abs=1e-3
        )
        assert gpu["device_outside_gib"] < gpu["engine"]["rss_gib"]
        assert spec.cpu_memory_gb_per_s == pytest.approx(gpu["host_copy_gb_per_s"], abs=0.01)
        assert spec.cpu_memory_gb_per_s < gpu["copy_gb_per_s"] / 5  # HBM copies are not host memory


def test_gpu_figures_have_one_source(tmp_path) -> None:
    """A cluster preset that names its GPU plans with presets/gpus.yaml's figures (the same ones `--cluster
    local` detects on that GPU), and a description that states one of them beside `gpu:` is refused."""
    import yaml

    from toolkit.errors import UserError
    from toolkit.plan.load import load_cluster as load_description
    from toolkit.plan.presets import PRESET_DIR, cluster_gpu_fields, gpu_table, preset_names

    named = 0
    for name in preset_names("clusters"):
        raw = yaml.safe_load((PRESET_DIR / "clusters" / f"{name}.yaml").read_text())
        if "gpu" not in raw:
            assert raw["accelerator"] == "cpu", name  # every CUDA preset names its GPU
            continue
        named += 1
        cluster = load_description(name).model_dump()
        for field, value in cluster_gpu_fields(raw["gpu"], gpu_table()[raw["gpu"]]).items():
            assert cluster[field] == value, (name, field)
    assert named == 14
    clash = tmp_path / "mine.yaml"
    clash.write_text("name: mine\ngpu: h100-sxm5-80gb\ngpus_per_node: 8\ngpu_peak_tflops: 989\n")
    with pytest.raises(UserError, match=r"gpu_peak_tflops: given beside gpu: h100-sxm5-80gb"):
        load_description(str(clash))
    clash.write_text("name: mine\ngpu: h100\ngpus_per_node: 8\n")
    with pytest.raises(UserError, match=r"gpu: 'h100' is not in presets/gpus.yaml"):
        load_description(str(clash))


def test_the_hardware_of_2026_is_in_dstk_presets() -> None:
    """The Blackwell, H800 and AMD Instinct presets load, name their GPU and are listed; an NVL72 rack shows
    its NVLink domain beside the 4 GPUs of a tray."""
    from tests.cli import dstk

    new = {
        "dgx-b200": "b200",
        "dgx-b300": "b300",
        "gb200-nvl72": "gb200",
        "gb300-nvl72": "gb300",
        "hgx-h800": "h800-sxm5-80gb",
        "mi300x-8": "mi300x",
        "mi325x-8": "mi325x",
        "mi355x-8": "mi355x",
    }
    rows = {r["name"]: r for r in json.loads(dstk("presets", "--json").out)["clusters"]}
    from toolkit.plan.presets import PRESET_DIR

    for name, gpu in new.items():
        assert yaml.safe_load((PRESET_DIR / "clusters" / f"{name}.yaml").read_text())["gpu"] == gpu
        assert rows[name]["accelerator"] == "cuda"  # DeepSpeed on ROCm too
    assert (rows["gb200-nvl72"]["nodes"], rows["gb200-nvl72"]["gpus_per_node"]) == (18, 4)
    assert rows["gb200-nvl72"]["nvlink_domain_gpus"] == rows["gb300-nvl72"]["nvlink_domain_gpus"] == 72
    table = dstk("presets").out
    assert any(line.startswith("gb200-nvl72 ") and " 4 (72) " in line for line in table.splitlines())
