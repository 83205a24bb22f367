"""The README documents every verb and every flag the CLI has (the parser is the source)."""

from __future__ import annotations

import argparse

import pytest

from tests.cli import REPO, parser_tree
from toolkit.cli import build_parser


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_readme_documents_every_verb_and_flag() -> None:
    """Every verb and subverb (`dstk data prepare`, `dstk checkpoint ls`) and each of their flags."""
    readme = (REPO / "README.md").read_text()
    for path, parser in parser_tree():
        if not path:
            continue  # dstk itself: --version
        command = "dstk " + " ".join(path)
        assert command in readme, command
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--no-") and f"--{flag[5:]}" in action.option_strings:
                    continue  # BooleanOptionalAction's negative form; the README documents the pattern once
                if flag.startswith("--") and flag != "--help":
                    assert flag in readme, f"{command} {flag} is not in README.md"


def test_readme_has_the_two_setup_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert (REPO / ".ci" / "run").read_text().strip().endswith("exec make test")


def _quick_start() -> list[str]:
    """The README's quick-start commands, continuation lines joined and comments dropped."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    lines, current = [], ""
    for raw in block.splitlines():
        text = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        current += " " + text.rstrip("\\").strip() if text else ""
        if text and not text.endswith("\\"):
            lines.append(current.strip())
            current = ""
    return lines


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path) -> None:
    """Every planning and data command of the quick start, in order, in a fresh directory (with the user's own
    files it names: an HF config.json and a cluster file). The training half (calibrate, two launches, export)
    is what `make demo` runs, so it is exercised there, not here again."""
    import json
    import shlex
    import shutil
    import subprocess
    import sys

    commands = _quick_start()
    assert len(commands) >= 12 and all(c.startswith("dstk ") for c in commands)
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 172, "vocab_size": 1000, "max_position_embeddings": 128}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(REPO / "launch" / "cluster.example.yaml", tmp_path / "my_cluster.yaml")
    ran = 0
    for command in commands:
        argv = shlex.split(command)
        if argv[1] in ("calibrate", "launch", "export"):
            continue
        if "corpus/*.jsonl" in argv:  # the shell's glob
            i = argv.index("corpus/*.jsonl")
            argv[i : i + 1] = [str(p.relative_to(tmp_path)) for p in sorted(tmp_path.glob("corpus/*.jsonl"))]
        r = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", *argv[1:]], cwd=tmp_path, capture_output=True, text=True
        )
        assert r.returncode == 0, (command, r.stderr[-2000:])
        ran += 1
    assert ran >= 9
