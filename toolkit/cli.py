"""`dstk`: the command line. Each verb lives in its own module under `toolkit.commands` with its own parser.

Exit status: 0 ok, 2 bad input (one line on stderr, never a traceback), 1 internal error. Verb modules import
torch/deepspeed only inside their `run`, so `dstk estimate` and `dstk plan` start in milliseconds.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from toolkit import __version__
from toolkit.commands import VERBS, OneLineParser
from toolkit.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dstk", description="DeepSpeed integration toolkit: plan, generate, run, benchmark."
    )
    parser.add_argument("--version", action="version", version=f"dstk {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=OneLineParser)
    for name, (module, summary) in VERBS.items():
        verb = sub.add_parser(name, help=summary, description=summary)
        importlib.import_module(f"toolkit.commands.{module}").add_arguments(verb)
        verb.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not getattr(args, "_module", None):
        build_parser().print_help()
        return 2
    try:
        return int(importlib.import_module(f"toolkit.commands.{args._module}").run(args) or 0)
    except UserError as exc:
        print(f"dstk {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dstk ... | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave: a bug, keep its traceback
            raise
        # an output directory that cannot be created, a file that cannot be written: the user's path, one line
        print(f"dstk {args.verb}: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dstk {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
