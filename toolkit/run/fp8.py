"""FP8 in `dstk train`: torchao.float8 on the HF model's linear layers, applied before `deepspeed.initialize`.

torchao's `convert_to_float8_training` swaps each `torch.nn.Linear` the filter accepts for a Float8Linear,
whose forward and both backward GEMMs take FP8 operands (`torch._scaled_mm`; dynamic tensorwise scaling, the
default `Float8LinearConfig`) and return bf16; everything else — the DeepSpeed engine's bf16 weights,
gradients and fp32 master copy, attention, norms, the loss — is the bf16 run's. The filter leaves out:
- the LM head (the model's output embeddings), as Transformer Engine's blocks and torchtitan's float8 converter
  leave it: the logits feed the loss;
- layers whose dimensions are not multiples of 16 (torchao: "All dims must be divisible by 16 due to float8
  hardware requirements", float8_linear_utils.py).

FP8 tensor cores need CUDA compute capability 8.9 or newer (Ada, Hopper; torchao.float8 "requires CUDA compute
capability ≥8.9"). `toolkit/run/preflight.py` refuses any other cluster before a rank starts; `check_device`
asks the GPU again on the rank, since a cluster description can be wrong. `emulate=True` (torchao's own
emulation: the casts happen, the GEMM runs in high precision) lets the conversion train on a CPU in tests; it is
never what a run uses.

Not run here: no GPU was available when this was written, so the CUDA path (a real `_scaled_mm`) is unmeasured.
"""

from __future__ import annotations

from typing import Any

from toolkit.errors import UserError

MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) and newer."""
DIM_MULTIPLE = 16


def preflight(model: Any, cluster: Any, request: Any) -> None:
    """Before any rank starts (toolkit/run/preflight.py, no torch): an fp8 layout runs only on FP8 tensor
    cores, with torchao installed, for a model the conversion covers; one line otherwise. `cluster` None: not
    known there (the rank asks its GPU, `check_device`)."""
    if request.precision != "fp8":
        return
    import importlib.util

    from toolkit.plan.fp8_support import run_problems

    problems = run_problems(model, cluster, request)
    if problems:
        raise UserError(f"--config: its layout is fp8: {problems[0].removeprefix('--precision: ')}")
    if importlib.util.find_spec("torchao") is None:
        raise UserError(
            "--config: its layout is fp8, which dstk train runs with torchao.float8, not installed here; "
            "pip install 'torchao>=0.18,<0.19' (dstk's run extra)"
        )


def check_device(torch: Any) -> None:
    """One line unless this rank's GPU has FP8 tensor cores."""
    if not torch.cuda.is_available():
        raise UserError("--precision fp8: torchao.float8 needs a CUDA GPU; this rank has none")
    cc = torch.cuda.get_device_capability()
    if tuple(cc) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name()
        raise UserError(
            f"--precision fp8: {name} has compute capability {cc[0]}.{cc[1]}; FP8 tensor cores need "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper); plan bf16 for it"
        )


def _shape(module: Any) -> tuple[int, int]:
    """(out, in) of a linear layer's weight, also when ZeRO-3 has partitioned it (`ds_shape`)."""
    weight = module.weight
    out, inp = getattr(weight, "ds_shape", weight.shape)
    return int(out), int(inp)


def convert(model: Any, emulate: bool = False) -> list[str]:
    """Swap the model's eligible nn.Linear layers for torchao's Float8Linear in place; their names."""
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    head = model.get_output_embeddings()
    converted: list[str] = []

    def eligible(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or module is head:
            return False
        if any(d % DIM_MULTIPLE for d in _shape(module)):
            return False
        converted.append(fqn)
        return True

    convert_to_float8_training(model, module_filter_fn=eligible, config=Float8LinearConfig(emulate=emulate))
    if not converted:
        raise UserError(
            f"--precision fp8: no linear layer of this model has dimensions divisible by {DIM_MULTIPLE}; "
            "train it in bf16"
        )
    return converted


def apply(model: Any, is_main: bool) -> None:
    """The run path's FP8: check the GPU, convert, say how many layers run in FP8."""
    import torch

    check_device(torch)
    converted = convert(model)
    if is_main:
        print(
            f"fp8: {len(converted)} linear layers run their GEMMs in FP8 (torchao.float8, tensorwise); "
            "LM head, attention and norms in bf16",
            flush=True,
        )
