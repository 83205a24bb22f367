"""dstk: plan DeepSpeed layouts, generate their configs, and run HF-style models through the engine.

The package is split in two halves with a hard boundary (docs/ARCHITECTURE.md): the pure half (specs, estimate,
planner, config generation, launch commands) imports only the standard library, pydantic and PyYAML; the run
half imports torch, deepspeed, transformers and datasets lazily, inside the verbs that need them.
"""

__version__ = "0.1.0"
