"""`dstk data prepare` across worker processes, side by side with datatrove's own pipeline, in one run (#35).

On each generated corpus (default 50 MB and 200 MB; 16 JSONL files with a `domain` and an `id` field per
record; exact and one-word-edited copies of earlier documents planted anywhere in the corpus, so most copies
sit in another file and another task than their original):

- **dstk, same stages as datatrove** (`--tokenizer` given, `--format megatron`, no `--mix`): read, clean,
  quality, exact + near dedup (MinHash 14 × 9), tokenize, Megatron .bin/.idx; 1 and 2 workers, 8 tasks.
- **datatrove 0.10.1's own steps** on the same files with the same tokenizer, 1 and 2 workers, 8 tasks:
  `JsonlReader` → `GopherRepetitionFilter` (5-gram share 0.15, dstk's threshold) → `GopherQualityFilter`
  (5 to 100,000 words, dstk's limits) → `JsonlWriter` + `MinhashDedupSignature` (its default 14 × 8, 64-bit)
  → `MinhashDedupBuckets` (14 tasks) → `MinhashDedupCluster` → `JsonlReader` + `MinhashDedupFilter` →
  `MegatronDocumentTokenizer`. Its word tokenizer for English is spaCy (not a dstk dependency); here it is
  `str.split` (`SplitWords`), datatrove's cheapest choice: the research for #35 measured the spaCy default
  at 15× the CPU of this stage 1. datatrove has no step that does dstk's cleaning (NFKC, boilerplate lines,
  whitespace) and no exact-dedup pass in this chain: it does less work than dstk here.
- **dstk, the whole pipeline** (BPE trained on the kept text, `--mix`, Arrow and Megatron out): 1 and 2
  workers, its default tasks.

Measured for every run: wall time, CPU time of the whole process tree (a cgroup-v1 cpuacct group around the
run, so exited workers count; /proc sampling when no cgroup can be made), documents/s, MB/s, MB per
CPU-second (the per-core throughput), the CPU the rest of the machine used meanwhile, and the peak resident
memory (VmHWM, and RssAnon) of the driver and of each worker process, sampled every 0.1 s. Dedup quality on
the planted copies is measured on the smallest corpus with 2 workers: a pair counts as caught when its copy
and its original are not both in the output; a unique document is lost when the quality filter keeps it and
the output lacks it. dstk's output documents are matched by their token ids (the expected cleaned text of
every input document tokenized with the run's tokenizer); datatrove's removed documents are its exclusion
writer's ids.

Usage: python benchmarks/data_scale.py [--quick] [--sizes-mb 50 200] [--workdir DIR]
Run it with nothing else heavy on the machine (the results record the load average and others' CPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import command_line, result_path, write_json
from benchmarks.data_prepare import MIX, SHARES, Generator

REPO = Path(__file__).resolve().parents[1]
FILES = 16
TASKS = 8
EXACT_SHARE, EDIT_SHARE = 0.02, 0.02
"""Planted copies, as shares of the documents written."""
HZ = os.sysconf("SC_CLK_TCK")


# --- corpus -------------------------------------------------------------------------------------------------


def write_corpus(root: Path, total_bytes: int, seed: int = 0) -> dict[str, Any]:
    """`FILES` JSONL files of about equal size, documents of the three domains interleaved, each record
    {"id", "text", "domain"}; about 2 % exact and 2 % one-word-edited copies of earlier documents, drawn from
    the whole corpus so far. Returns the labels: {"exact": [[copy, original]...], "edited": [...]}."""
    root.mkdir(parents=True, exist_ok=True)
    gen, rng = Generator(seed), random.Random(seed + 1)
    domains, weights = list(SHARES), list(SHARES.values())
    originals: list[tuple[int, str, str]] = []
    labels: dict[str, list[list[int]]] = {"exact": [], "edited": []}
    per_file, n, written = total_bytes / FILES, 0, 0
    for i in range(FILES):
        with (root / f"part-{i:03d}.jsonl").open("wb") as f:
            while written < per_file * (i + 1):
                roll = rng.random()
                if originals and roll < EXACT_SHARE + EDIT_SHARE:
                    origin, text, domain = originals[rng.randrange(len(originals))]
                    if roll < EXACT_SHARE:
                        labels["exact"].append([n, origin])
                    else:  # one word changed (a letter pair put in front of it)
                        words = text.split(" ")
                        at = rng.randrange(len(words))
                        words[at] = "zq" + words[at]
                        text = " ".join(words)
                        labels["edited"].append([n, origin])
                else:
                    domain = rng.choices(domains, weights)[0]
                    text = getattr(gen, domain)()
                    originals.append((n, text, domain))
                line = (json.dumps({"id": str(n), "text": text, "domain": domain}) + "\n").encode()
                f.write(line)
                written += len(line)
                n += 1
    (root.parent / f"{root.name}.labels.json").write_text(json.dumps(labels))
    return labels


# --- measuring a process tree -------------------------------------------------------------------------------


def _machine_busy_s() -> float:
    """CPU seconds this machine has been busy (all cores, /proc/stat: everything but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / HZ


def _procs() -> dict[int, tuple[int, float]]:
    """pid → (parent pid, CPU seconds) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2 :].split()
            out[int(entry)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / HZ)
    return out


def _memory(pid: int) -> tuple[int, int]:
    """(VmHWM, RssAnon) of a live process, in bytes (0, 0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    values = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return tuple(int(values.get(k, "0 kB").split()[0]) * 1024 for k in ("VmHWM", "RssAnon"))  # type: ignore[return-value]


class CpuGroup:
    """A cgroup-v1 cpuacct group whose usage counts every process started in it, exited ones included (None
    where no group can be made: then the CPU is the sum of the sampled processes)."""

    def __init__(self) -> None:
        self.path: Path | None = Path(
            f"/sys/fs/cgroup/cpuacct/dstk-bench-{os.getpid()}-{time.monotonic_ns()}"
        )
        try:
            self.path.mkdir()
        except OSError:
            self.path = None

    def enter(self) -> None:
        """In the child before exec."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> float | None:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9 if self.path else None

    def close(self) -> None:
        for _ in range(50):  # processes of the run that are still exiting keep the group busy a moment
            if self.path is None:
                return
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def run_measured(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `cmd`, sampling its process tree every 0.1 s. Depth 0 is the driver, depth 1 its helpers
    (datatrove's forkserver and manager), depth 2 and more the workers."""
    group = CpuGroup()
    busy0, start = _machine_busy_s(), time.perf_counter()
    with log.open("wb") as sink:
        child = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                 preexec_fn=group.enter)  # fmt: skip
        seen: dict[int, dict[str, float]] = {}
        while child.poll() is None:
            procs, depth = _procs(), {child.pid: 0}
            changed = True
            while changed:
                changed = False
                for pid, (ppid, _) in procs.items():
                    if pid not in depth and ppid in depth:
                        depth[pid], changed = depth[ppid] + 1, True
            for pid, d in depth.items():
                hwm, anon = _memory(pid)
                row = seen.setdefault(pid, {"depth": d, "cpu_s": 0.0, "hwm": 0, "anon": 0})
                row["cpu_s"] = procs[pid][1] if pid in procs else row["cpu_s"]
                row["hwm"], row["anon"] = max(row["hwm"], hwm), max(row["anon"], anon)
            time.sleep(0.1)
    wall = time.perf_counter() - start
    busy = _machine_busy_s() - busy0
    cpu = group.seconds()
    group.close()
    sampled = sum(r["cpu_s"] for r in seen.values())
    cpu = cpu if cpu is not None else sampled
    output = log.read_text(errors="replace")
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({child.returncode}): {output[-3000:]}")
    workers = [r for r in seen.values() if r["depth"] >= 2]
    driver = next(r for r in seen.values() if r["depth"] == 0)
    mib = 2**20
    return {
        "wall_s": wall, "cpu_s": cpu, "cpu_measured_by": "cgroup cpuacct" if group.path else "sampling",
        "others_cpu_s": max(0.0, busy - cpu),
        "driver_peak_mib": driver["hwm"] / mib, "driver_peak_anon_mib": driver["anon"] / mib,
        "worker_processes": len(workers),
        "worker_peak_mib": max((r["hwm"] for r in workers), default=0) / mib,
        "worker_peak_anon_mib": max((r["anon"] for r in workers), default=0) / mib,
        "output": output,
    }  # fmt: skip


# --- datatrove's own pipeline ---------------------------------------------------------------------------------

try:
    from datatrove.utils.word_tokenizers import WordTokenizer
except ImportError:  # the dstk pipeline is measured without it
    WordTokenizer = object  # type: ignore[assignment,misc]


class SplitWords(WordTokenizer):  # type: ignore[misc,valid-type]
    """Words by `str.split`: the cheapest word tokenizer datatrove can be given (its English default, spaCy,
    costs about 15× the CPU in MinHash stage 1; #35's research)."""

    def __init__(self) -> None:
        super().__init__("en")

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()

    def sent_tokenize(self, text: str) -> list[str]:
        return [s for s in text.split("\n") if s]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        spans, at = [], 0
        for line in text.split("\n"):
            spans.append((at, at + len(line)))
            at += len(line) + 1
        return spans


def xxh64_text(text: str) -> int:
    """datatrove 0.10.1's 64-bit shingle hash; it passes `str`, which xxhash 4 refuses (TypeError)."""
    import xxhash

    return xxhash.xxh64_intdigest(text.encode())


def datatrove_pipeline(corpus: str, work: str, tokenizer: str, workers: int, tasks: int) -> None:
    """Stages 1-4 of datatrove's MinHash dedup around its reader, Gopher filters and Megatron tokenizer, each
    stage a LocalPipelineExecutor; writes `stages.json` (wall seconds per stage) and `counts.json` into `work`."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens.megatron_tokenizer import MegatronDocumentTokenizer
    from datatrove.pipeline.writers import JsonlWriter

    words, root, config = SplitWords(), Path(work), MinhashConfig()
    repetition = GopherRepetitionFilter(dup_line_frac=None, dup_para_frac=None, dup_line_char_frac=None,
                                        dup_para_char_frac=None, top_n_grams=(), dup_n_grams=((5, 0.15),),
                                        language=words)  # fmt: skip
    quality = GopherQualityFilter(min_doc_words=5, max_doc_words=100_000, min_avg_word_length=None,
                                  max_avg_word_length=None, max_symbol_word_ratio=None, max_bullet_lines_ratio=None,
                                  max_ellipsis_lines_ratio=None, max_non_alpha_words_ratio=None, min_stop_words=None,
                                  language=words)  # fmt: skip
    signatures = MinhashDedupSignature(output_folder=str(root / "sigs"), config=config, language=words)
    signatures._hash_func = xxh64_text
    stages = {
        "s1_read_filter_signatures": ([
            JsonlReader(corpus, glob_pattern="*.jsonl"), repetition, quality,
            JsonlWriter(str(root / "filtered"), output_filename="${rank}.jsonl", compression=None),
            signatures,
        ], tasks, workers),
        "s2_buckets": ([MinhashDedupBuckets(str(root / "sigs"), str(root / "buckets"), config=config)],
                       config.num_buckets, workers),
        "s3_cluster": ([MinhashDedupCluster(str(root / "buckets"), str(root / "remove"), config=config)], 1, 1),
        "s4_filter_tokenize": ([
            JsonlReader(str(root / "filtered"), glob_pattern="*.jsonl"),
            MinhashDedupFilter(str(root / "remove"),
                               exclusion_writer=JsonlWriter(str(root / "removed"), compression=None)),
            MegatronDocumentTokenizer(str(root / "megatron"), tokenizer_name_or_path=tokenizer,
                                      eos_token="<|endoftext|>", batch_size=1000),
        ], tasks, workers),
    }  # fmt: skip
    seconds = {}
    for name, (pipeline, n, w) in stages.items():
        t = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=n, workers=w, logging_dir=str(root / "logs" / name)).run()
        seconds[name] = time.perf_counter() - t
        if name.startswith("s1"):
            seconds["signature_bytes"] = sum(p.stat().st_size for p in (root / "sigs").rglob("*.sig"))
    (root / "stages.json").write_text(json.dumps(seconds))


def run_datatrove(corpus: Path, work: Path, tokenizer: Path, workers: int) -> dict[str, Any]:
    call = (f"from benchmarks.data_scale import datatrove_pipeline; datatrove_pipeline({str(corpus)!r}, "
            f"{str(work)!r}, {str(tokenizer)!r}, {workers}, {TASKS})")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    work.mkdir(parents=True)
    row = run_measured([sys.executable, "-c", call], work.parent / f"{work.name}.log", env)
    stages = json.loads((work / "stages.json").read_text())
    signed = sum(1 for p in (work / "filtered").glob("*.jsonl") for _ in p.open("rb"))
    removed = [json.loads(line)["id"] for p in (work / "removed").rglob("*.jsonl") for line in p.open()]
    idx = sorted((work / "megatron").glob("*.idx"))
    return row | {
        "stages_s": {k: v for k, v in stages.items() if k != "signature_bytes"},
        "documents_after_filters": signed,
        "dedup_bytes_per_document": stages["signature_bytes"] / max(signed, 1),
        "removed_ids": removed,
        "output_documents": sum(int(np.frombuffer(p.read_bytes()[18:26], "<u8")[0]) for p in idx),
    }


# --- dstk ---------------------------------------------------------------------------------------------------

STAGE_LINE = re.compile(r"^(read|tokenizer|tokenize|pack): .* in ([0-9.]+) s", re.M)


def run_dstk(
    corpus: Path, out: Path, workers: int, *, tokenizer: Path | None, tasks: int | None
) -> dict[str, Any]:
    how = ["--tokenizer", str(tokenizer), "--format", "megatron"] if tokenizer else [
        "--train-tokenizer", "8192", "--mix", MIX, "--format", "both"]  # fmt: skip
    cmd = [sys.executable, "-m", "toolkit.cli", "data", "prepare", "--input", str(corpus), "--out", str(out),
           "--seq-length", "512", "--domain-field", "domain", "--workers", str(workers),
           *(["--tasks", str(tasks)] if tasks else []), *how]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    row = run_measured(cmd, out.parent / f"{out.name}.log", env)
    manifest = json.loads((out / "manifest.json").read_text())
    text = row["output"].replace("\r", "\n")
    return row | {
        "stages_s": {m.group(1): float(m.group(2)) for m in STAGE_LINE.finditer(text)},
        "documents_read": manifest["stages"][0]["in"],
        "dedup_bytes_per_document": manifest["dedup"]["index_bytes_per_document"],
        "dropped": {k: v for k, v in manifest["dropped"].items() if v},
        "output_documents": sum(manifest["documents"].values()),
        "tasks": manifest.get("options", {}).get("tasks") or tasks,
    }


# --- dedup quality on the planted copies --------------------------------------------------------------------


def _key(ids: Any) -> bytes:
    return hashlib.blake2b(np.asarray(ids, np.int64).tobytes(), digest_size=12).digest()


def megatron_keys(folder: Path) -> dict[bytes, int]:
    """How often each document's tokens occur in the Megatron files of `folder`."""
    from collections import Counter

    counts: Counter[bytes] = Counter()
    for idx in folder.glob("*.idx"):
        raw = idx.read_bytes()
        n = int(np.frombuffer(raw[18:26], "<u8")[0])
        sizes, pointers = np.frombuffer(raw, np.int32, n, 34), np.frombuffer(raw, np.int64, n, 34 + 4 * n)
        dtype = {4: np.int32, 8: np.uint16}[raw[17]]
        data = idx.with_suffix(".bin").read_bytes()
        for size, at in zip(sizes, pointers, strict=True):
            counts[_key(np.frombuffer(data, dtype, int(size), int(at)))] += 1
    return counts


def expected_keys(corpus: Path, tokenizer: Path) -> dict[int, bytes | None]:
    """Input id → the tokens dstk writes for it (its cleaned text, then end-of-text), None when dstk's clean
    and quality filter drop it."""
    from tokenizers import Tokenizer

    from toolkit.data.filter import DocumentFilter
    from toolkit.data.formats import Record
    from toolkit.data.options import PrepareOptions

    keep, tok = DocumentFilter(PrepareOptions()), Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    ids, texts, out = [], [], {}
    for path in sorted(corpus.glob("*.jsonl")):
        for line in path.open():
            record = json.loads(line)
            kept = keep(Record(record["text"], record["domain"], None))
            if kept is None:
                out[int(record["id"])] = None
            else:
                ids.append(int(record["id"]))
                texts.append(kept[0])
    for at in range(0, len(texts), 2048):
        encoded = tok.encode_batch_fast(texts[at : at + 2048], add_special_tokens=False)
        for i, e in zip(ids[at : at + 2048], encoded, strict=True):
            out[i] = _key([*e.ids, eod])
    return out


def score(labels: dict[str, list[list[int]]], n_docs: int, both: Any, present: Any) -> dict[str, Any]:
    """`both(copy, origin, kind)`: whether the output holds both (None: the quality filter dropped one of
    them, not counted); `present(id)`: whether a document is in the output (None: dropped by quality)."""
    rows: dict[str, Any] = {}
    for kind, pairs in labels.items():
        verdicts = [both(copy, origin, kind) for copy, origin in pairs]
        counted = [v for v in verdicts if v is not None]
        caught = sum(not v for v in counted)
        rows[kind] = {"pairs": len(counted), "caught": caught, "share": caught / max(len(counted), 1)}
    planted = {i for pairs in labels.values() for pair in pairs for i in pair}
    uniques = [i for i in range(n_docs) if i not in planted and present(i) is not None]
    lost = sum(1 for i in uniques if not present(i))
    rows["unique"] = {"documents": len(uniques), "lost": lost, "share_lost": lost / max(len(uniques), 1)}
    return rows


def dstk_quality(corpus: Path, labels: dict[str, Any], out: Path, tokenizer: Path) -> dict[str, Any]:
    """From the Megatron files: an exact pair is both kept when its tokens occur twice."""
    expected, found = expected_keys(corpus, tokenizer), megatron_keys(out / "megatron")

    def count(i: int) -> int | None:
        return None if expected[i] is None else found.get(expected[i], 0)  # type: ignore[arg-type]

    def both(copy: int, origin: int, kind: str) -> bool | None:
        a, b = count(copy), count(origin)
        if a is None or b is None:
            return None
        return a >= 2 if kind == "exact" else bool(a and b)

    return score(labels, len(expected), both, lambda i: None if count(i) is None else bool(count(i)))


def datatrove_quality(labels: dict[str, Any], n_docs: int, work: Path, removed: list[str]) -> dict[str, Any]:
    """From datatrove's files: the ids its filters kept (`filtered/`) and the ids MinHash removed."""
    kept = {int(json.loads(line)["id"]) for p in (work / "filtered").glob("*.jsonl") for line in p.open()}
    gone = {int(i) for i in removed}

    def present(i: int) -> bool | None:
        return None if i not in kept else i not in gone

    def both(copy: int, origin: int, kind: str) -> bool | None:
        a, b = present(copy), present(origin)
        return None if a is None or b is None else a and b

    return score(labels, n_docs, both, present)


# --- the run ------------------------------------------------------------------------------------------------

RUNS = ("dstk", "datatrove", "dstk_full")
TITLES = {
    "dstk": "dstk, same stages (given tokenizer, Megatron out)",
    "datatrove": "datatrove 0.10.1 stock steps (str.split words)",
    "dstk_full": "dstk, whole pipeline (BPE trained, --mix, Arrow + Megatron)",
}


def keep(row: dict[str, Any], name: str, run: dict[str, Any]) -> None:
    """The faster of `run` and the one kept so far, with every wall time seen."""
    walls = [*row["runs"].get(name, {}).get("walls_s", []), run["wall_s"]]
    if name not in row["runs"] or run["wall_s"] < row["runs"][name]["wall_s"]:
        row["runs"][name] = run
    row["runs"][name]["walls_s"] = walls


def measure_size(
    work: Path, mb: float, tokenizer: Path | None, quality: bool, repeat: int
) -> tuple[dict[str, Any], Path]:
    corpus = work / f"corpus_{mb:g}mb"
    labels = write_corpus(corpus, int(mb * 1e6))
    size = sum(p.stat().st_size for p in corpus.glob("*.jsonl"))
    docs = sum(1 for p in corpus.glob("*.jsonl") for _ in p.open("rb"))
    row: dict[str, Any] = {"corpus_mb": size / 1e6, "documents": docs, "files": FILES,
                           "planted": {k: len(v) for k, v in labels.items()}, "runs": {}}  # fmt: skip
    for _ in range(repeat):  # 1 and 2 workers interleaved; each kept at its fastest (others' load only slows)
        for w in (1, 2):
            out = work / f"dstk_full_{mb:g}_w{w}"
            keep(row, f"dstk_full_w{w}", run_dstk(corpus, out, w, tokenizer=None, tasks=None))
            if tokenizer is None:
                tokenizer = work / "tokenizer"
                shutil.copytree(out / "tokenizer", tokenizer)
            shutil.rmtree(out)
        for w in (1, 2):
            out = work / f"dstk_{mb:g}_w{w}"
            shutil.rmtree(out, ignore_errors=True)
            keep(row, f"dstk_w{w}", run_dstk(corpus, out, w, tokenizer=tokenizer, tasks=TASKS))
            dt = work / f"datatrove_{mb:g}_w{w}"
            shutil.rmtree(dt, ignore_errors=True)
            keep(row, f"datatrove_w{w}", run_datatrove(corpus, dt, tokenizer / "tokenizer.json", w))
    same = [
        {p.name: p.read_bytes() for p in (work / f"dstk_{mb:g}_w{w}" / "megatron").iterdir()} for w in (1, 2)
    ]
    row["dstk_megatron_identical_w1_w2"] = same[0] == same[1]
    if quality:
        row["quality"] = {
            "dstk": dstk_quality(corpus, labels, work / f"dstk_{mb:g}_w2", tokenizer),
            "datatrove": datatrove_quality(labels, docs, work / f"datatrove_{mb:g}_w2",
                                           row["runs"]["datatrove_w2"]["removed_ids"]),
        }  # fmt: skip
    for name in list(row["runs"]):
        row["runs"][name].pop("removed_ids", None)
        row["runs"][name]["output_tail"] = row["runs"][name].pop("output")[-1500:]
        run = row["runs"][name]
        run |= {"documents_per_s": docs / run["wall_s"], "mb_per_s": size / 1e6 / run["wall_s"],
                "mb_per_cpu_s": size / 1e6 / run["cpu_s"]}  # fmt: skip
    for w in (1, 2):
        shutil.rmtree(work / f"dstk_{mb:g}_w{w}")
        shutil.rmtree(work / f"datatrove_{mb:g}_w{w}")
    shutil.rmtree(corpus)
    return row, tokenizer


def markdown(data: dict[str, Any]) -> str:
    rows = data["sizes"]
    lines = [
        "# dstk data prepare across workers, beside datatrove's own pipeline (#35)",
        "",
        f"Command: `{data['command_line']}`, {data['cpus']} CPUs. Load average before: {data['load_before']}; "
        f"after: {data['load_after']}. `others CPU s` is what the rest of the machine used during each run "
        "(/proc/stat busy time less the run's own). Every run reads the same files; the CPU column is the "
        f"run's whole process tree ({rows[0]['runs']['dstk_w1']['cpu_measured_by']}). What each run does: "
        "the script's docstring.",
        "",
    ]
    for row in rows:
        lines += [
            f"## {row['corpus_mb']:.1f} MB, {row['documents']:,} documents, {row['files']} files "
            f"({row['planted']['exact']:,} exact and {row['planted']['edited']:,} one-word-edited copies planted)",
            "",
            "| run | workers | wall s | CPU s | docs/s | MB/s | MB per CPU-s | others CPU s | driver peak MiB "
            "| worker peak MiB (RssAnon) | dedup bytes/doc | documents out |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for kind in RUNS:
            for w in (1, 2):
                r = row["runs"][f"{kind}_w{w}"]
                worker = (f"{r['worker_peak_mib']:.0f} ({r['worker_peak_anon_mib']:.0f})" if r["worker_processes"]
                          else "in the driver")  # fmt: skip
                lines.append(
                    f"| {TITLES[kind]} | {w} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['documents_per_s']:,.0f} | "
                    f"{r['mb_per_s']:.2f} | {r['mb_per_cpu_s']:.2f} | {r['others_cpu_s']:.1f} | "
                    f"{r['driver_peak_mib']:.0f} ({r['driver_peak_anon_mib']:.0f}) | {worker} | "
                    f"{r['dedup_bytes_per_document']:.1f} | {r['output_documents']:,} |"
                )
        lines += [
            "",
            "Speed-up from 1 to 2 workers (wall): "
            + ", ".join(
                f"{TITLES[k].split(',')[0].split(' (')[0]} {'(whole pipeline) ' if k == 'dstk_full' else ''}"
                f"{row['runs'][f'{k}_w1']['wall_s'] / row['runs'][f'{k}_w2']['wall_s']:.2f}×"
                for k in RUNS
            )
            + ".",
        ]
        ratio = [row["runs"][f"dstk_w{w}"]["mb_per_cpu_s"] / row["runs"][f"datatrove_w{w}"]["mb_per_cpu_s"]
                 for w in (1, 2)]  # fmt: skip
        lines += ["", f"Per core (MB per CPU-second), dstk ÷ datatrove on the same stages: {ratio[0]:.2f} with 1 "
                      f"worker, {ratio[1]:.2f} with 2."]  # fmt: skip
        walls = "; ".join(
            f"{k}: {', '.join(f'{x:.1f}' for x in r['walls_s'])}" for k, r in row["runs"].items()
        )
        lines += ["", f"Wall seconds of every repeat: {walls}."]
        lines += [
            "",
            "Stage seconds: "
            + "; ".join(
                f"{k}_w{w}: "
                + ", ".join(f"{s} {v:.1f}" for s, v in row["runs"][f"{k}_w{w}"]["stages_s"].items())
                for k in RUNS
                for w in (1, 2)
            )
            + ".",
        ]
        lines += ["", f"dstk's Megatron files with 1 and 2 workers byte-identical: "
                      f"{row['dstk_megatron_identical_w1_w2']}.", ""]  # fmt: skip
        if "quality" in row:
            lines += [
                "Dedup quality on the planted copies (2 workers, 8 tasks; copies anywhere in the corpus):",
                "",
                "| pipeline | exact copies removed | one-word-edited copies removed | unique documents lost |",
                "|---|---|---|---|",
            ]
            for name, q in row["quality"].items():
                lines.append(
                    f"| {name} | {q['exact']['caught']}/{q['exact']['pairs']} ({100 * q['exact']['share']:.1f} %) | "
                    f"{q['edited']['caught']}/{q['edited']['pairs']} ({100 * q['edited']['share']:.1f} %) | "
                    f"{q['unique']['lost']}/{q['unique']['documents']} ({100 * q['unique']['share_lost']:.2f} %) |"
                )
            lines.append("")
    if len(rows) > 1:
        first, last = rows[0]["runs"], rows[-1]["runs"]
        lines += ["## Memory as the corpus grows", "",
                  f"{rows[0]['corpus_mb']:.0f} MB → {rows[-1]['corpus_mb']:.0f} MB, peak VmHWM of the largest worker "
                  "(2 workers): " + ", ".join(
                      f"{k} {first[f'{k}_w2']['worker_peak_mib']:.0f} → {last[f'{k}_w2']['worker_peak_mib']:.0f} MiB"
                      for k in RUNS) + "; of the driver: " + ", ".join(
                      f"{k} {first[f'{k}_w2']['driver_peak_mib']:.0f} → {last[f'{k}_w2']['driver_peak_mib']:.0f} MiB"
                      for k in RUNS) + ".", ""]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 MB and 40 MB")
    parser.add_argument("--sizes-mb", type=float, nargs="+", help="corpus sizes (default 50 200)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each case, the fastest kept (default 1)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="where corpora and outputs go (default: a temporary dir)"
    )
    args = parser.parse_args()
    sizes = args.sizes_mb or ([10, 40] if args.quick else [50, 200])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="dstk-data-scale-"))
    data: dict[str, Any] = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "sizes": []}
    tokenizer = None
    try:
        for i, mb in enumerate(sizes):
            row, tokenizer = measure_size(work, mb, tokenizer, quality=i == 0, repeat=args.repeat)
            data["sizes"].append(row)
            runs = row["runs"]
            print(
                f"{row['corpus_mb']:.0f} MB: "
                + "; ".join(
                    f"{k} {r['wall_s']:.1f} s {r['mb_per_cpu_s']:.2f} MB/CPU-s" for k, r in runs.items()
                ),
                flush=True,
            )
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    data["load_after"] = os.getloadavg()
    data["command_line"] = command_line()
    bench = "data_scale_quick" if args.quick else "data_scale"
    path = write_json(bench, data)
    md = result_path(bench, "md")
    md.write_text(markdown(data))
    print(f"wrote {path} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
