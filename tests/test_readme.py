"""The README documents every verb and every flag the CLI has (the parser is the source)."""

from __future__ import annotations

import argparse

from tests.cli import REPO
from toolkit.cli import build_parser


def _verbs() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_readme_documents_every_verb_and_flag() -> None:
    readme = (REPO / "README.md").read_text()
    for verb, parser in _verbs().items():
        assert f"dstk {verb}" in readme, verb
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--no-") and f"--{flag[5:]}" in action.option_strings:
                    continue  # BooleanOptionalAction's negative form; the README documents the pattern once
                if flag.startswith("--") and flag != "--help":
                    assert flag in readme, f"dstk {verb} {flag} is not in README.md"


def test_readme_has_the_two_setup_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert (REPO / ".ci" / "run").read_text().strip().endswith("exec make test")


def test_every_verb_prints_its_help() -> None:
    """argparse %-formats help text: a literal % in a field docstring must not break `dstk VERB --help`."""
    for verb, parser in _verbs().items():
        assert parser.format_help(), verb
