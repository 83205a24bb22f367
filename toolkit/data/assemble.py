"""The `assemble` stage (one task): every shard's tokens put back in input order, mixed to the domain budgets,
split, shuffled and written — dstk's Arrow rows (toolkit.data.pack), Megatron's .bin/.idx
(toolkit.data.megatron), or both — with the tokenizer and manifest.json, into `dataset/`.

Documents are addressed in input order (task by task), so the mixture (toolkit.data.mix), the validation
split (a hash of each text) and the seeded shuffle are those of one process reading the inputs in order.
The Megatron files hold the same documents in the same order as the Arrow rows, one sequence each.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from toolkit.data.explain import no_validation
from toolkit.data.filter import FilterCounts, drops, stage_counts
from toolkit.data.integrity import record as file_record
from toolkit.data.megatron import MegatronWriter
from toolkit.data.mix import mixture_weights, select, shares, token_budgets
from toolkit.data.pack import write_split
from toolkit.data.paths import MANIFEST
from toolkit.data.progress import Heartbeat
from toolkit.data.read import BAD_INPUT, InputReport
from toolkit.data.store import TokenShards
from toolkit.data.tokenizer import tokenizer_hash
from toolkit.data.workdir import VERDICT, rank_file, read_json, verdict, write_json
from toolkit.errors import UserError

SPLITS = ("train", "validation")
MEGATRON = "megatron"
"""The folder of the Megatron files: `megatron/{train,validation}_text_document.{bin,idx}`."""


def split_order(documents: np.ndarray, seed: int, split: str) -> np.ndarray:
    """The order in which a split's documents (indices in kept order) are packed: a seeded shuffle, so the
    domains interleave and a different seed gives different rows."""
    return np.random.default_rng([seed, SPLITS.index(split)]).permutation(documents)


class Assemble(PipelineStep):
    name, type = "dstk mix + pack", "💽 - WRITER"

    def __init__(self, stages: dict[str, str], settings: dict[str, Any]) -> None:
        super().__init__()
        self.stages, self.settings = stages, settings

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if verdict(self.stages["resolve"]) is not None:
            return
        stage = Path(self.stages["assemble"])
        shutil.rmtree(stage / "dataset", ignore_errors=True)
        try:
            write_json(stage / "summary.json", self._assemble(stage / "dataset"))
            write_json(stage / VERDICT, {})
        except UserError as exc:
            write_json(stage / VERDICT, {"error": str(exc)})
        return
        yield

    def _tokens(self) -> tuple[TokenShards, np.ndarray, np.ndarray, list[str]]:
        """(token store, global domain id, validation flag per document, domain names in input order)."""
        tokens = Path(self.stages["tokenize"])
        names = [name for name, _ in read_json(Path(self.stages["resolve"]) / "summary.json")["domains"]]
        index = {name: k for k, name in enumerate(names)}
        paths, lengths, domains, validation = [], [], [], []
        for r in range(self.settings["tasks"]):
            local = np.array(
                [index[n] for n in read_json(rank_file(tokens, r, ".json"))["domains"]], np.int32
            )
            paths.append(rank_file(tokens, r, ".bin"))
            lengths.append(np.load(rank_file(tokens, r, ".lengths.npy")))
            domains.append(local[np.load(rank_file(tokens, r, ".domain.npy"))] if len(local) else lengths[-1])
            validation.append(np.load(rank_file(tokens, r, ".validation.npy")))
        return TokenShards(paths, lengths), np.concatenate(domains), np.concatenate(validation), names

    def _assemble(self, dataset: Path) -> dict[str, Any]:
        settings, options = self.settings, self.settings["options"]
        summary = read_json(Path(self.stages["tokenizer"]) / "summary.json")
        store, domain_ids, validation, names = self._tokens()
        eos, pad = summary["eos_token_id"], summary["pad_token_id"]
        lengths = store.lengths.astype(np.int64) + 1  # + the end-of-text separator
        available = {d: int(lengths[domain_ids == k].sum()) for k, d in enumerate(names)}
        weights = mixture_weights(available, options["mix"], options["temperature"])
        selected = select(domain_ids, lengths, names, token_budgets(available, weights), settings["seed"])
        beat = Heartbeat(rank_file(Path(self.stages["assemble"]) / "progress", 0, ""))
        beat.total = float(selected.sum())
        shutil.copytree(Path(self.stages["tokenizer"]) / "tokenizer", dataset / "tokenizer")
        (dataset.parent / "tmp").mkdir(exist_ok=True)
        documents, rows, tokens, cut, megatron = {}, {}, {}, {}, {}
        done = 0
        for split in SPLITS:
            idx = np.flatnonzero(selected & (validation == (split == "validation")))
            order = split_order(idx, settings["seed"], split)
            writer = None
            if settings["format"] in ("megatron", "both"):
                writer = MegatronWriter(
                    dataset / MEGATRON / f"{split}_text_document", summary["vocab_size"], eos
                )
            docs = _visit(store.documents(order.tolist()), writer, beat, done)
            if settings["format"] in ("arrow", "both"):
                rows[split] = write_split(docs, dataset / split, dataset.parent / "tmp" / f"{split}.arrow",
                                          settings["seq_length"], eos, pad, options["max_shard_mb"],
                                          options["packing"])  # fmt: skip
            else:
                for _ in docs:
                    pass
            if writer is not None:
                megatron[split] = {"documents": writer.close(), "tokens": writer.tokens}
            done += len(order)
            documents[split], tokens[split] = len(idx), int(lengths[idx].sum())
            cut[split] = int((lengths[idx] > settings["seq_length"]).sum())
        resolved = read_json(Path(self.stages["resolve"]) / "summary.json")
        counts = FilterCounts.merge([resolved["counts"]])
        counts.dropped["mixing"] = int((~selected).sum())
        if settings["validation_fraction"] > 0 and not (rows.get("validation") or megatron.get("validation")):
            report = InputReport.from_json(resolved["input"])
            n, seq = len(lengths), settings["seq_length"]
            raise UserError(no_validation(report, counts.read, settings["validation_fraction"], n, seq,
                                          documents["validation"], tokens["validation"]))  # fmt: skip
        chosen = {d: int(lengths[selected & (domain_ids == k)].sum()) for k, d in enumerate(names)}
        manifest = self._manifest(summary, resolved, counts, dataset)
        manifest.update(documents=documents, rows=rows, tokens=tokens)
        if options["packing"] == "none":
            manifest["documents_cut_into_pieces"] = cut
        if megatron:
            manifest[MEGATRON] = self._megatron_entry(megatron, summary["vocab_size"], eos)
        manifest["mixture"] = {
            "mix": options["mix"],
            "temperature": None if options["mix"] else options["temperature"],
            "weights": weights,
            "documents_before": {d: int((domain_ids == k).sum()) for k, d in enumerate(names)},
            "documents_after": {d: int((selected & (domain_ids == k)).sum()) for k, d in enumerate(names)},
            "tokens_before": available,
            "tokens_after": chosen,
            "realised_shares": shares(chosen),
        }
        # shard sizes and tokenizer hashes: what the pre-flight checks (toolkit.data.integrity)
        manifest.update(file_record(dataset))
        write_json(dataset / MANIFEST, manifest)
        return {"documents": done, "rows": rows, "megatron": megatron}

    def _manifest(self, tok: dict[str, Any], resolved: dict[str, Any], counts: FilterCounts, dataset: Path):
        settings, options = self.settings, self.settings["options"]
        report = InputReport.from_json(resolved["input"])
        dedup = resolved["dedup"]
        checked = dedup["documents_checked"] if options["dedup"]["dedup"] != "none" else 0
        index = {
            "mode": options["dedup"]["dedup"],
            "documents_checked": checked,
            "index_bytes": dedup["signature_bytes"],
            "index_bytes_per_document": dedup["signature_bytes"] / checked if checked else 0.0,
        }
        if options["dedup"]["dedup"] == "near":
            index.update(shingle_size=options["dedup"]["shingle_size"], threshold=options["dedup"]["near_threshold"],
                         num_perm=options["dedup"]["num_perm"], **settings["bands"])  # fmt: skip
        return {
            "seq_length": settings["seq_length"],
            "packing": options["packing"],
            "format": settings["format"],
            "vocab_size": tok["vocab_size"],
            "eos_token_id": tok["eos_token_id"],
            "pad_token_id": tok["pad_token_id"],
            "tokenizer_hash": tokenizer_hash(dataset / "tokenizer"),
            "tokenizer_training": tok["training"],
            "seed": settings["seed"],
            "inputs": settings["inputs"],
            "input_files": settings["input_files"],
            "notes": settings["notes"],
            "validation_fraction": settings["validation_fraction"],
            "bad_input": {k: report.bad.get(k, 0) for k in BAD_INPUT},
            "bad_input_files": report.manifest(),
            "stages": stage_counts(counts),
            "dropped": drops(counts),
            "cleaning": {
                "documents_changed": counts.cleaning_changed,
                "boilerplate_rules": len(options["boilerplate"]),
                "boilerplate_lines_removed": counts.boilerplate_lines,
            },
            "languages": {"allowed": options["languages"], "untagged": counts.untagged},
            "dedup": index,
            "options": options,
        }

    @staticmethod
    def _megatron_entry(parts: dict[str, dict[str, int]], vocab: int, eos: int) -> dict[str, Any]:
        from toolkit.data.megatron import token_dtype

        return {
            "prefixes": {split: f"{MEGATRON}/{split}_text_document" for split in parts},
            "dtype": token_dtype(vocab).name,
            "eod_token_id": eos,
            "documents": {split: p["documents"] for split, p in parts.items()},
            "tokens": {split: p["tokens"] for split, p in parts.items()},
        }


def _visit(
    docs: Iterator[np.ndarray], writer: MegatronWriter | None, beat: Heartbeat, done: int
) -> Iterator[np.ndarray]:
    """`docs`, each also written to the Megatron files, the progress counted."""
    n = 0
    for n, ids in enumerate(docs, 1):
        if writer is not None:
            writer.add(ids)
        if n % 1024 == 0:
            beat(done + n, done + n)
        yield ids
    beat(done + n, done + n, force=True)
