"""`dstk data prepare`: raw text files → tokenized, packed training sequences on disk (HF `datasets` Arrow).

Documents are read from JSONL (`{"text": ...}`) or plain-text files, tokenized, joined with an end-of-text
token and cut into rows of exactly `seq_length` tokens; the last row of each split is padded (its real length
is kept in `n_tokens`, padding gets label -100), so every token of the corpus is trained on exactly once per
epoch. About 2 % of documents, chosen by a hash of their text, go to a held-out validation split.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolkit.data.tokenizer import load_tokenizer, tokenizer_hash, train_tokenizer
from toolkit.errors import UserError

MANIFEST = "manifest.json"


def iter_documents(paths: list[Path], stats: dict[str, int]) -> Iterator[str]:
    """Texts of every document; unreadable or malformed lines are counted in `stats`, never fatal."""
    for path in paths:
        if not path.is_file():
            raise UserError(f"--input: {path} is not a file")
        with path.open("rb") as f:
            for raw in f:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    stats["non_utf8_lines"] = stats.get("non_utf8_lines", 0) + 1
                    continue
                if path.suffix == ".jsonl":
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line).get("text")
                    except (json.JSONDecodeError, AttributeError):
                        stats["malformed_json_lines"] = stats.get("malformed_json_lines", 0) + 1
                        continue
                    if not isinstance(text, str):
                        stats["missing_text_field"] = stats.get("missing_text_field", 0) + 1
                        continue
                else:
                    text = line
                if text.strip():
                    yield text


def is_validation(text: str, fraction: float) -> bool:
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
    return digest % 10_000 < fraction * 10_000


def pack(token_streams: Iterator[list[int]], seq_length: int, eos: int, pad: int) -> Iterator[dict[str, Any]]:
    """Rows of `seq_length` tokens from documents joined by `eos`; the final row padded with `pad`."""
    buf: list[int] = []
    for ids in token_streams:
        buf.extend(ids)
        buf.append(eos)
        while len(buf) >= seq_length:
            yield {"input_ids": buf[:seq_length], "n_tokens": seq_length}
            buf = buf[seq_length:]
    if buf:
        yield {"input_ids": buf + [pad] * (seq_length - len(buf)), "n_tokens": len(buf)}


def prepare(
    inputs: list[Path],
    out: Path,
    seq_length: int,
    *,
    tokenizer: Path | None = None,
    vocab_size: int | None = None,
    validation_fraction: float = 0.02,
    seed: int = 0,
) -> dict[str, Any]:
    """Tokenize and pack `inputs` into `out/{train,validation}`, with `out/tokenizer` and `out/manifest.json`."""
    import datasets

    datasets.disable_progress_bars()
    if (tokenizer is None) == (vocab_size is None):
        raise UserError(
            "--tokenizer/--train-tokenizer: give exactly one (a local tokenizer dir, or a vocab size)"
        )
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, int] = {}
    tok_dir = out / "tokenizer"
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok.save_pretrained(tok_dir)
    else:
        tok = train_tokenizer(iter_documents(inputs, {}), vocab_size, tok_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    counts = {"train": 0, "validation": 0}
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32"), length=seq_length),
            "n_tokens": datasets.Value("int32"),
        }
    )
    for split in ("train", "validation"):

        def streams(split: str = split) -> Iterator[list[int]]:
            for text in iter_documents(inputs, stats if split == "train" else {}):
                if is_validation(text, validation_fraction) == (split == "validation"):
                    counts[split] += 1
                    yield tok(text, add_special_tokens=False)["input_ids"]

        def rows(split: str = split) -> Iterator[dict[str, Any]]:
            yield from pack(streams(split), seq_length, eos, pad)

        ds = datasets.Dataset.from_generator(rows, features=features, cache_dir=str(out / ".cache"))
        ds.save_to_disk(str(out / split))
    manifest = {
        "seq_length": seq_length,
        "vocab_size": len(tok),
        "eos_token_id": eos,
        "pad_token_id": pad,
        "documents": counts,
        "rows": {s: datasets.load_from_disk(str(out / s)).num_rows for s in counts},
        "bad_input": stats,
        "tokenizer_hash": tokenizer_hash(tok_dir),
        "seed": seed,
        "inputs": [str(p) for p in inputs],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
