"""`dstk`: the command line. Each verb lives in its own module under `toolkit.commands` with its own parser.

Exit status: 0 ok, 2 bad input (one line on stderr, never a traceback), 1 internal error. Verb modules import
torch/deepspeed only inside their `run`, so `dstk estimate` and `dstk plan` start in milliseconds.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from toolkit import __version__
from toolkit.commands import VERBS, OneLineParser
from toolkit.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dstk", description="DeepSpeed integration toolkit: plan, generate, run, benchmark."
    )
    parser.add_argument("-V", "--version", action="version", version=f"dstk {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=OneLineParser)
    for name, (module, summary) in VERBS.items():
        verb = sub.add_parser(name, help=summary, description=summary)
        importlib.import_module(f"toolkit.commands.{module}").add_arguments(verb)
        verb.set_defaults(_module=module)
    return parser


def reference() -> str:
    """docs/cli.md: every verb's and subverb's help, as the parsers render it (the one source of the CLI's
    documentation; tests/test_readme.py regenerates it and compares). Rendered at 100 columns whatever the
    terminal, so the file does not depend on who generated it."""
    import os

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = build_parser()
        out = [
            "# dstk command-line reference",
            "",
            "Generated from the parsers by `make docs` (`python -m toolkit.cli --reference > docs/cli.md`); do not edit.",
            "Every verb takes `--help`; `dstk help VERB` is the same. Exit status: 0 ok, 2 bad input (one line on",
            "stderr), 1 internal error.",
            "",
        ]
        for path, sub in _pages(parser, ["dstk"]):
            out += [f"## `{' '.join(path)}`", "", "```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _pages(
    parser: argparse.ArgumentParser, path: list[str]
) -> list[tuple[list[str], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _pages(sub, [*path, name])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    from toolkit.run.chatter import quiet

    quiet()  # library notices that tell a user nothing, silenced before any library is imported
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--reference"]:  # docs/cli.md (make docs)
        print(reference())
        return 0
    if argv[:1] == ["help"]:  # `dstk help VERB` is `dstk VERB --help`
        argv = [*argv[1:2], "--help"]
    args = build_parser().parse_args(argv)
    if not getattr(args, "_module", None):
        build_parser().print_help()
        return 2
    try:
        code = int(importlib.import_module(f"toolkit.commands.{args._module}").run(args) or 0)
        sys.stdout.flush()  # a reader that left (`| head`) is met here, not at interpreter exit
        return code
    except UserError as exc:
        if not _quiet_rank(args.verb):
            print(f"dstk {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dstk ... | head`: the reader left, nothing is wrong
        _stdout_to_devnull()
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
    except Exception as exc:
        if args.verb == "train" and _port_taken(exc):
            print(
                f"dstk train: rank {os.environ.get('RANK', '?')}: the rendezvous port {os.environ.get('MASTER_PORT')} "
                f"on {os.environ.get('MASTER_ADDR')} is in use (EADDRINUSE): another program took it; start the job "
                "again (dstk launch reserves a free one) or give dstk launch --master-port a free port",
                file=sys.stderr,
            )
            return 1
        if args.verb != "train" or not _peer_failed(exc):
            raise
        # another rank failed first and its error is printed above; this rank's traceback says only that
        print(
            f"dstk train: rank {os.environ.get('RANK', '?')}: stopped because another rank failed "
            f"({exc.__class__.__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})",
            file=sys.stderr,
        )
        return 1


def _stdout_to_devnull() -> None:
    """After a broken pipe, what Python still has buffered for stdout would fail again at exit (status 120,
    "Exception ignored … BrokenPipeError"): point the descriptor at /dev/null instead (Python's own advice,
    docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _quiet_rank(verb: str | None) -> bool:
    """A train rank other than its node's first: a user error is the same on every rank (the flags, the
    files), so the first rank of each node says it and the others stay quiet, instead of N copies."""
    return verb == "train" and os.environ.get("LOCAL_RANK", "0") != "0"


PEER_FAILURE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "remote process exited",
    "failed to recv",
    "Socket Timeout",
)
"""What gloo and NCCL say on a rank whose collective lost a peer (the peer's own error is the cause)."""


def _port_taken(exc: BaseException) -> bool:
    """torch's TCPStore could not listen on MASTER_PORT: "...failed to listen on any local network address.
    port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"."""
    text = str(exc)
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def _peer_failed(exc: BaseException) -> bool:
    text = f"{exc.__class__.__name__}: {exc}"
    return exc.__class__.__name__ in ("DistBackendError", "DistNetworkError") or any(
        p in text for p in PEER_FAILURE
    )


if __name__ == "__main__":
    sys.exit(main())
