"""The `tokenizer` stage (one task: the tokenizer given, or a byte-level BPE trained on a bounded sample of the
survivors) and the `tokenize` stage (one task per shard: `SurvivorReader` → datatrove's `MinhashDedupFilter`
→ `Tokenize`).

The sample is every k-th survivor in input order, k chosen so that about `tokenizer_sample_mb` of text is
read (k = ceil(survivor bytes / limit)): BPE training costs grow with the text it reads, so the sample caps
the one step that does not run in parallel, however large the corpus.

Threads: a worker process tokenizes on one core (`--workers` processes fill the cores); a step given several
cores (the tokenizer's training on this machine, a SLURM task with --slurm-cpus-per-task) lets HF tokenizers
use them (TOKENIZERS_PARALLELISM, read by tokenizers at every call).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from toolkit.data.filter import batched
from toolkit.data.progress import Heartbeat
from toolkit.data.workdir import atomic, rank_file, read_json, verdict, write_json

BACKEND = "backend.json"
"""The tokenizer as `tokenizers` runs it (what transformers loaded), for workers that do not import
transformers."""
ENCODE_BATCH = 256  # token ids are Python ints until stored (~36 bytes each): keep batches small


def sample_stride(survivor_bytes: int, limit_mb: float) -> int:
    return max(1, math.ceil(survivor_bytes / (limit_mb * 1e6)))


@contextmanager
def parallelism(threads: int) -> Iterator[None]:
    """HF tokenizers on `threads` > 1 cores (its Rayon pool) or on this thread only, for the block."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def survivor_lines(filter_stage: Path, resolve_stage: Path, rank: int) -> Iterator[tuple[bool, bytes]]:
    """(kept, line) of every document shard `rank` wrote, in order; kept is False for a removed duplicate."""
    removed = np.fromfile(resolve_stage / "remove" / f"{rank:06d}.remove", dtype="<u4")
    gone, nxt = iter(removed.tolist()), None
    nxt = next(gone, None)
    with rank_file(filter_stage / "docs", rank, ".jsonl").open("rb") as f:
        for i, line in enumerate(f):
            if i == nxt:
                nxt = next(gone, None)
                yield False, line
            else:
                yield True, line


class TrainTokenizer(PipelineStep):
    """`tokenizer/` (save_pretrained), `backend.json` and summary.json (size, special tokens, the sample)."""

    name, type = "dstk tokenizer", "🔢 - TOKENIZER"

    def __init__(self, filter_stage: str, resolve_stage: str, stage: str, settings: dict[str, Any]) -> None:
        super().__init__()
        self.filter_stage, self.resolve_stage, self.stage, self.settings = (
            filter_stage, resolve_stage, stage, settings)  # fmt: skip

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from toolkit.data.tokenizer import load_tokenizer, train_tokenizer

        if verdict(self.resolve_stage) is not None:
            return
        stage, settings = Path(self.stage), self.settings
        scratch = stage / "tmp" / f"tokenizer.{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        training = None
        if settings["tokenizer"] is not None:
            tok = load_tokenizer(Path(settings["tokenizer"]))
            tok.save_pretrained(scratch)
        else:
            survivors = read_json(Path(self.resolve_stage) / "summary.json")["bytes"]
            stride = sample_stride(survivors, settings["sample_mb"])
            sample = self._sample(stride, Heartbeat(rank_file(stage / "progress", 0, "")))
            with parallelism(settings["threads"]):
                tok = train_tokenizer(sample, settings["vocab_size"], scratch)
            training = {"every_kth_document": stride, "vocab_size_asked": settings["vocab_size"]}
            training["documents"] = self.sampled
        with atomic(stage / BACKEND, "w") as f:
            f.write(tok.backend_tokenizer.to_str())
        shutil.rmtree(stage / "tokenizer", ignore_errors=True)
        os.replace(scratch, stage / "tokenizer")
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        write_json(stage / "summary.json", {"training": training, "vocab_size": len(tok),
                                            "eos_token_id": tok.eos_token_id, "pad_token_id": pad})  # fmt: skip
        return
        yield

    def _sample(self, stride: int, beat: Heartbeat) -> Iterator[str]:
        """Every `stride`-th survivor in input order."""
        self.sampled, kept = 0, 0
        tasks = len(read_json(Path(self.filter_stage) / "plan.json"))
        for r in range(tasks):
            for alive, line in survivor_lines(Path(self.filter_stage), Path(self.resolve_stage), r):
                if alive:
                    if kept % stride == 0:
                        self.sampled += 1
                        beat(self.sampled, self.sampled)
                        yield json.loads(line)
                    kept += 1
        beat(self.sampled, self.sampled, force=True)


class SurvivorReader(PipelineStep):
    """Every document shard `rank` wrote in the filter stage, removed duplicates included (datatrove's
    MinhashDedupFilter, next, drops those by index), with its domain, validation flag and size."""

    name, type = "dstk survivor reader", "📖 - READER"

    def __init__(self, filter_stage: str) -> None:
        super().__init__()
        self.filter_stage = filter_stage

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        docs = Path(self.filter_stage) / "docs"
        names = read_json(rank_file(docs, rank, ".json"))["domains"]
        domains = np.load(rank_file(docs, rank, ".domain.npy")).tolist()
        validation = np.load(rank_file(docs, rank, ".validation.npy")).tolist()
        with rank_file(docs, rank, ".jsonl").open("rb") as f:
            for i, line in enumerate(f):
                meta = {"domain": names[domains[i]], "validation": validation[i], "bytes": len(line)}
                yield Document(text=json.loads(line), id=f"{rank}/{i}", metadata=meta)


class Tokenize(PipelineStep):
    """Token ids of each document into `RRRRR.bin` (int32, back to back), with its length, domain and
    validation flag beside it."""

    name, type = "dstk tokenize", "🔢 - TOKENIZER"

    def __init__(self, resolve_stage: str, tokenizer_stage: str, stage: str, threads: int) -> None:
        super().__init__()
        self.resolve_stage, self.tokenizer_stage, self.stage, self.threads = (
            resolve_stage, tokenizer_stage, stage, threads)  # fmt: skip

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        from tokenizers import Tokenizer

        if verdict(self.resolve_stage) is not None:
            return
        stage = Path(self.stage)
        tok = Tokenizer.from_file(str(Path(self.tokenizer_stage) / BACKEND))
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        beat = Heartbeat(rank_file(stage / "progress", rank, ""))
        domains: dict[str, int] = {}
        lengths, ids, validation, done, count = [], [], [], 0, 0
        with atomic(rank_file(stage, rank, ".bin")) as out, parallelism(self.threads):
            for batch in batched(data, ENCODE_BATCH):
                with self.track_time(unit="batch"):
                    encoded = encode([d.text for d in batch], add_special_tokens=False)
                    sizes = [len(e.ids) for e in encoded]
                    out.write(
                        np.fromiter(
                            chain.from_iterable(e.ids for e in encoded), np.int32, sum(sizes)
                        ).tobytes()
                    )
                lengths += sizes
                ids += [domains.setdefault(d.metadata["domain"], len(domains)) for d in batch]
                validation += [d.metadata["validation"] for d in batch]
                done, count = done + sum(d.metadata["bytes"] for d in batch), count + len(batch)
                beat(done, count)
        for name, values in (("lengths", np.array(lengths, np.int32)), ("domain", np.array(ids, np.int32)),
                             ("validation", np.array(validation, np.bool_))):  # fmt: skip
            with atomic(rank_file(stage, rank, f".{name}.npy")) as f:
                np.save(f, values)
        write_json(rank_file(stage, rank, ".json"), {"domains": list(domains), "documents": len(lengths)})
        beat(done, count, force=True)
        return
        yield
