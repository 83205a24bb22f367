"""Run the dstk CLI in-process (fast) or as a subprocess (end to end), returning (code, stdout, stderr)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    code: int
    out: str
    err: str


def dstk(*args: str) -> Result:
    """`dstk ARGS` in this process; argparse's SystemExit becomes the exit code."""
    from toolkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


def dstk_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, cwd: Path | None = None
) -> Result:
    """`dstk ARGS` as a real subprocess of this interpreter (what a user runs)."""
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def parser_tree(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(words after `dstk`, parser) of the CLI and every verb and subverb under it, nested subparsers included
    (`dstk data prepare`, `dstk checkpoint ls`)."""
    if parser is None:
        from toolkit.cli import build_parser

        parser = build_parser()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parser_tree(sub, (*path, name))
