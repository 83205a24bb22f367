"""The README documents every verb and every flag the CLI has (the parser is the source)."""

from __future__ import annotations

import argparse
import re

import pytest

from tests.cli import REPO
from toolkit.cli import build_parser


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_cli_reference_is_what_the_parsers_say() -> None:
    """docs/cli.md is generated from the parsers (one source): `make docs` after changing a flag."""
    from toolkit.cli import reference

    assert (REPO / "docs" / "cli.md").read_text() == reference() + "\n", "docs/cli.md is stale: run make docs"


def test_the_readme_is_a_front_page_listing_every_verb() -> None:
    """Every verb in the README's table with the summary its parser shows; the page stays a front page; every
    page it links to exists; docs/guide.md explains every verb."""
    from toolkit.commands import VERBS

    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 15_000
    for verb, (_, summary) in VERBS.items():
        assert f"| `dstk {verb}` | {summary} |" in readme, verb
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        assert (REPO / link).exists(), link
    guide = (REPO / "docs" / "guide.md").read_text()
    assert all(f"`dstk {verb}" in guide for verb in VERBS)


def test_readme_has_the_two_setup_commands() -> None:
    """The README gives both; CI calls `make test` and nothing else, and the suite runs what `make demo` runs
    twice in a row (tests/test_demo.py): a rerun must replace what the first run wrote, through the flags that
    say so, not fail on it."""
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    ci = (REPO / ".ci" / "run").read_text()
    commands = [x.strip() for x in ci.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    assert commands[-1] == "exec make test" and not any("make" in x for x in commands[:-1]), commands
    assert "test_make_demo_runs_twice_in_a_row" in (REPO / "tests" / "test_demo.py").read_text()


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
    """Every planning and data command of the quick start, in order, exactly as written, in a copy of the files
    it names that ship with dstk (an HF model folder, a cluster file). The training half (calibrate, launch,
    export) is what `make demo` runs, so it is exercised there (tests/test_demo.py), not here again."""
    import shlex
    import shutil
    import subprocess
    import sys

    commands = _quick_start()
    assert commands[0] == "source .venv/bin/activate"
    commands = commands[1:]
    assert len(commands) >= 11 and all(c.startswith("dstk ") for c in commands)
    for shipped in ("docs/examples", "launch/cluster.example.yaml"):
        (tmp_path / shipped).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (REPO / shipped).is_dir() else shutil.copy
        copy(REPO / shipped, tmp_path / shipped)
    ran = 0
    for command in commands:
        argv = shlex.split(command)
        if argv[1] in ("calibrate", "launch", "export"):
            continue
        r = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", *argv[1:]], cwd=tmp_path, capture_output=True, text=True
        )
        assert r.returncode == 0, (command, r.stderr[-2000:])
        ran += 1
    assert ran >= 9
