"""`dstk data prepare` at corpus scale (#35): the same bytes out whatever the number of tasks, workers or
nodes; global dedup across shards; the input formats people have; Megatron's indexed dataset read back by a
reader written here from the format; a run killed with SIGKILL finished by its rerun, byte for byte. (The
two-node SLURM run is in test_multinode.py, beside the test bed it needs.)"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli import REPO, dstk
from tests.test_data_pipeline import prose, rows_of
from toolkit.data.formats import PieceReport, read_piece
from toolkit.data.options import DedupOptions, ExecutionOptions, PrepareOptions
from toolkit.data.prepare import prepare
from toolkit.data.shards import plan
from toolkit.data.signatures import Signer


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_minhash_is_datasketchs_for_every_set_size() -> None:
    """The batched numpy MinHash gives datasketch's values (`MinHash.bulk`, seed 1, affine32), empty sets and
    sets larger than one numpy pass included, so the dedup decisions are those of datasketch."""
    from datasketch import MinHash

    rng = np.random.default_rng(0)
    sizes = [0, 1, 5, 400, 5000, 0, 3, 9000, 17]
    sets = [np.unique(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)) for n in sizes]
    signer = Signer(DedupOptions())
    expected = np.stack(
        [m.hashvalues for m in MinHash.bulk((s.tolist() for s in sets), num_perm=128, seed=1, hashfunc=int)]
    )
    assert np.array_equal(signer.minhash(sets), expected)
    assert (signer.bands, signer.rows) == (14, 9) and signer.band_keys(sets).shape == (len(sets), 14)


# --- inputs -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> Path:
    """One folder of every input kind: JSONL plain, .gz and .zst (with a `source` field for --domain-field and
    `body` for --text-field), text, Parquet of several row groups, an HF datasets folder, an empty file, and a
    gzip stream cut off half-way."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    root = tmp_path_factory.mktemp("formats")
    rng = random.Random(7)

    def records(n: int, source: str) -> list[dict[str, str]]:
        return [{"body": prose(rng, 40), "source": source} for _ in range(n)]

    def jsonl(rows: list[dict[str, str]]) -> bytes:
        return "".join(json.dumps(r) + "\n" for r in rows).encode()

    (root / "plain.jsonl").write_bytes(jsonl(records(20, "news")) + b'{"body": "\xff\xfe"}\n{"title": 1}\n')
    (root / "packed.jsonl.gz").write_bytes(gzip.compress(jsonl(records(15, "forum"))))
    (root / "packed.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl(records(15, "forum"))))
    (root / "notes.txt").write_text("".join(prose(rng, 30) + "\n" for _ in range(10)))
    table = pa.table({"body": [prose(rng, 40) for _ in range(24)] + [None], "source": ["wiki"] * 25})
    pq.write_table(table, root / "wiki.parquet", row_group_size=5)
    datasets.Dataset.from_dict({"body": [prose(rng, 40) for _ in range(12)]}).save_to_disk(root / "hfset")
    (root / "empty.jsonl").write_bytes(b"")
    whole = gzip.compress(jsonl(records(40, "cut")))
    (root / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    return root


def test_cut_anywhere_the_shards_give_every_record_once_in_input_order(formats: Path) -> None:
    from toolkit.data.read import expand_inputs

    files = expand_inputs([formats])
    assert [f.name for f in files][-1] == "wiki.parquet" and any(f.suffix == ".arrow" for f in files)

    def texts(shards: list) -> list[str]:
        return [
            r.text
            for shard in shards
            for p in shard
            for r in read_piece(p, ("body", "source"), PieceReport())
        ]

    whole = texts(plan(files, 1))
    assert len(whole) > 100
    for tasks in (2, 5, 13, 40):
        assert texts(plan(files, tasks)) == whole, tasks


def test_every_input_format_is_read_and_bad_records_are_named(formats: Path, tmp_path: Path) -> None:
    r = dstk("data", "prepare", "--input", str(formats / "*"), "--out", str(tmp_path / "o"),
             "--train-tokenizer", "300", "--text-field", "body", "--domain-field", "source",
             "--validation-fraction", "0")  # fmt: skip
    assert r.code == 0, r.err
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    kept = manifest["mixture"]["documents_before"]
    assert kept["news"] == 20 and kept["forum"] == 30 and kept["wiki"] == 24 and kept["hfset"] == 12
    assert kept["notes"] == 10 and 0 < kept["cut"] < 40  # the records before the break are kept
    bad = manifest["bad_input_files"]
    assert bad[str(formats / "plain.jsonl")] == {
        "non_utf8_lines": {"count": 1, "first_line": 21},
        "missing_text_field": {"count": 1, "first_line": 22},
    }
    assert bad[str(formats / "wiki.parquet")] == {"missing_text_field": {"count": 1, "first_line": 25}}
    assert bad[str(formats / "empty.jsonl")] == {"empty_files": {"count": 1, "first_line": 0}}
    assert "reason" in bad[str(formats / "cut.jsonl.gz")]["unreadable_files"]
    assert f"note: --input: {formats / 'cut.jsonl.gz'}: unreadable after line" in r.err
    assert manifest["bad_input"]["unreadable_files"] == 1 and "Traceback" not in r.err


# --- the same bytes from any number of shards and workers; dedup across them -----------------------------


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, dict[str, list[int]]]:
    """300 unique documents, then exact and one-word-edited copies of 60 of them in the second half of the
    file: every copy is read by another shard than its original once the file is cut in five."""
    rng = random.Random(3)
    unique = [prose(rng, rng.randint(80, 200)) for _ in range(300)]
    copies, kinds = [], {"exact": [], "edited": []}
    for i in rng.sample(range(150), 60):
        if len(copies) % 2:
            words = unique[i].split()
            words[len(words) // 2] = "changedword"
            copies.append(" ".join(words))
            kinds["edited"].append(i)
        else:
            copies.append(unique[i])
            kinds["exact"].append(i)
    root = tmp_path_factory.mktemp("planted")
    (root / "web.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in unique + copies))
    return root / "web.jsonl", kinds


def test_output_is_the_same_for_any_shards_and_workers_and_copies_across_shards_go(planted, tmp_path) -> None:
    path, kinds = planted
    runs = {}
    for name, execution in (
        ("one", ExecutionOptions(workers=1, tasks=1)),
        ("many", ExecutionOptions(workers=2, tasks=5)),
    ):
        runs[name] = prepare([path], tmp_path / name, 64, vocab_size=400, execution=execution,
                             options=PrepareOptions(format="both"))  # fmt: skip
    assert tree(tmp_path / "one") == tree(tmp_path / "many")
    dropped = runs["many"]["dropped"]
    assert dropped["exact_duplicate"] == len(kinds["exact"]) and dropped["near_duplicate"] == len(
        kinds["edited"]
    )
    assert sum(runs["many"]["documents"].values()) == 300  # every unique document kept, no copy


# --- Megatron's indexed dataset -------------------------------------------------------------------------


def read_indexed(prefix: Path) -> list[np.ndarray]:
    """Megatron's MMapIndexedDataset, from its layout: magic, version, dtype code, N, len(doc_idx), then
    sizes (int32 × N), pointers (int64 × N) and doc_idx (int64); the .bin is the sequences back to back."""
    raw = prefix.with_suffix(".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, n, docs = struct.unpack("<QBQQ", raw[9:34])
    dtype = {4: np.int32, 8: np.uint16}[code]
    sizes = np.frombuffer(raw, np.int32, n, 34)
    pointers = np.frombuffer(raw, np.int64, n, 34 + 4 * n)
    doc_idx = np.frombuffer(raw, np.int64, docs, 34 + 12 * n)
    assert version == 1 and len(raw) == 34 + 12 * n + 8 * docs and np.array_equal(doc_idx, np.arange(n + 1))
    data = prefix.with_suffix(".bin").read_bytes()
    assert len(data) == int(sizes.sum()) * np.dtype(dtype).itemsize
    return [np.frombuffer(data, dtype, int(s), int(p)) for s, p in zip(sizes, pointers, strict=True)]


def test_megatron_files_hold_the_arrow_rows_tokens_document_by_document(tmp_path) -> None:
    from toolkit.data.corpus import write_corpus
    from toolkit.data.megatron import MegatronWriter

    files = write_corpus(tmp_path / "raw", docs_per_domain=100, seed=2)
    manifest = prepare(files, tmp_path / "o", 32, vocab_size=300, options=PrepareOptions(format="both"))
    eos = manifest["eos_token_id"]
    assert manifest["megatron"]["dtype"] == "uint16"
    for split in ("train", "validation"):
        docs = read_indexed(tmp_path / "o" / "megatron" / f"{split}_text_document")
        assert all(d[-1] == eos and (d[:-1] != eos).all() for d in docs)  # one document each, EOD last
        ids, n_tokens = rows_of(tmp_path / "o" / split)
        packed = np.concatenate([row[:n] for row, n in zip(ids, n_tokens, strict=True)])
        assert np.array_equal(np.concatenate(docs).astype(np.int64), packed)
        assert manifest["megatron"]["documents"][split] == manifest["documents"][split] == len(docs)
    big = MegatronWriter(tmp_path / "big" / "doc", vocab_size=128_256, eod=128_001)  # Llama-3 sized: int32
    big.add(np.array([70_000, 5], np.int32))
    big.add(np.array([], np.int32))
    assert big.close() == 2
    assert [d.tolist() for d in read_indexed(tmp_path / "big" / "doc")] == [[70_000, 5, 128_001], [128_001]]


# --- resume -------------------------------------------------------------------------------------------------


def test_a_run_killed_with_sigkill_is_finished_by_its_rerun_byte_for_byte(tmp_path) -> None:
    """SIGKILL the CLI as soon as one of its four read tasks is done; the same command again says what it
    skips and ends with the files an uninterrupted run writes."""
    sys.path.insert(0, str(REPO))
    from benchmarks.data_prepare import write_corpus

    files = write_corpus(tmp_path / "raw", 4_000_000, seed=1)
    args = ["data", "prepare", "--input", *map(str, files), "--train-tokenizer", "500", "--workers", "2",
            "--tasks", "4", "--seq-length", "64"]  # fmt: skip
    cmd = [sys.executable, "-m", "toolkit.cli", *args, "--out", str(tmp_path / "killed")]
    child = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    done = tmp_path / "killed" / ".dstk-work"
    deadline = time.time() + 120
    while not list(done.glob("filter-*/logs/completions/0000*")):
        assert child.poll() is None and time.time() < deadline, child.communicate()
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with contextlib.suppress(ProcessLookupError):  # what was left of its process group (workers, manager)
        os.killpg(child.pid, signal.SIGKILL)
    finished = len(list(done.glob("filter-*/logs/completions/0000*")))
    assert not (tmp_path / "killed" / "manifest.json").exists()
    rerun = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    if finished < 4:
        assert f"note: resuming: {finished} of 4 filter tasks were done by an earlier run" in rerun.stderr
    whole = subprocess.run([*cmd[:-1], str(tmp_path / "whole")], cwd=REPO, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert tree(tmp_path / "killed") == tree(tmp_path / "whole")
