"""The directories `dstk data prepare` reads and writes, checked before any work is done.

A prepared dataset is recognised by its `manifest.json` beside a `tokenizer/` folder: that is what `--out`
must not silently replace (`--overwrite` says so), what an `--input` walk must not read as text (the next run
would ingest the previous one's manifest and Arrow shards), and what a `--tokenizer` pointing one level too
high most likely meant (toolkit.data.tokenizer).
"""

from __future__ import annotations

from pathlib import Path

from toolkit.errors import UserError
from toolkit.paths import output_dir

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer"
"""The subfolder of a prepared dataset that holds its tokenizer (what export and grow take as --tokenizer)."""


def is_dataset(path: Path) -> bool:
    """Whether `path` is a `dstk data prepare` output directory."""
    return (path / MANIFEST).is_file() and (path / TOKENIZER).is_dir()


def create_dir(path: Path, flag: str) -> None:
    """`mkdir -p path`, or one line naming the flag when it cannot be done (a file in the way, no permission)."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag}: {path} is a file; expected a directory")
    output_dir(path, flag)
    path.mkdir(parents=True, exist_ok=True)


def check_out(out: Path, input_dirs: list[Path], overwrite: bool) -> None:
    """Refuse an `--out` that would replace a dataset unasked, or land inside the input it is made from."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} is a file; expected a directory")
    where = out.resolve()
    for folder in input_dirs:
        if where.is_relative_to(folder.resolve()):
            inside = "is" if where == folder.resolve() else "is inside"
            raise UserError(
                f"--out: {out} {inside} the --input directory {folder}, so a later run on {folder} would read "
                "this dataset as text; choose an --out outside it"
            )
    if (
        out / MANIFEST
    ).exists() and not overwrite:  # a dataset's, or another tool's: either would be replaced
        what = f"a prepared dataset ({MANIFEST}, {TOKENIZER}/, ...)" if is_dataset(out) else f"a {MANIFEST}"
        raise UserError(
            f"--out: {out} already holds {what}; pass --overwrite to replace it, or choose another --out"
        )
    output_dir(out, "--out")  # writable or creatable, probed (root passes every permission test)
