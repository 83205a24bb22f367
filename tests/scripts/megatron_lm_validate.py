"""Megatron-LM's own checks on a `pretrain_gpt.py` argument list, on a machine without a GPU:
`python megatron_lm_validate.py WORLD_SIZE ARCH ARG...` with a Megatron-LM checkout (d98e8a64) on PYTHONPATH and
torch installed. Builds its parser (add_megatron_arguments), runs validate_args and the TransformerConfig (MLA's
too) the arguments make, and prints `OK ...` or the error; exit 1 on an error.

What cannot run here is answered: the GPU's architecture (ARCH: 9 Hopper, 10 Blackwell; Megatron asks
torch.cuda for it), Transformer Engine's version (its MoE-FP8 and FP4 checks), and CUDA_DEVICE_MAX_CONNECTIONS=1,
which a launcher sets. A mock dataset and NullTokenizer stand in for the user's data flags; rope fusion, which
needs Transformer Engine, is off.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import sys
import typing
import warnings

if not hasattr(typing, "override"):  # Megatron-LM targets Python >= 3.12 (typing.override)
    typing.override = lambda f: f  # type: ignore[attr-defined]
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)

import megatron.core.transformer.transformer_config as transformer_config  # noqa: E402
import megatron.training.arguments as arguments  # noqa: E402
import torch  # noqa: E402
from megatron.training.argument_utils import core_transformer_config_from_args  # noqa: E402


def main(world: int, arch: int, argv: list[str]) -> int:
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
    arguments.get_device_arch_version = lambda: arch
    for module in (transformer_config, arguments):
        if hasattr(module, "is_te_min_version"):
            module.is_te_min_version = lambda *a, **k: True
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    parser = argparse.ArgumentParser(allow_abbrev=False)
    arguments.add_megatron_arguments(parser)
    extra = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000", "--no-rope-fusion"]
    args = parser.parse_args(argv + extra)
    args.rank, args.world_size = 0, world
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            arguments.validate_args(args, {})
            config = core_transformer_config_from_args(args)
    except (AssertionError, ValueError, RuntimeError, KeyError, TypeError) as e:
        print(f"ERROR {type(e).__name__}: {e}")
        return 1
    print(
        f"OK {type(config).__name__} dp={args.data_parallel_size} vpp={config.virtual_pipeline_model_parallel_size} "
        f"ep={config.expert_model_parallel_size} etp={config.expert_tensor_parallel_size}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
