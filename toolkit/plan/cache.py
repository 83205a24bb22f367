"""Where dstk caches what it measured or traced: $DSTK_CACHE_DIR, else $XDG_CACHE_HOME/dstk, else ~/.cache/dstk.

One place for the location, read by the calibration cache (`toolkit/host/calibration_cache.py`) and the model
traces (`toolkit/plan/traced.py`). The environment is read here, at the call, not deep inside library code.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """dstk's cache folder (not created here)."""
    if os.environ.get("DSTK_CACHE_DIR"):
        return Path(os.environ["DSTK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dstk"
