"""Parsers built from a recorded flag list (tests/data/megatron_*_flags.txt), so a test can parse the arguments
dstk emits for Megatron-DeepSpeed or Megatron-LM the way that project's own argparse would, without installing
it. Each file was copied from the project's parser; its header says from which commit and how.

Line format: `FLAG KIND [CHOICES]`, KIND one of store_true, store_false, int, float, str, or int+, float+,
str+ (nargs='+'); CHOICES comma-separated. Both projects build their parser with allow_abbrev=False, and so does
this one: a prefix of a flag is an error, as it is there.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

DATA = Path(__file__).resolve().parent / "data"
MEGATRON_DEEPSPEED = DATA / "megatron_deepspeed_flags.txt"
MEGATRON_LM = DATA / "megatron_lm_flags.txt"

_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


class ParseError(Exception):
    """What argparse would have printed before exiting 2."""


class _StrictParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ParseError(message)


def verified_parser(flags_file: Path) -> tuple[argparse.ArgumentParser, set[str]]:
    """A parser with exactly the flags of `flags_file`, their arity and choices; and the set of those flags."""
    parser = _StrictParser(allow_abbrev=False)
    flags = set()
    for line in flags_file.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        flag, kind, *choices = line.split()
        flags.add(flag)
        if kind in ("store_true", "store_false"):
            parser.add_argument(flag, action=kind)
            continue
        base = kind.removesuffix("+")
        extra: dict[str, Any] = {"nargs": "+"} if kind.endswith("+") else {}
        if choices:
            extra["choices"] = [_TYPES[base](c) for c in choices[0].split(",")]
        parser.add_argument(flag, type=_TYPES[base], **extra)
    return parser, flags


def parse_verified(argv: list[str], flags_file: Path) -> argparse.Namespace:
    """`argv` parsed by the verified parser; every flag in it must be a recorded one (AssertionError naming the
    others: a flag the project's parser does not declare would end the real run at start-up)."""
    parser, verified = verified_parser(flags_file)
    emitted = {a for a in argv if a.startswith("--")}
    assert emitted <= verified, f"unverified flags: {sorted(emitted - verified)}"
    return parser.parse_args(argv)
