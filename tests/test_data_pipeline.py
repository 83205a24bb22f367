"""dstk data prepare, stage by stage: cleaning, quality filters, exact and near dedup, mixture shares, packing
that keeps every token, determinism, bad-input accounting and the CLI's one-line errors. Corpora are built
here; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.cli import dstk
from toolkit.data.clean import Cleaner, load_boilerplate
from toolkit.data.corpus import write_corpus
from toolkit.data.dedup import DedupOptions, HashSet
from toolkit.data.mix import mixture_weights, parse_mix, select, temperature_weights, token_budgets
from toolkit.data.options import PrepareOptions
from toolkit.data.prepare import filter_documents, pack, pack_chunks, prepare, split_order
from toolkit.data.quality import duplicate_ngram_fraction, symbol_ratio, words_of
from toolkit.data.tokenizer import load_tokenizer
from toolkit.errors import UserError

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "qui", "dor", "fen", "gal", "hus"]


def prose(rng: random.Random, words: int) -> str:
    """Sentences of random pseudo-words from a ~3,000-word vocabulary: no repeated 5-grams in practice."""
    out = []
    for i in range(words):
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        out.append(word + ("." if i % 12 == 11 else ""))
    return " ".join(out)


def write_jsonl(path: Path, docs: list[dict | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((json.dumps(d) if isinstance(d, dict) else d) + "\n" for d in docs))
    return path


def rows_of(split: Path) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, n_tokens) of a saved split, in the Arrow types they are stored with."""
    import datasets

    table = datasets.load_from_disk(str(split)).with_format("arrow")[:]
    ids = table["input_ids"].combine_chunks()
    return ids.flatten().to_numpy().reshape(len(ids), -1), table["n_tokens"].to_numpy()


def arrow_digest(out: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(out.glob("*/*")):
        if f.parent.name in ("train", "validation"):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


# --- cleaning -------------------------------------------------------------------------------------------


def test_cleaning_normalises_strips_controls_collapses_spaces_and_keeps_indentation() -> None:
    text, removed = Cleaner()(
        "ｆｕｌｌ\u00a0width\x00\x07 text\r\n\tdef f():\n        return  1   \n\n\n\nend"
    )
    assert text == "full width text\n\tdef f():\n        return 1\n\nend" and removed == 0


def test_boilerplate_lines_are_removed_and_rules_come_from_a_file(tmp_path) -> None:
    text, removed = Cleaner()(
        "Real content here.\nCookie Policy | Privacy Policy\n© 2024 ACME. All rights reserved."
    )
    assert (text, removed) == ("Real content here.", 2)
    rules = tmp_path / "rules.txt"
    rules.write_text("# one regex per line\n\n^sponsored\n")
    assert Cleaner(load_boilerplate(rules))("Sponsored: buy now\nAll rights reserved.") == (
        "All rights reserved.",
        1,
    )
    with pytest.raises(UserError, match=r"--boilerplate: '\(' is not a valid regex"):
        Cleaner(("(",))


# --- quality filters ------------------------------------------------------------------------------------


def test_quality_measures_have_their_documented_values() -> None:
    assert duplicate_ngram_fraction(words_of("a b c d e a b c d e"), 5) == 1.0
    assert duplicate_ngram_fraction(words_of("a b c d e a b c d e xx"), 5) == pytest.approx(10 / 12)
    assert duplicate_ngram_fraction(words_of("a b c d e f g h"), 5) == 0.0
    assert symbol_ratio("ab;;") == 1.0 and symbol_ratio("a_b") == 0.5 and symbol_ratio("x + y") == 0.5
    assert symbol_ratio("ÄÖ ü!") == pytest.approx(1 / 3)


def test_each_quality_filter_drops_its_document_and_nothing_else(tmp_path) -> None:
    rng = random.Random(0)
    controls = [{"text": prose(rng, rng.randint(20, 120)), "lang": "en"} for _ in range(20)]
    controls += [
        {"text": "def add(x, y):\n    return x + y\n\n\nprint(add(3, 4))\n"},  # untagged: kept and counted
        {"text": "Short but enough words here.", "lang": "EN"},
        {"text": "the cat sat on the mat " * 3},  # repeated, but under --repetition-min-words
        {"text": prose(rng, 60) + "\nWe use cookies to improve this site."},  # loses one line only
    ]
    crafted = {
        "too_few_words": {"text": "hello there", "lang": "en"},
        "too_many_words": {"text": prose(rng, 100_001), "lang": "en"},
        "symbol_ratio": {"text": "x = {1: [2, 3]}; y = (4, 5) ### $$$ %%% ^^^ *** |||", "lang": "en"},
        "repetition": {"text": "the cat sat on the mat " * 12, "lang": "en"},
        "language": {"text": prose(rng, 40), "language": "de"},
        "empty_after_cleaning": {"text": "Copyright 2024. All rights reserved.\n\x00\x01"},
    }
    path = write_jsonl(tmp_path / "mixed.jsonl", controls + list(crafted.values()))
    options = PrepareOptions(languages=("en",))
    kept, _ = filter_documents([path], options, tmp_path / "spill.jsonl")
    assert {k: v for k, v in kept.dropped.items() if v} == dict.fromkeys(crafted, 1)
    assert len(kept.domain_ids) == len(controls) and kept.untagged == 3 and kept.boilerplate_lines == 2
    survivors = [json.loads(line) for line in (tmp_path / "spill.jsonl").read_text().splitlines()]
    assert survivors[-1].endswith(".") and "cookies" not in survivors[-1]


def test_defaults_keep_every_document_of_the_demo_corpus(tmp_path) -> None:
    files = write_corpus(tmp_path / "raw", docs_per_domain=2000, seed=0)
    kept, _ = filter_documents(files, PrepareOptions(), tmp_path / "spill.jsonl")
    duplicates = kept.dropped["exact_duplicate"] + kept.dropped["near_duplicate"]
    others = {k: v for k, v in kept.dropped.items() if v and not k.endswith("_duplicate")}
    # templated text: a handful of documents are near copies by chance (3 of 6000 at seed 0), nothing else goes
    assert kept.read == 6000 and others == {} and duplicates <= 6
    assert len(kept.domain_ids) == 6000 - duplicates
    assert list(kept.domains) == ["web", "code", "books"]


# --- deduplication --------------------------------------------------------------------------------------


def test_hash_set_matches_a_python_set_across_merges() -> None:
    rng = np.random.default_rng(0)
    index, reference = HashSet(), set()
    for _ in range(40):
        keys = rng.integers(0, 5000, rng.integers(1, 400)).astype(np.uint64)
        expected = []
        for k in keys.tolist():
            expected.append(k in reference)
            reference.add(k)
        assert index.seen_and_add(keys).tolist() == expected
    assert len(index) == len(reference) and index.nbytes == 8 * len(reference)


def test_exact_and_near_duplicates_are_removed_and_counted(tmp_path) -> None:
    rng = random.Random(1)
    originals = [prose(rng, 300) for _ in range(200)]
    exact = [" " + o.replace(" ", "  ", 3) + "\n" for o in originals[:30]]  # equal once cleaned
    near = []
    for o in originals[30:70]:  # one word of 300 changed: Jaccard of 5-gram shingles ~0.97
        words = o.split()
        words[150] = "changedword"
        near.append(" ".join(words))
    docs = originals + exact + near
    rng.shuffle(docs)
    path = write_jsonl(tmp_path / "web.jsonl", [{"text": d} for d in docs])
    out = tmp_path / "out"
    manifest = prepare(
        [path], out, 64, vocab_size=400, options=PrepareOptions(dedup=DedupOptions(dedup="near"))
    )
    assert manifest["dropped"]["exact_duplicate"] == 30 and manifest["dropped"]["near_duplicate"] == 40
    assert sum(manifest["documents"].values()) == 200
    stages = {s["stage"]: (s["in"], s["kept"]) for s in manifest["stages"]}
    assert stages["exact_dedup"] == (270, 240) and stages["near_dedup"] == (240, 200)
    report = manifest["dedup"]
    assert report["documents_checked"] == 270 and report["bands"] * report["rows_per_band"] <= 128
    # on disk, in datatrove's signature files: 12 bytes (key, index) per key, the exact key and one per band
    assert report["index_bytes_per_document"] == 12 * (report["bands"] + 1)
    exact_only = prepare(
        [path], tmp_path / "o2", 64, vocab_size=400, options=PrepareOptions(dedup={"dedup": "exact"})
    )
    assert exact_only["dropped"]["exact_duplicate"] == 30 and exact_only["dropped"]["near_duplicate"] == 0


# --- mixture --------------------------------------------------------------------------------------------


def test_parse_mix_normalises_and_names_the_flag() -> None:
    assert parse_mix("web=3, code=1") == {"web": 0.75, "code": 0.25}
    for bad, match in [
        ("web", "not DOMAIN=WEIGHT"),
        ("web=0", "positive"),
        ("web=x", "positive"),
        ("a=1,a=2", "twice"),
    ]:
        with pytest.raises(UserError, match=f"--mix: .*{match}"):
            parse_mix(bad)


def test_temperature_flattens_towards_small_domains() -> None:
    assert temperature_weights({"a": 100, "b": 1}, 1) == pytest.approx({"a": 100 / 101, "b": 1 / 101})
    assert temperature_weights({"a": 100, "b": 1}, 2) == pytest.approx({"a": 10 / 11, "b": 1 / 11})


def test_budgets_downsample_only_the_over_represented_domains() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 50, 3000)
    domain_ids = np.repeat([0, 1, 2], 1000)
    tokens = {d: int(lengths[domain_ids == k].sum()) for k, d in enumerate("abc")}
    weights = {"a": 0.2, "b": 0.3, "c": 0.5}
    keep = select(domain_ids, lengths, list("abc"), token_budgets(tokens, weights), seed=0)
    got = {d: lengths[keep & (domain_ids == k)].sum() for k, d in enumerate("abc")}
    total = sum(got.values())
    assert all(abs(got[d] / total - w) < 0.005 for d, w in weights.items())
    assert min(got[d] / tokens[d] for d in "abc") < 1 and max(got[d] / tokens[d] for d in "abc") == 1
    only_a = mixture_weights(tokens, {"a": 1.0}, temperature=1)  # a domain left out of --mix is left out
    keep = select(domain_ids, lengths, list("abc"), token_budgets(tokens, only_a), seed=0)
    assert keep[domain_ids == 0].all() and not keep[domain_ids != 0].any()


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> list[Path]:
    return write_corpus(tmp_path_factory.mktemp("demo"), docs_per_domain=1500, seed=3)


def test_realised_token_shares_are_within_two_points_of_the_mix(demo_files, tmp_path) -> None:
    weights = {"web": 0.5, "code": 0.2, "books": 0.3}
    spec = ",".join(f"{d}={w}" for d, w in weights.items())
    manifest = prepare(demo_files, tmp_path, 64, vocab_size=400, options=PrepareOptions(mix=parse_mix(spec)))
    mixture = manifest["mixture"]
    for domain, weight in weights.items():
        assert abs(mixture["realised_shares"][domain] - weight) <= 0.02
        assert mixture["tokens_after"][domain] <= mixture["tokens_before"][domain]
    assert (
        sum(mixture["tokens_after"].values())
        == manifest["tokens"]["train"] + manifest["tokens"]["validation"]
    )
    after, before = mixture["documents_after"], mixture["documents_before"]
    assert manifest["dropped"]["mixing"] > 0 and any(after[d] < before[d] for d in after)
    assert any(after[d] == before[d] for d in after)  # one domain limits: all of it is used
    packed = sum(int(rows_of(tmp_path / s)[1].sum()) for s in ("train", "validation"))
    assert packed == sum(mixture["tokens_after"].values())  # what the manifest counts is what was written


def test_temperature_sampling_follows_its_weights(demo_files, tmp_path) -> None:
    manifest = prepare(demo_files, tmp_path, 64, vocab_size=400, options=PrepareOptions(temperature=3))
    mixture = manifest["mixture"]
    before = mixture["tokens_before"]
    expected = temperature_weights(before, 3)
    assert mixture["weights"] == pytest.approx(expected)
    assert all(abs(mixture["realised_shares"][d] - w) <= 0.02 for d, w in expected.items())


# --- packing and determinism ----------------------------------------------------------------------------


def test_pack_chunks_agree_with_pack_across_chunk_boundaries() -> None:
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 100, rng.integers(0, 40)).tolist() for _ in range(200)]
    expected = list(pack(iter(docs), 7, eos=0, pad=1))
    rows, n_tokens = zip(*pack_chunks(docs, 7, eos=0, pad=1, rows_per_chunk=3), strict=True)
    assert np.concatenate(rows).tolist() == [r["input_ids"] for r in expected]
    assert np.concatenate(n_tokens).tolist() == [r["n_tokens"] for r in expected]


def test_packing_round_trips_every_token_in_the_seeded_order(tmp_path) -> None:
    rng = random.Random(2)
    texts = [prose(rng, rng.randint(5, 200)) for _ in range(300)]
    path = write_jsonl(tmp_path / "one.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "out"
    manifest = prepare([path], out, 32, vocab_size=350, validation_fraction=0.0, seed=7)
    tok = load_tokenizer(out / "tokenizer")
    eos, pad = manifest["eos_token_id"], manifest["pad_token_id"]
    order = split_order(np.arange(len(texts)), 7, "train")
    expected = [t for i in order for t in [*tok(texts[i], add_special_tokens=False)["input_ids"], eos]]
    ids, n_tokens = rows_of(out / "train")
    assert ids.dtype == np.int32 and ids.shape[1] == 32 and (n_tokens[:-1] == 32).all()
    assert np.concatenate([row[:n] for row, n in zip(ids, n_tokens, strict=True)]).tolist() == expected
    assert (ids[-1, n_tokens[-1] :] == pad).all()
    assert manifest["rows"] == {"train": len(ids), "validation": 0}
    again = prepare(
        [path], tmp_path / "again", 32, tokenizer=out / "tokenizer", validation_fraction=0.0, seed=7
    )
    assert again["tokenizer_training"] is None and again["vocab_size"] == manifest["vocab_size"]
    assert np.array_equal(rows_of(tmp_path / "again" / "train")[0], ids)


def test_same_seed_gives_identical_files_and_another_seed_another_order(demo_files, tmp_path) -> None:
    runs = {}
    for name, seed in [("a", 0), ("b", 0), ("c", 1)]:
        manifest = prepare(demo_files, tmp_path / name, 64, vocab_size=400, seed=seed)
        runs[name] = (arrow_digest(tmp_path / name), manifest)
    assert runs["a"][0] == runs["b"][0] and runs["a"][1] == runs["b"][1]
    assert runs["a"][0] != runs["c"][0]
    assert runs["a"][1]["tokens"] == runs["c"][1]["tokens"]  # the same documents, in another order
    assert runs["c"][1]["dropped"]["mixing"] == 0  # temperature 1: natural shares, nothing cut
    first_a, first_c = rows_of(tmp_path / "a" / "train")[0][0], rows_of(tmp_path / "c" / "train")[0][0]
    assert not np.array_equal(first_a, first_c)


def test_large_splits_are_written_as_several_shards(demo_files, tmp_path) -> None:
    prepare(demo_files, tmp_path, 64, vocab_size=400, options=PrepareOptions(max_shard_mb=0.2))
    assert len(list((tmp_path / "train").glob("data-*.arrow"))) > 1


# --- input accounting, domains, CLI ---------------------------------------------------------------------


def test_bad_inputs_are_counted_and_domains_come_from_fields_or_file_stems(tmp_path) -> None:
    rng = random.Random(4)
    raw = tmp_path / "raw"
    write_jsonl(
        raw / "web.jsonl",
        [{"text": prose(rng, 30)} for _ in range(5)] + [{"text": prose(rng, 30), "domain": "news"}],
    )
    (raw / "broken.jsonl").write_bytes(
        b'{"text": "\xff\xfe bad bytes"}\n{not json\n[1, 2]\n{"title": "no text"}\n{"text": 5}\n\n'
        + json.dumps({"text": prose(rng, 30)}).encode()
        + b"\n"
    )
    (raw / "empty.jsonl").write_bytes(b"")
    (raw / "notes.txt").write_text(prose(rng, 20) + "\n\n" + prose(rng, 20) + "\n")
    manifest = prepare([raw], tmp_path / "out", 32, vocab_size=300, validation_fraction=0)
    assert manifest["bad_input"] == {
        "empty_files": 1,
        "malformed_json_lines": 2,
        "missing_text_field": 2,
        "non_utf8_lines": 1,
        "unreadable_files": 0,
    }
    assert manifest["mixture"]["documents_before"] == {"web": 5, "news": 1, "broken": 1, "notes": 2}
    required = {"seq_length", "vocab_size", "eos_token_id", "pad_token_id", "tokenizer_hash", "seed", "rows"}
    assert required | {"documents", "bad_input", "stages", "dropped", "dedup", "mixture"} <= set(manifest)


def test_a_wrong_mix_exits_2_with_one_line(demo_files, tmp_path) -> None:
    base = [
        "data",
        "prepare",
        "--input",
        *map(str, demo_files),
        "--out",
        str(tmp_path / "out"),
        "--train-tokenizer",
        "300",
    ]
    for spec, message in [("web=0.5,wbe=0.5", "unknown domain 'wbe'"), ("web=0.5,code", "not DOMAIN=WEIGHT")]:
        result = dstk(*base, "--mix", spec)
        assert result.code == 2 and result.err.count("\n") == 1
        assert "--mix" in result.err and message in result.err
        assert not (tmp_path / "out").exists()  # no half-written output


def test_cli_flags_reach_the_pipeline(tmp_path) -> None:
    rng = random.Random(5)
    docs = [{"text": prose(rng, 40), "lang": "en"} for _ in range(50)]
    docs += [docs[0], {"text": prose(rng, 40), "lang": "fr"}, {"text": "Sponsored: " + prose(rng, 3)}]
    path = write_jsonl(tmp_path / "web.jsonl", docs)
    rules = tmp_path / "rules.txt"
    rules.write_text("^sponsored\n")
    result = dstk(
        "data", "prepare", "--input", str(path), "--out", str(tmp_path / "out"), "--train-tokenizer", "300",
        "--dedup", "exact", "--languages", "en", "--boilerplate", str(rules), "--min-words", "10",
        "--max-shard-mb", "1", "--tokenizer-sample-mb", "0.001", "--validation-fraction", "0",
    )  # fmt: skip
    assert result.code == 0, result.err
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert {k: v for k, v in manifest["dropped"].items() if v} == {
        "exact_duplicate": 1,
        "language": 1,
        "empty_after_cleaning": 1,
    }
    assert (
        manifest["options"]["quality"]["min_words"] == 10 and manifest["options"]["dedup"]["dedup"] == "exact"
    )
    assert "50 of 53 documents kept" in result.out
    sample = manifest["tokenizer_training"]  # ~1 kB of the ~13 kB kept: every 13th or so document
    assert sample["every_kth_document"] > 5 and sample["documents"] == -(-50 // sample["every_kth_document"])


# --- defaults on a real corpus ---------------------------------------------------------------------------


def _stdlib_docstrings(min_words: int = 120) -> list[str]:
    """Real prose written by people and present on every machine (no download): the long docstrings of
    CPython's standard library (PSF licence), one document each."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    docs: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if {"test", "tests", "site-packages", "idlelib"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    docs.add(doc)
    return sorted(docs)


def _near_copy(doc: str, rng: random.Random) -> str:
    """What a scraper meets: the same text with a word changed, one dropped, and different line breaks."""
    words = doc.split()
    words[rng.randrange(len(words))] = rng.choice(["the", "a", "this", "that"])
    del words[rng.randrange(len(words))]
    return " ".join(words)


def test_default_prepare_removes_planted_duplicates_of_a_real_corpus_and_keeps_the_rest(tmp_path) -> None:
    docs = _stdlib_docstrings()
    assert len(docs) >= 200
    rng = random.Random(0)
    planted = [d for d in rng.sample(docs, 100)] + [_near_copy(d, rng) for d in rng.sample(docs, 100)]
    unique, dirty = tmp_path / "unique.jsonl", tmp_path / "dirty.jsonl"
    unique.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    mixed = docs + planted
    rng.shuffle(mixed)
    dirty.write_text("".join(json.dumps({"text": d}) + "\n" for d in mixed))

    def kept(path: Path) -> tuple[int, int]:
        out = tmp_path / path.stem
        prepare([path], out, seq_length=64, vocab_size=512, seed=0)  # the defaults: what `data prepare` does
        m = json.loads((out / "manifest.json").read_text())
        return sum(m["documents"].values()), m["dropped"]["exact_duplicate"] + m["dropped"]["near_duplicate"]

    kept_unique, removed_unique = kept(unique)
    kept_dirty, _ = kept(dirty)
    assert (
        removed_unique <= len(docs) // 50
    )  # CPython docstrings that are near copies of each other (5 of 351)
    # a planted copy survives only if it adds a document to what the clean corpus keeps (copies of documents
    # the quality filter drops go with them); and no unique document is lost for a copy's sake
    survivors = kept_dirty - kept_unique
    assert 0 <= survivors <= 0.05 * len(planted), survivors
