"""AMD Instinct GPUs for `--cluster local`: what ROCm's tools say about them, read as text (pure: the tools run
only in `run_amd_smi`, on a live host). Recorded outputs and their sources: tests/data/hardware/SOURCES.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from toolkit.host.detect import GpuInfo

# `rocm-smi` lines read `GPU[0]\t\t: Card Series: \t\tAMD Instinct MI300X OAM` (`-i` says `Device Name`,
# `--showmeminfo vram` adds `VRAM Total Memory (B): ...`); its default "Concise Info" table puts the name, cut
# to 20 characters, on the line under each device's row; `amd-smi static` prints a `GPU: 0` block per device
# with `MARKET_NAME:` (which firmware may shorten to `MI300X-O`) and, under `VRAM:`, `SIZE: 196592 MB` (MiB);
# `rocminfo` an agent per device with `Marketing Name:`, `Device Type: GPU` and its memory pools in KB.
_ROCM_SMI_FIELD = re.compile(r"^GPU\[(\d+)\]\s*:\s*([^:]+?):\s*(.*?)\s*$")
_ROCM_SMI_NAMES = ("card series", "device name")
_CONCISE_ROW = re.compile(
    r"^(\d+)\s+(?:\d+\s+)?(?:0x[0-9a-fA-F]+\s+)*\[0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\]"
)
_AMD_SMI_GPU = re.compile(r"^GPU:\s*(\d+)\s*$")


def parse_amd_smi(text: str) -> list[GpuInfo]:
    """AMD GPUs from `amd-smi static`, `rocm-smi` (its concise table, or `-i`/`-a`/`--showproductname` with
    `--showmeminfo vram`) or `rocminfo` output: name, and memory where the output has it."""
    if "HSA Agents" in text:
        return _parse_rocminfo(text)
    lines = text.splitlines()
    if any(_AMD_SMI_GPU.match(ln.strip()) for ln in lines):
        return _parse_amd_smi_static(lines)
    driver = re.search(r"^Driver version:\s*(\S+)", text, re.M)
    fields: dict[int, dict[str, str]] = {}
    for line in lines:
        m = _ROCM_SMI_FIELD.match(line.strip())
        if m:
            fields.setdefault(int(m.group(1)), {}).setdefault(m.group(2).strip().lower(), m.group(3))
    gpus = []
    for _, f in sorted(fields.items()):
        name = next((f[k] for k in _ROCM_SMI_NAMES if f.get(k)), None)
        if not name:
            continue
        vram = f.get("vram total memory (b)")
        memory = int(vram) / 2**20 if vram and vram.isdigit() else None
        gpus.append(GpuInfo(name, memory, driver.group(1) if driver else None, tool="rocm-smi"))
    if gpus:
        return gpus
    for i, line in enumerate(lines[:-1]):  # the concise table: the name on the line under each row
        if _CONCISE_ROW.match(line.strip()) and lines[i + 1].strip():
            gpus.append(GpuInfo(lines[i + 1].strip(), None, tool="rocm-smi"))
    return gpus


def _parse_amd_smi_static(lines: list[str]) -> list[GpuInfo]:
    blocks: list[dict[str, str]] = []
    section = ""
    for line in lines:
        if _AMD_SMI_GPU.match(line.strip()):
            blocks.append({})
            continue
        key, sep, value = line.strip().partition(":")
        if not blocks or not sep:
            continue
        if not value.strip():
            section = key.strip().upper()
            continue
        blocks[-1].setdefault(f"{section}.{key.strip().upper()}", value.strip())
    gpus = []
    for b in blocks:
        name = b.get("ASIC.MARKET_NAME")
        if not name:
            continue
        size = re.fullmatch(r"(\d+)\s*MB", b.get("VRAM.SIZE", ""))
        gpus.append(
            GpuInfo(
                name,
                float(size.group(1)) if size else None,  # amd-smi's "MB" are MiB: 196592 on a 192 GiB MI300X
                b.get("DRIVER.VERSION"),
                b.get("ASIC.TARGET_GRAPHICS_VERSION"),
                tool="amd-smi",
            )
        )
    return gpus


def _parse_rocminfo(text: str) -> list[GpuInfo]:
    gpus = []
    for agent in re.split(r"^\*+\s*\n\s*Agent \d+\s*\n\*+\s*$", text, flags=re.M)[1:]:
        if not re.search(r"^\s*Device Type:\s*GPU\b", agent, re.M):
            continue
        name = re.search(r"^\s*Marketing Name:\s*(.+?)\s*$", agent, re.M)
        target = re.search(r"^\s*Name:\s*(gfx\w+)", agent, re.M)
        pool = re.search(r"Segment:\s*GLOBAL.*\n\s*Size:\s*(\d+)\(", agent)
        gpus.append(
            GpuInfo(
                name.group(1) if name else "unknown AMD GPU",
                int(pool.group(1)) / 1024 if pool else None,  # KB
                compute_cap=target.group(1) if target else None,
                tool="rocminfo",
            )
        )
    return gpus


def run_amd_smi() -> str | None:
    """On an AMD host: `amd-smi static --asic --vram --driver`, else `rocm-smi --showproductname --showmeminfo
    vram --showdriverversion`; None when neither runs."""
    for argv in (
        ["amd-smi", "static", "--asic", "--vram", "--driver"],
        ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showdriverversion"],
    ):
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout
    return None
