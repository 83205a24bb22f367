"""The bad-input catalogue of `dstk data` (and the `--tokenizer` of export and grow), issue #33: every mistake
exits 2 with one line on stderr naming the flag, before any work, writing and overwriting nothing. By class:
help, paths, silent results (an existing dataset, an output inside its input), explanations (why nothing was
usable), progress (a run that fails after reading prints its one error line, nothing before it). Beside them,
what the fixes print when the run goes on: notes, stage summaries, live bars on a terminal."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from tqdm import tqdm

from tests.cli import REPO, dstk, parser_tree
from toolkit.data.corpus import write_corpus
from toolkit.data.prepare import prepare
from toolkit.data.progress import Console

BAD = REPO / "tests" / "bad"
TINY = str(REPO / "tests" / "models" / "tiny-test-gpt2.yaml")
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"


@pytest.fixture(scope="module")
def area(tmp_path_factory) -> Path:
    """Inputs every case may name: a small corpus, a dataset prepared from it, an empty folder, a plain file,
    and files of bad input."""
    root = tmp_path_factory.mktemp("area")
    write_corpus(root / "corpus", docs_per_domain=60, seed=0)
    prepare(
        sorted((root / "corpus").glob("*.jsonl")),
        root / "dataset",
        32,
        vocab_size=300,
        validation_fraction=0.1,
    )
    (root / "emptydir").mkdir()
    (root / "other").mkdir()
    (root / "other" / "manifest.json").write_text('{"not": "a dstk dataset"}\n')
    (root / "file.json").write_text("{}\n")
    good = json.dumps({"text": WORDS})
    (root / "bad.jsonl").write_bytes(f"{good}\n{{broken\n".encode() + b'\xff\xfe bad\n{"title": "no text"}\n')
    (root / "random.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(128, 256)) * 8 + b"\n\xc3\x28\n")
    (root / "blank.jsonl").write_text("\n  \n\n")
    (root / "short.jsonl").write_text("".join(json.dumps({"text": f"two words{i}"}) + "\n" for i in range(5)))
    two = [WORDS, " ".join(reversed(WORDS.split()))]  # no shingle in common: neither is a near duplicate
    (root / "two.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in two))
    return root


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` with a digest of its content: what "nothing written or overwritten" compares."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def _prepare(*args: str) -> list[str]:
    return ["data", "prepare", *args]


# (id, class, argv, pattern the one stderr line must match); {area}: the fixture above, {out}: a path that must
# not exist afterwards
CASES: list[tuple[str, str, list[str], str]] = [
    # help
    (
        "data-no-action",
        "help",
        ["data"],
        r"dstk data: error: ACTION: give one \(generate: .*; prepare: .*--help",
    ),
    ("data-unknown-action", "help", ["data", "frobnicate"], r"invalid choice: 'frobnicate'"),
    (
        "data-abbreviated-flag",
        "help",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--train-tokenizer", "300", "--overwrit"),
        r"unrecognized arguments: --overwrit",
    ),
    # paths: --tokenizer (data prepare, export, grow), --input, --out
    (
        "prepare-tokenizer-typo",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--tokenizer", "{area}/nope"),
        r"--tokenizer: .*/nope not found; expected a local tokenizer directory$",
    ),
    (
        "prepare-tokenizer-hub-name",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--tokenizer", "gpt2"),
        r"--tokenizer: gpt2 not found; .*never looked up on the Hub",
    ),
    (
        "prepare-tokenizer-is-a-file",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--tokenizer", "{area}/file.json"),
        r"--tokenizer: .*file.json is a file; expected a directory holding tokenizer.json",
    ),
    (
        "prepare-tokenizer-empty-dir",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--tokenizer", "{area}/emptydir"),
        r"--tokenizer: .*emptydir has no tokenizer.json",
    ),
    (
        "prepare-tokenizer-is-a-dataset",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{out}", "--tokenizer", "{area}/dataset"),
        r"--tokenizer: .*dataset is a prepared dataset; did you mean .*dataset/tokenizer\?",
    ),
    (
        "export-tokenizer-typo",
        "paths",
        [
            "export",
            "--model",
            TINY,
            "--checkpoint",
            f"{BAD}/ckpt",
            "--tokenizer",
            "{area}/nope",
            "--out",
            "{out}",
        ],
        r"--tokenizer: .*/nope not found",
    ),
    (
        "export-tokenizer-is-a-dataset",
        "paths",
        [
            "export",
            "--model",
            TINY,
            "--checkpoint",
            f"{BAD}/ckpt",
            "--tokenizer",
            "{area}/dataset",
            "--out",
            "{out}",
        ],
        r"--tokenizer: .* is a prepared dataset; did you mean .*dataset/tokenizer\?",
    ),
    (
        "grow-tokenizer-typo",
        "paths",
        ["grow", "--from", f"{BAD}/ckpt", "--to", TINY, "-o", "{out}", "--tokenizer", "{area}/nope"],
        r"--tokenizer: .*/nope not found",
    ),
    (
        "prepare-input-missing",
        "paths",
        _prepare("--input", "{area}/absent.jsonl", "--out", "{out}", "--train-tokenizer", "300"),
        r"--input: .*absent.jsonl not found$",
    ),
    (
        "prepare-input-is-a-dataset",
        "paths",
        _prepare("--input", "{area}/dataset", "--out", "{out}", "--train-tokenizer", "300"),
        r"--input: .*dataset is a prepared dataset \(dstk data prepare output\), not raw text",
    ),
    (
        "prepare-out-is-a-file",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "{area}/file.json", "--train-tokenizer", "300"),
        r"--out: .*file.json is a file; expected a directory",
    ),
    (
        "prepare-out-cannot-be-created",
        "paths",
        _prepare("--input", "{area}/corpus", "--out", "/proc/dstk-forbidden/x", "--train-tokenizer", "300"),
        r"--out: cannot create /proc/dstk-forbidden/x",
    ),
    (
        "generate-out-is-a-file",
        "paths",
        ["data", "generate", "--out", "{area}/file.json", "--docs-per-domain", "5"],
        r"--out: .*file.json is a file; expected a directory",
    ),
    # silent results: replacing a dataset unasked, writing the output into its own input
    (
        "prepare-out-holds-a-dataset",
        "silent",
        _prepare("--input", "{area}/corpus", "--out", "{area}/dataset", "--train-tokenizer", "300"),
        r"--out: .*dataset already holds a prepared dataset .*; pass --overwrite to replace it",
    ),
    (
        "prepare-out-holds-another-manifest",
        "silent",
        _prepare("--input", "{area}/corpus", "--out", "{area}/other", "--train-tokenizer", "300"),
        r"--out: .*other already holds a manifest.json; pass --overwrite to replace it",
    ),
    (
        "prepare-out-inside-the-input",
        "silent",
        _prepare("--input", "{area}/corpus", "--out", "{area}/corpus/prepared", "--train-tokenizer", "300"),
        r"--out: .*corpus/prepared is inside the --input directory .*corpus, so a later run",
    ),
    (
        "prepare-out-is-the-input",
        "silent",
        _prepare("--input", "{area}/corpus", "--out", "{area}/corpus", "--train-tokenizer", "300"),
        r"--out: .*corpus is the --input directory",
    ),
    # explanations: why nothing (or too little) was usable
    (
        "mostly-malformed-lines",
        "explain",
        _prepare("--input", "{area}/bad.jsonl", "--out", "{out}", "--train-tokenizer", "300"),
        r"^dstk data: error: --input: .*bad.jsonl: 3 of 4 lines unusable: 1 malformed JSON \(line 2\), 1 not UTF-8 "
        r'\(line 3\), 1 without a string "text" \(line 4\); the 1 document left: --validation-fraction 0.02',
    ),
    (
        "undecodable-bytes",
        "explain",
        _prepare("--input", "{area}/random.jsonl", "--out", "{out}", "--train-tokenizer", "300"),
        r"--input: no usable document: .*random.jsonl: 4 of 4 lines unusable: 3 not UTF-8 \(first at line 1\), "
        r"1 malformed JSON \(line 2\); expected a JSON object",
    ),
    (
        "everything-filtered",
        "explain",
        _prepare("--input", "{area}/short.jsonl", "--out", "{out}", "--train-tokenizer", "300"),
        r"--input: no document survived filtering: 5 read, dropped 5 too_few_words \(--min-words\)$",
    ),
    (
        "blank-lines-only",
        "explain",
        _prepare("--input", "{area}/blank.jsonl", "--out", "{out}", "--train-tokenizer", "300"),
        r"--input: no document in 1 file: only blank lines",
    ),
    # progress: a run that fails after reading prints its one error line, no stage summary before it
    (
        "fails-after-reading-mix",
        "progress",
        _prepare(
            "--input", "{area}/corpus", "--out", "{out}", "--train-tokenizer", "300", "--mix", "web=1,wbe=1"
        ),
        r"--mix: .*unknown domain 'wbe'",
    ),
    (
        "fails-after-reading-validation",
        "progress",
        _prepare(
            "--input", "{area}/two.jsonl", "--out", "{out}", "--train-tokenizer", "300", "--min-words", "1"
        ),
        r"--validation-fraction: 0.02 of 2 documents leaves no validation row of 128 tokens",
    ),
    (
        "fails-after-reading-filters",
        "progress",
        _prepare(
            "--input", "{area}/corpus", "--out", "{out}", "--train-tokenizer", "300", "--min-words", "100000"
        ),
        r"--input: no document survived filtering: 180 read, dropped 180 too_few_words \(--min-words\)",
    ),
]


def test_every_class_has_three_cases() -> None:
    counts = Counter(c[1] for c in CASES)
    assert set(counts) == {"help", "paths", "silent", "explain", "progress"} and min(counts.values()) >= 3, (
        counts
    )
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("argv", "pattern"), [c[2:] for c in CASES], ids=[f"{c[1]}-{c[0]}" for c in CASES])
def test_bad_data_input(area: Path, tmp_path: Path, argv: list[str], pattern: str) -> None:
    out = tmp_path / "output"
    before = _snapshot(area)
    r = dstk(*[a.replace("{area}", str(area)).replace("{out}", str(out)) for a in argv])
    assert r.code == 2, (r.code, r.out[-500:], r.err[-2000:])
    lines = [line for line in r.err.splitlines() if line.strip() and "[WARNING]" not in line]
    assert len(lines) == 1, r.err
    assert "Traceback" not in r.err and re.search(pattern, lines[0]), lines[0]
    assert not out.exists(), f"{out} was left behind"
    assert _snapshot(area) == before, "an input or an existing dataset was written to"


# --- help ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [p for p, _ in parser_tree()], ids=lambda p: " ".join(("dstk", *p)))
def test_every_verb_and_subverb_renders_its_help(path: tuple[str, ...]) -> None:
    """`dstk ... --help` through the real CLI for the whole argparse tree, nested subparsers included: a
    literal % in a help text derived from a docstring crashed `dstk data prepare --help` (issue #33 A1)."""
    r = dstk(*path, "--help")
    assert r.code == 0 and r.out.startswith("usage: dstk") and not r.err, (r.code, r.err[-500:])


def test_every_flag_of_every_data_action_says_what_it_is() -> None:
    for path, parser in parser_tree():
        if path[:1] != ("data",) or len(path) < 2:
            continue
        for action in parser._actions:
            assert action.help, f"dstk {' '.join(path)} {action.option_strings} has no help"


def test_a_percent_in_a_field_docstring_shows_as_written() -> None:
    r = dstk("data", "prepare", "--help")
    assert r.code == 0 and "75 % similar" in " ".join(r.out.split())


# --- what the run says when it goes on ----------------------------------------------------------------------


def test_the_same_input_twice_is_read_once_with_a_note(area: Path, tmp_path: Path) -> None:
    web = str(area / "corpus" / "web.jsonl")
    r = dstk(*_prepare("--input", web, web, "--out", str(tmp_path / "o"), "--train-tokenizer", "300",
                       "--validation-fraction", "0"))  # fmt: skip
    assert r.code == 0, r.err
    assert r.err.count("was given more than once") == 1 and f"note: --input: {web} was given" in r.err
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["stages"][0]["in"] == 60 and manifest["dropped"]["exact_duplicate"] == 0


def test_a_dataset_inside_an_input_directory_is_skipped_with_a_note(area: Path, tmp_path: Path) -> None:
    """The second run on a folder that holds the first run's output must not read its manifest and shards as
    text (issue #33 D42)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "web.jsonl").write_bytes((area / "corpus" / "web.jsonl").read_bytes())
    for part in ("manifest.json", "tokenizer", "train"):
        src = area / "dataset" / part
        (raw / "prepared" / part).parent.mkdir(exist_ok=True)
        if src.is_dir():
            (raw / "prepared" / part).mkdir()
            for f in src.iterdir():
                (raw / "prepared" / part / f.name).write_bytes(f.read_bytes())
        else:
            (raw / "prepared" / part).write_bytes(src.read_bytes())
    r = dstk(*_prepare("--input", str(raw), "--out", str(tmp_path / "o"), "--train-tokenizer", "300",
                       "--validation-fraction", "0"))  # fmt: skip
    assert r.code == 0, r.err
    assert f"note: --input: skipped {raw / 'prepared'} (a prepared dataset, not raw text)" in r.err
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["input_files"] == 1 and set(manifest["mixture"]["documents_before"]) == {"web"}


def test_overwrite_replaces_a_dataset_only_once_the_new_one_is_complete(area: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    base = _prepare("--input", str(area / "corpus"), "--out", str(out), "--train-tokenizer", "300",
                    "--validation-fraction", "0.1")  # fmt: skip
    assert dstk(*base).code == 0
    first = _snapshot(out)
    failed = dstk(*base, "--overwrite", "--mix", "web=1,wbe=1")  # fails after reading
    assert failed.code == 2 and _snapshot(out) == first  # the old dataset is intact, no work folder left
    r = dstk(*base, "--overwrite", "--seed", "1")
    assert r.code == 0, r.err
    assert f"note: --overwrite: the dataset in {out} is replaced" in r.err
    after = _snapshot(out)
    assert set(after) == set(first) and after != first  # the same parts, new content
    assert json.loads((out / "manifest.json").read_text())["seed"] == 1


def test_a_vocabulary_the_text_cannot_fill_is_said_once(area: Path, tmp_path: Path) -> None:
    r = dstk(*_prepare("--input", str(area / "corpus"), "--out", str(tmp_path / "o"), "--train-tokenizer", "4096",
                       "--validation-fraction", "0.1"))  # fmt: skip
    assert r.code == 0, r.err
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    vocab = manifest["vocab_size"]
    assert vocab < 4096 and manifest["tokenizer_training"]["vocab_size_asked"] == 4096
    notes = [line for line in r.err.splitlines() if "--train-tokenizer 4096" in line]
    assert notes == [f"note: --train-tokenizer 4096: the kept text gives only {vocab:,} tokens (BPE ran out of "
                     f"pairs to merge), so the vocabulary is {vocab:,}; more text would give more"]  # fmt: skip


def test_bad_lines_are_named_in_the_output_and_the_manifest(area: Path, tmp_path: Path) -> None:
    """A run that goes on despite bad lines says which file, which kind, where the first one is (D47)."""
    bad = str(area / "bad.jsonl")
    r = dstk(*_prepare("--input", bad, str(area / "two.jsonl"), "--out", str(tmp_path / "o"),
                       "--train-tokenizer", "300", "--validation-fraction", "0"))  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.strip().endswith("3 unusable input lines or files (manifest.json bad_input_files)")
    assert (
        f"note: --input: {bad}: 3 of 4 lines unusable: 1 malformed JSON (line 2), 1 not UTF-8 (line 3), "
        f'1 without a string "text" (line 4)'
    ) in r.err.splitlines()
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["bad_input_files"] == {
        bad: {
            "malformed_json_lines": {"count": 1, "first_line": 2},
            "non_utf8_lines": {"count": 1, "first_line": 3},
            "missing_text_field": {"count": 1, "first_line": 4},
        }
    }


# --- progress ------------------------------------------------------------------------------------------------


def test_off_a_terminal_a_summary_line_per_stage_and_one_result_line(area: Path, tmp_path: Path) -> None:
    r = dstk(*_prepare("--input", str(area / "corpus"), "--out", str(tmp_path / "o"), "--train-tokenizer", "300",
                       "--validation-fraction", "0.1"))  # fmt: skip
    assert r.code == 0, r.err
    assert [line.split(":")[0] for line in r.err.splitlines()] == ["read", "tokenizer", "tokenize", "pack"]
    assert re.match(
        r"read: 180 documents from 3 files \(0\.\d MB\) in [\d.]+ s \([\d,]+ docs/s, [\d.]+ MB/s\); 180 kept",
        r.err,
    )
    assert len(r.out.splitlines()) == 1 and r.out.startswith(f"wrote {tmp_path / 'o'}: ")


def test_a_terminal_gets_a_live_bar_per_stage_with_rates_and_eta(area: Path, tmp_path: Path) -> None:
    screen = io.StringIO()
    files = sorted((area / "corpus").glob("*.jsonl"))
    prepare(files, tmp_path / "o", 32, vocab_size=300, validation_fraction=0.1,
            progress=Console(screen, live=True, refresh_s=0))  # fmt: skip
    shown = screen.getvalue().replace("\r", "\n")
    total = re.escape(tqdm.format_sizeof(sum(f.stat().st_size for f in files), divisor=1000))  # "31.2k"
    # input bytes read of the total, the time left (00:00 at the end), MB/s (or kB/s), documents and their rate
    assert re.search(
        rf"read: 100%.*\| {total}/{total} \[\d\d:\d\d<00:00, [\d.]+[kM]B/s, 180 docs, [\d,]+ docs/s\]", shown
    )
    for stage in ("tokenizer", "tokenize", "pack"):
        assert re.search(rf"{stage}: +\d+%\|.*\| [\d.]+k?/[\d.]+k? .*docs/s", shown), stage
    assert "\ntokenize: 180 documents" in shown and "\npack: " in shown  # the summaries stay
