"""`make demo` twice in a row in the same folder: the README's main command must run again as written, its
rerun replacing what the first run wrote through the flags that say so (`--overwrite`,
`--overwrite-checkpoints`), never failing on it or replacing anything silently.

This is what `make demo` runs (`python -m toolkit.demo`, after the install that `make test` has done too), in a
folder of its own so the checkout's `demo_out/` is left alone. The suite's private calibration cache
(tests/conftest.py) makes the first run calibrate this host, as a fresh machine does, and the second reuse it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cli import REPO

pytestmark = pytest.mark.multiprocess


def _demo(cwd) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    return subprocess.run(
        [sys.executable, "-m", "toolkit.demo"], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def test_make_demo_runs_twice_in_a_row(tmp_path) -> None:
    first = _demo(tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    exported = tmp_path / "demo_out" / "hf_model" / "config.json"
    assert exported.exists() and "Demo took" in first.stdout
    before = exported.stat().st_mtime_ns
    second = _demo(tmp_path)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    # the rerun says what it replaced, through the flags that allow it
    assert "--overwrite-checkpoints: removed" in out, out[-4000:]
    assert "earlier run's" in out and "moved to" in out, out[-4000:]
    assert "Demo took" in second.stdout and exported.stat().st_mtime_ns > before
