"""Command-line conventions (#46): `-V`, a reader that leaves (`| head`) ends the command quietly with status 0,
and Ctrl-C of a command (not of a launched job: tests/test_zero_runs.py) is one line."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.cli import REPO, dstk
from toolkit import __version__


def test_dash_v_is_the_version() -> None:
    for flag in ("-V", "--version"):
        r = dstk(flag)
        assert r.code == 0 and r.out.strip() == f"dstk {__version__}"


def test_a_reader_that_leaves_is_no_failure() -> None:
    """`dstk plan … | head -1` (rich's console), `dstk estimate --json | head -1` and `dstk presets | head -1`:
    status 0 and nothing on stderr, where rich's own broken-pipe handling exited 1."""
    for args in (
        ["plan", "--model", "llama-13b", "--cluster", "dgx-a100-80g", "--nodes", "2"],
        ["estimate", "--model", "llama-7b", "--cluster", "dgx-a100-80g", "--json"],
        ["presets"],
    ):
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout.readline()
        proc.stdout.close()  # as `head -1` does after its line
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0 and err == b"", (args, err)


def test_ctrl_c_is_one_line() -> None:
    """SIGINT to a command that is still working: one line, no traceback, status 130."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time, sys; from toolkit.cli import main; "
         "import toolkit.commands.presets as p; p.run = lambda args: time.sleep(30); sys.exit(main(['presets']))"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # pytest-xdist's workers ignore it
    )  # fmt: skip
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "dstk presets: interrupted", err
