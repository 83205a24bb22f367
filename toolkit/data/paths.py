"""The directories `dstk data prepare` reads and writes.

A prepared dataset is recognised by its `manifest.json` beside a `tokenizer/` folder: that is what a
`--tokenizer` pointing one level too high most likely meant (toolkit.data.tokenizer).
"""

from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer"
"""The subfolder of a prepared dataset that holds its tokenizer (what export and grow take as --tokenizer)."""


def is_dataset(path: Path) -> bool:
    """Whether `path` is a `dstk data prepare` output directory."""
    return (path / MANIFEST).is_file() and (path / TOKENIZER).is_dir()
