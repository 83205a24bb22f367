"""Byte-level BPE tokenizers trained locally with `tokenizers`, and local tokenizer directories checked and
loaded (nothing is downloaded).

Wrapped in `PreTrainedTokenizerFast` so it saves and loads like any HF tokenizer. (In transformers 5,
`GPT2TokenizerFast(vocab_file=..., merges_file=...)` silently yields an empty tokenizer; build from the
`tokenizers` object instead.)

Every `--tokenizer DIR` (data prepare, export, grow) goes through :func:`check_tokenizer_dir` before any work:
given a name that is not a local directory, `from_pretrained` would ask the Hub (five retries per file, minutes
without a network, then a traceback), so a typo of a local folder must fail here, naming the flag.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from toolkit.data.paths import TOKENIZER, is_dataset
from toolkit.errors import UserError

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS)
    fast.save_pretrained(out_dir)
    return fast


TOKENIZER_FILE = "tokenizer.json"
"""What a fast HF tokenizer saves (`save_pretrained`), and all `PreTrainedTokenizerFast` needs to load."""


def check_tokenizer_dir(path: Path, flag: str = "--tokenizer") -> Path:
    """`path` if it is a local tokenizer directory, else one line naming `flag`, what is wrong and the likely
    fix. Only the file system is consulted (no import of transformers), so verbs call it first."""
    if not path.exists():
        hub = len(path.parts) <= 2 and not path.is_absolute() and not str(path).startswith(".")
        raise UserError(
            f"{flag}: {path} not found; expected a local tokenizer directory"
            + (
                " (names are never looked up on the Hub: save one first with "
                "AutoTokenizer.from_pretrained(NAME).save_pretrained(DIR))"
                if hub
                else ""
            )
        )
    if not path.is_dir():
        fix = f"; did you mean {path.parent}?" if path.name == TOKENIZER_FILE else ""
        raise UserError(f"{flag}: {path} is a file; expected a directory holding {TOKENIZER_FILE}{fix}")
    if (path / TOKENIZER_FILE).is_file():
        return path
    if is_dataset(path):
        raise UserError(f"{flag}: {path} is a prepared dataset; did you mean {path / TOKENIZER}?")
    raise UserError(
        f"{flag}: {path} has no {TOKENIZER_FILE} (a fast HF tokenizer directory, as save_pretrained writes it)"
    )


def load_tokenizer(path: Path, flag: str = "--tokenizer") -> Any:
    """The tokenizer saved in the local directory `path` (never the Hub), or one line naming `flag`."""
    from transformers import PreTrainedTokenizerFast

    check_tokenizer_dir(path, flag)
    try:
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # a corrupt or foreign tokenizer.json: the user's file, not a bug of ours
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{flag}: cannot load the tokenizer in {path} ({reason})") from None


def tokenizer_hash(path: Path) -> str:
    """Content hash of the tokenizer files, recorded in the data manifest."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.json")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
