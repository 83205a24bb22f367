"""The data path for dstk train: packing keeps every token, the loader is deterministic, sharded and resumable."""

from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit.data.corpus import write_corpus
from toolkit.data.loader import PackedData, TrainLoader, eval_batches
from toolkit.data.prepare import iter_documents, pack, prepare


def test_pack_round_trips_every_token() -> None:
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10], [11]]
    rows = list(pack(iter(docs), seq_length=4, eos=0, pad=99))
    flat = [t for r in rows for t in r["input_ids"][: r["n_tokens"]]]
    assert flat == [1, 2, 3, 0, 4, 5, 0, 6, 7, 8, 9, 10, 0, 11, 0]
    assert all(len(r["input_ids"]) == 4 for r in rows) and rows[-1]["input_ids"][-1] == 99


def test_bad_lines_are_counted_not_fatal(tmp_path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"text": "good one"}\n{broken\n\xff\xfe\n{"other": 1}\n\n{"text": "good two"}\n')
    stats: dict[str, int] = {}
    assert list(iter_documents([path], stats)) == ["good one", "good two"]
    assert stats == {"malformed_json_lines": 1, "non_utf8_lines": 1, "missing_text_field": 1}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("d")
    files = write_corpus(root / "raw", docs_per_domain=300, seed=1)
    manifest = prepare(files, root / "out", 32, vocab_size=300)
    return root / "out", manifest


def test_prepare_manifest_and_splits(packed) -> None:
    out, manifest = packed
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["rows"]["train"] > 100 and manifest["rows"]["validation"] > 0
    duplicates = manifest["dropped"]["exact_duplicate"] + manifest["dropped"]["near_duplicate"]
    assert manifest["documents"]["train"] + manifest["documents"]["validation"] == 900 - duplicates
    assert duplicates < 900 * 0.05  # the generated corpus is varied enough for the default deduplication
    assert manifest["vocab_size"] <= 300 and (out / "tokenizer" / "tokenizer.json").is_file()


def test_loader_is_deterministic_sharded_and_resumable(packed) -> None:
    out, _ = packed
    data = PackedData(out / "train", seed=3)

    def take(dp_rank, dp_size, micro, position=0, steps=3):
        it = TrainLoader(data, 8, micro, dp_rank, dp_size, position=position).steps()
        got = [[b.input_ids.numpy() for b in next(it)] for _ in range(steps)]
        it.close()
        return got

    one_rank = take(0, 1, 4)
    two_ranks = [take(r, 2, 2) for r in range(2)]
    for step in range(3):  # the same global batch, however many ranks share it
        whole = np.concatenate(one_rank[step])
        split = np.concatenate([np.concatenate(two_ranks[r][step]) for r in range(2)])
        assert np.array_equal(whole, split)
    assert np.array_equal(np.concatenate(take(0, 1, 4, position=8, steps=1)[0]), np.concatenate(one_rank[1]))
    again = take(0, 1, 4)
    assert all(
        np.array_equal(np.concatenate(a), np.concatenate(b)) for a, b in zip(again, one_rank, strict=True)
    )


def test_eval_batches_are_equal_in_number_on_every_rank(packed) -> None:
    out, _ = packed
    data = PackedData(out / "validation", seed=0)
    for max_rows in (1, 7, 13, data.rows + 5):
        counts = {len(list(eval_batches(data, 2, r, 3, max_rows))) for r in range(3)}
        assert len(counts) == 1 and counts.pop() >= 1
