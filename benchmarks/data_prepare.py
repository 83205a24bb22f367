"""`dstk data prepare` on a generated corpus of 0.25 GB and 1 GB: documents/s, peak memory, dedup index size.

The corpus (three domains; Zipf-distributed pseudo-words, code, long narrative; ~2 % exact and ~2 % near
duplicates; boilerplate footers; a few broken lines) is generated on disk, then the real CLI runs in a
subprocess with near-duplicate removal, a 3-domain --mix and a BPE trained on the kept text. The parent samples
the child's /proc/PID/status every 0.1 s and takes its exact peak (ru_maxrss = VmHWM) from wait4.

Streaming check: peak(1 GB) ≤ 1.5 × peak(0.25 GB), on the anonymous resident memory (RssAnon: heap, numpy,
tokenizers), which is what the pipeline allocates. VmHWM is reported too; it also counts pages of memory-mapped
files, and `datasets.save_to_disk` reads the packed split through a memory map, so VmHWM grows by about the
output size even though those pages are clean page cache the kernel drops under pressure.

Usage: python benchmarks/data_prepare.py [--quick] [--workdir DIR] [--keep]
(--quick: 20 MB and 80 MB, about a minute on 2 cores; the full run is tens of minutes.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import result_path, write_json

REPO = Path(__file__).resolve().parents[1]
SHARES = {"web": 0.5, "code": 0.2, "books": 0.3}  # of the corpus bytes
MIX = "web=0.4,code=0.3,books=0.3"
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "ze",
    "pa",
    "qui",
    "dor",
    "fen",
    "gal",
    "hus",
    "bri",
    "cam",
    "del",
    "fro",
    "gri",
]
FOOTERS = ["© 2024 Example Media. All rights reserved.", "We use cookies to improve your experience."]


class Generator:
    """Documents with enough variety that dedup and the filters have real work: a 50,000-word Zipf vocabulary
    (exponent 1.05), ~2 % exact copies (some re-spaced) and ~2 % near copies (a few words changed)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.py = random.Random(seed)
        words = {
            "".join(self.py.choice(SYLLABLES) for _ in range(self.py.randint(1, 4))) for _ in range(80_000)
        }
        self.vocab = np.array(sorted(words)[:50_000])
        self.py.shuffle(vocab := self.vocab.tolist())
        self.vocab = np.array(vocab)
        p = 1.0 / np.arange(1, len(self.vocab) + 1) ** 1.05
        self.cdf = np.cumsum(p / p.sum())
        self.recent: dict[str, list[str]] = {d: [] for d in SHARES}

    def words(self, n: int) -> list[str]:
        return self.vocab[np.searchsorted(self.cdf, self.rng.random(n))].tolist()

    def sentences(self, n: int) -> str:
        w = self.words(n)
        for i in range(11, n, 12):
            w[i] += "."
        return " ".join(w)

    def web(self) -> str:
        paras = [self.sentences(self.py.randint(40, 140)) for _ in range(self.py.randint(2, 8))]
        footer = [self.py.choice(FOOTERS)] if self.py.random() < 0.1 else []
        return "\n\n".join([" ".join(self.words(6)).title(), *paras, *footer])

    def code(self) -> str:
        out = []
        for _ in range(self.py.randint(4, 25)):
            name, a, b, c = self.words(4)
            out.append(
                f"def {name}_{a}({a}, {b}):\n    {c} = {a} * {self.py.randint(2, 99)} + {b}\n    return {c}\n"
            )
        return "\n\n".join(out)

    def books(self) -> str:
        lines = []
        for _ in range(self.py.randint(8, 30)):
            text = self.sentences(self.py.randint(30, 90))
            lines.append(f'"{text}," said {self.words(1)[0].title()}.' if self.py.random() < 0.3 else text)
        return "\n".join(lines)

    def document(self, domain: str) -> str:
        recent, roll = self.recent[domain], self.py.random()
        if recent and roll < 0.02:  # exact duplicate, sometimes with different spacing
            doc = self.py.choice(recent)
            return doc.replace(" ", "  ", 2) if roll < 0.01 else doc
        if recent and roll < 0.04:  # near duplicate: a few words replaced
            w = self.py.choice(recent).split(" ")
            for i in self.py.sample(range(len(w)), k=min(3, len(w))):
                w[i] = self.words(1)[0]
            return " ".join(w)
        doc = getattr(self, domain)()
        recent.append(doc)
        if len(recent) > 500:
            recent.pop(self.py.randrange(len(recent)))
        return doc


def write_corpus(root: Path, total_bytes: int, seed: int = 0) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    gen, paths = Generator(seed), []
    for domain, share in SHARES.items():
        path = root / f"{domain}.jsonl"
        written, n = 0, 0
        with path.open("wb") as f:
            while written < share * total_bytes:
                n += 1
                if n % 5_000 == 0:  # a broken line now and then: counted, never fatal
                    line = b"{broken json\n" if n % 10_000 else b'{"text": "\xff\xfe"}\n'
                else:
                    record = {"text": gen.document(domain)}
                    if domain == "web":
                        record["lang"] = "en"
                    line = (json.dumps(record) + "\n").encode()
                f.write(line)
                written += len(line)
        paths.append(path)
    return paths


def _status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile of a live process, in KiB."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    keys = ("VmHWM", "VmRSS", "RssAnon", "RssFile")
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in text.splitlines()) if k in keys}


def run_prepare(files: list[Path], out: Path, vocab: int) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "toolkit.cli", "data", "prepare", "--input", *map(str, files), "--out", str(out),
        "--seq-length", "512", "--train-tokenizer", str(vocab), "--dedup", "near", "--mix", MIX,
    ]  # fmt: skip
    log = out.parent / "prepare.log"
    start = time.perf_counter()
    with log.open("wb") as sink:
        child = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        peak: dict[str, int] = {}
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)  # usage: the child's own rusage
            if pid:
                break
            for k, v in _status(child.pid).items():
                peak[k] = max(peak.get(k, 0), v)
            time.sleep(0.1)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    output = log.read_text(errors="replace").strip()
    if child.returncode != 0:
        raise SystemExit(f"dstk data prepare failed ({child.returncode}): {output[-2000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    read = manifest["stages"][0]["in"]
    return {
        "wall_s": wall,
        "documents_read": read,
        "documents_per_s": read / wall,
        "input_mb_per_s": sum(f.stat().st_size for f in files) / 1e6 / wall,
        "peak_vmhwm_mib": usage.ru_maxrss / 1024,  # Linux: KiB; the child's VmHWM at exit
        "peak_rss_anon_mib": peak.get("RssAnon", 0) / 1024,
        "peak_rss_file_mib": peak.get("RssFile", 0) / 1024,
        "dedup_index_bytes_per_document": manifest["dedup"]["index_bytes_per_document"],
        "dropped": {k: v for k, v in manifest["dropped"].items() if v},
        "bad_input": manifest["bad_input"],
        "rows": manifest["rows"],
        "realised_shares": manifest["mixture"]["realised_shares"],
        "output_mb": sum(f.stat().st_size for f in out.rglob("*.arrow")) / 1e6,
        "output": output.splitlines()[-1] if output else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20 MB and 80 MB instead of 0.25 GB and 1 GB")
    parser.add_argument(
        "--workdir", type=Path, help="where corpora and outputs go (default: a temporary dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary trained on the kept text")
    args = parser.parse_args()
    sizes = [20e6, 80e6] if args.quick else [0.25e9, 1e9]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dstk-data-bench-"))
    results = []
    try:
        for size in sizes:
            t = time.perf_counter()
            files = write_corpus(work / f"raw_{int(size / 1e6)}mb", int(size))
            generated = time.perf_counter() - t
            row = {
                "corpus_mb": size / 1e6,
                "generate_s": generated,
                **run_prepare(files, work / "out", args.vocab),
            }
            shutil.rmtree(work / "out")
            results.append(row)
            print(
                f"{row['corpus_mb']:.0f} MB: {row['documents_read']} documents in {row['wall_s']:.1f} s "
                f"({row['documents_per_s']:.0f} docs/s, {row['input_mb_per_s']:.2f} MB/s), peak RssAnon "
                f"{row['peak_rss_anon_mib']:.0f} MiB, VmHWM {row['peak_vmhwm_mib']:.0f} MiB, dedup index "
                f"{row['dedup_index_bytes_per_document']:.1f} B/doc",
                flush=True,
            )
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    small, large = results
    anon_ratio = large["peak_rss_anon_mib"] / small["peak_rss_anon_mib"]
    hwm_ratio = large["peak_vmhwm_mib"] / small["peak_vmhwm_mib"]
    check = {"anon_ratio": anon_ratio, "vmhwm_ratio": hwm_ratio, "limit": 1.5, "passed": anon_ratio <= 1.5}
    bench = "data_prepare_quick" if args.quick else "data_prepare"
    path = write_json(bench, {"results": results, "memory_check": check, "mix": MIX, "vocab": args.vocab})
    md = result_path(bench, "md")
    md.write_text(
        "# dstk data prepare: throughput and memory (subprocess, near dedup, --mix, BPE trained)\n\n"
        f"Command: `python benchmarks/data_prepare.py{' --quick' if args.quick else ''}` ({os.cpu_count()} CPUs)\n\n"
        "| corpus MB | documents | wall s | docs/s | MB/s | peak RssAnon MiB | VmHWM MiB | dedup B/doc |\n"
        "|---|---|---|---|---|---|---|---|\n"
        + "".join(
            f"| {r['corpus_mb']:.0f} | {r['documents_read']} | {r['wall_s']:.1f} | {r['documents_per_s']:.0f} | "
            f"{r['input_mb_per_s']:.2f} | {r['peak_rss_anon_mib']:.0f} | {r['peak_vmhwm_mib']:.0f} | "
            f"{r['dedup_index_bytes_per_document']:.1f} |\n"
            for r in results
        )
        + f"\nPeak RssAnon ratio {anon_ratio:.2f} (limit 1.5: {'pass' if check['passed'] else 'FAIL'}); "
        f"VmHWM ratio {hwm_ratio:.2f} (includes the memory-mapped output, see the script's docstring).\n"
    )
    print(f"wrote {path} and {md}; memory check {'passed' if check['passed'] else 'FAILED'}")
    return 0 if check["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
