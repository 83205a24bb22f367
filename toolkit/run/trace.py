"""Trace a model transformers builds, on the meta device, into the description the cost model reads.

`trace_config(config)` builds `AutoModelForCausalLM.from_config(config)` on the meta device (no memory, no
weights; SDPA attention where transformers has it for the family, eager otherwise; bf16, or fp32 where the
modules insist on it) and runs one training-mode forward pass with labels at each of two sequence lengths
(`toolkit/run/trace_ops.py` records them). From the module and the two passes it reads:

- every parameter (`model.parameters()`, tied weights once), by where it sits: the word embedding, a learned
  position table, the blocks (the `nn.ModuleList` of `num_hidden_layers` decoder layers), the LM head, and
  within a block the routed experts (a fused experts module's E × n × k tensors) and the router (E × h);
- per block its GEMMs against weights, with their rows per token: 1, or the router's top-k for the experts'
  grouped GEMM (transformers 5 runs fused experts through `torch._grouped_mm`, to which torch's flop
  counter gives no formula: 2·rows·k·n here) — the config's top-k where HF's implementation runs more
  experts than the router picks (Llama 4 runs all of them on every token and zeroes the unpicked ones);
- its attention cores, its saved bytes (the two lengths tell the linear part from stored scores), its
  memory-bound traffic and op count, and the model's FLOPs.

Blocks with routed experts form the `moe` kind, the others `dense`. A forward the meta device cannot run
(experts dispatched by data-dependent indexing) falls back to the module's structure: its linear layers and
expert tensors, the config's heads, and saved bytes estimated from them, said in the description's notes.
The result is a `toolkit.plan.traced.TracedModel`; the loader caches it by the config's hash, so this import
of torch happens once per model.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from typing import Any

from toolkit.errors import UserError
from toolkit.plan.traced import TRACE_SEQ_LENGTHS, TracedModel, trace_path, transformers_version
from toolkit.run.trace_describe import describe
from toolkit.run.trace_ops import Recorder, config_int, record_forward


def _quiet() -> contextlib.ExitStack:
    """Silence the library warnings a trace of a default config provokes (they say nothing to the user)."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    for name in ("torch", "torchao"):
        logger = logging.getLogger(name)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    stack.callback(hf_logging.set_verbosity, hf_logging.get_verbosity())
    hf_logging.set_verbosity_error()
    return stack


def hf_config_object(config: dict[str, Any]) -> Any:
    """The transformers config object of a `config.json` dict (by its `model_type`), refused in one line where
    transformers has no such model type or no causal LM for it."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = str(config.get("model_type", ""))
    if model_type not in CONFIG_MAPPING:
        raise UserError(
            f"model_type: {model_type!r} is not a model type transformers {transformers_version()} builds; "
            "dstk does not run a repository's own modeling code (trust_remote_code)"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise UserError(
            f"model_type: {model_type!r} is not a causal language model: transformers {transformers_version()} "
            "builds no AutoModelForCausalLM for it (dstk trains decoder language models)"
        )
    with _quiet():
        return CONFIG_MAPPING[model_type].from_dict({k: v for k, v in config.items() if k != "model_type"})


def build_meta(config: dict[str, Any], dtype: Any) -> tuple[Any, str]:
    """The model on the meta device, with SDPA attention where transformers has it for the family."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = hf_config_object(config)
    for attn in ("sdpa", "eager"):
        try:
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype), attn
        except ValueError as exc:  # no SDPA path for the family: eager attention
            if attn == "eager" or "attention" not in str(exc):
                raise _cannot_build(config, exc) from None
        except Exception as exc:  # a config transformers cannot build, named as such
            raise _cannot_build(config, exc) from None
    raise AssertionError("unreachable")


def _cannot_build(config: dict[str, Any], exc: Exception) -> UserError:
    first = (str(exc).splitlines() or [""])[0][:200]
    return UserError(
        f"model_type {config.get('model_type')!r}: transformers cannot build this config ({type(exc).__name__}: {first})"
    )


def decoder_layers(model: Any, n_layers: int | None) -> Any:
    """The model's blocks: its largest `nn.ModuleList` of `n_layers` entries, else its largest list."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    exact = [m for m in lists if len(m) == n_layers]
    if not (exact or lists):
        raise UserError(f"model_type {model.config.model_type!r}: no list of decoder layers found")
    return max(exact or lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def _windows(cfg: Any, n_layers: int) -> list[int | None]:
    """Keys a query sees in each layer: a sliding window or attention chunk where the config's layer types
    say so (`layer_types`; Llama 4's `no_rope_layers` with its chunk size), else the whole sequence."""
    types = getattr(cfg, "layer_types", None)
    window = config_int(cfg, "sliding_window")
    chunk = config_int(cfg, "attention_chunk_size")
    if isinstance(types, (list, tuple)) and len(types) == n_layers:
        sizes = {"sliding_attention": window, "local_attention": window, "chunked_attention": chunk}
        return [sizes.get(t) for t in types]
    rope = getattr(cfg, "no_rope_layers", None)
    if chunk and isinstance(rope, (list, tuple)) and len(rope) >= n_layers:
        return [chunk if r else None for r in rope[:n_layers]]
    return [None] * n_layers


def trace_config(config: dict[str, Any]) -> TracedModel:
    """Trace the model `config` (an HF config.json dict) describes: see the module docstring."""
    start = time.perf_counter()
    with _quiet():
        import torch

        runs: list[Recorder] | None = None
        failure = ""
        for dtype in (torch.bfloat16, torch.float32):
            model, attn = build_meta(config, dtype)
            model.train()
            cfg = model.config
            layers = decoder_layers(model, config_int(cfg, "num_hidden_layers", "n_layer", "num_layers"))
            params = {p.untyped_storage()._cdata for p in model.parameters()}
            windows = _windows(cfg, len(layers))
            try:
                runs = [record_forward(model, layers, s, params, windows) for s in TRACE_SEQ_LENGTHS]
                break
            except Exception as exc:  # a forward the meta device cannot run
                failure = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
                if "scalar type" not in str(exc):  # only a dtype the module insists on is worth a retry
                    break
        width = torch.finfo(dtype).bits // 8
        return describe(config, model, layers, runs, attn, failure, time.perf_counter() - start, width)


def trace_announced(config: dict[str, Any], source: str) -> TracedModel:
    """`trace_config` as the loader calls it: said once on stderr, because it imports torch and takes seconds
    where everything else about planning takes milliseconds; a config transformers cannot take is refused
    before that is said."""
    hf_config_object(config)
    where = trace_path(config, transformers_version() or "?").parent
    print(
        f"dstk: model_type {config.get('model_type')!r} ({source}) is not in dstk's family table: reading it off "
        f"the model transformers builds on the meta device, once (cached in {where})",
        file=sys.stderr,
        flush=True,
    )
    traced = trace_config(config)
    print(f"dstk: traced in {traced.trace_seconds:.1f} s", file=sys.stderr, flush=True)
    return traced
