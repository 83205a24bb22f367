"""Byte-level BPE tokenizers trained locally with `tokenizers` (nothing is downloaded).

Wrapped in `PreTrainedTokenizerFast` so it saves and loads like any HF tokenizer. (In transformers 5,
`GPT2TokenizerFast(vocab_file=..., merges_file=...)` silently yields an empty tokenizer; build from the
`tokenizers` object instead.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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


def load_tokenizer(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(path)


def tokenizer_hash(path: Path) -> str:
    """Content hash of the tokenizer files, recorded in the data manifest."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*.json")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
