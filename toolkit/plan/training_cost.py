"""What a training run will cost: time, GPU-hours, energy and money for a token budget (pure).

Training compute is the plan's model FLOPs per token times the tokens D: (6·N + 12·L·H·Q·T)·D, the PaLM
convention behind the plan's MFU (toolkit.plan.cost.flops), so one MFU describes both. Its 6·N·D part is
Kaplan et al. 2020's C ≈ 6·N·D — for GPT-3 175B on 300B tokens 3.14e23 FLOPs, as Brown et al. 2020 (Table
D.1) report; attention adds 2.8 % at 2,048 tokens. With `--mfu` the time is that compute over the cluster's
peak at that utilisation, C / (GPUs · peak · MFU); without it, the time comes from the plan's predicted
tokens/s, and the MFU shown is the plan's own. Energy = GPUs · gpu_power_w · hours · PUE / 1000 kWh.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolkit.errors import UserError

DEFAULT_PUE = 1.1
"""Power usage effectiveness (facility energy / IT energy). 1.10 is what Patterson et al. 2021, "Carbon
Emissions and Large Neural Network Training" (arXiv:2104.10350, Table 4) use for the Microsoft datacenter
that trained GPT-3 (Google's were 1.09–1.12); the industry-wide average is about 1.5–1.6 (Uptime Institute's
annual surveys): pass `--pue` for an ordinary machine room."""

_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT = re.compile(r"(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*([kmbgt]?)", re.IGNORECASE)


def parse_tokens(text: str, flag: str = "--tokens") -> float:
    """A token count written as 300e9, 3e11, 300B, 1.5T, 300_000_000_000 or 300,000,000,000."""
    match = _COUNT.fullmatch(text.strip().replace("_", "").replace(",", ""))
    value = (
        float(match.group(1) + (match.group(2) or "")) * _SCALE[match.group(3).lower()] if match else math.nan
    )
    if not (math.isfinite(value) and value >= 1):
        raise UserError(f"{flag}: {text!r} is not a token count; write e.g. 300e9, 3e11, 300B or 1.5T")
    return value


def parse_mfu(text: str) -> float:
    """Model FLOPs utilisation as a fraction (0.45) or a percentage (45%)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise UserError(f"--mfu: {text!r} must be a fraction in (0, 1], e.g. 0.45 or 45%")
    return value


@dataclass(frozen=True)
class TrainingCost:
    """Time, GPU-hours, energy and cost of training `tokens` tokens on `gpus` accelerators."""

    tokens: float
    flops_per_token: float
    """Model FLOPs per token, 6·N + 12·L·H·Q·T (toolkit.plan.cost.flops): the plan's MFU convention."""
    n_params: float
    """N of 6·N: the parameters a token multiplies by."""
    training_flops: float
    gpus: int
    peak_flops_per_gpu: float
    mfu: float
    """Used (`--mfu`) or implied by the plan's tokens/s (then the plan's own MFU)."""
    time_source: str
    """"mfu" (training FLOPs / (GPUs · peak · MFU)) or "plan" (tokens / the plan's predicted tokens/s)."""
    tokens_per_s: float
    seconds: float
    gpu_power_w: float
    pue: float
    price_per_gpu_hour: float | None

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.hours

    @property
    def energy_kwh(self) -> float:
        return self.gpus * self.gpu_power_w * self.hours * self.pue / 1000

    @property
    def cost(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "hours": self.hours,
            "days": self.seconds / 86400,
            "gpu_hours": self.gpu_hours,
            "energy_kwh": self.energy_kwh,
            "cost": self.cost,
        }


def training_cost(
    *,
    tokens: float,
    flops_per_token: float,
    n_params: float,
    gpus: int,
    peak_flops_per_gpu: float,
    plan_tokens_per_s: float,
    gpu_power_w: float,
    pue: float = DEFAULT_PUE,
    price_per_gpu_hour: float | None = None,
    mfu: float | None = None,
) -> TrainingCost:
    """The cost of `tokens` (see the module docstring for the two ways the time is found)."""
    flops = flops_per_token * tokens
    if mfu is not None:
        seconds, source = flops / (gpus * peak_flops_per_gpu * mfu), "mfu"
    else:
        seconds, source = tokens / plan_tokens_per_s, "plan"
        mfu = flops / (seconds * gpus * peak_flops_per_gpu)
    return TrainingCost(
        tokens=tokens,
        flops_per_token=flops_per_token,
        n_params=n_params,
        training_flops=flops,
        gpus=gpus,
        peak_flops_per_gpu=peak_flops_per_gpu,
        mfu=mfu,
        time_source=source,
        tokens_per_s=tokens / seconds,
        seconds=seconds,
        gpu_power_w=gpu_power_w,
        pue=pue,
        price_per_gpu_hour=price_per_gpu_hour,
    )


def cost_inputs(
    tokens: str | None, price_per_gpu_hour: float | None, mfu: str | None, pue: float | None
) -> dict[str, Any] | None:
    """The cost flags checked and parsed (before any search, so a typo fails fast), or None without
    `--tokens`; each error names its flag."""
    if tokens is None:
        for flag, value in (("--price-per-gpu-hour", price_per_gpu_hour), ("--mfu", mfu), ("--pue", pue)):
            if value is not None:
                raise UserError(f"{flag}: needs --tokens (the cost is for a token budget)")
        return None
    if price_per_gpu_hour is not None and not (price_per_gpu_hour >= 0 and math.isfinite(price_per_gpu_hour)):
        raise UserError(f"--price-per-gpu-hour: {price_per_gpu_hour:g} must be a non-negative number")
    pue = DEFAULT_PUE if pue is None else pue
    if not 1 <= pue < 10:
        raise UserError(f"--pue: {pue:g} must be in [1, 10): facility energy over IT energy, e.g. 1.1")
    return {
        "tokens": parse_tokens(tokens),
        "mfu": None if mfu is None else parse_mfu(mfu),
        "pue": pue,
        "price_per_gpu_hour": price_per_gpu_hour,
    }


def plan_training_cost(inputs: dict[str, Any], model: Any, cluster: Any, best: Any) -> dict[str, Any]:
    """The `training` block of a plan: time, GPU-hours, energy and cost of the token budget on its best
    layout (`best`, a planner candidate with its estimate)."""
    from toolkit.plan.cost.flops import matmul_params

    cost = training_cost(
        flops_per_token=best.estimate.model_flops_per_token,
        n_params=matmul_params(model),
        gpus=best.layout.world_size,
        peak_flops_per_gpu=best.estimate.peak_flops,
        plan_tokens_per_s=best.estimate.tokens_per_s,
        gpu_power_w=cluster.gpu_power_w,
        **inputs,
    )
    return cost.to_dict()


class CostRequest(BaseModel):
    """What `dstk plan` is asked to cost (its `--tokens`, `--price-per-gpu-hour`, `--mfu` and `--pue`), as
    written; `cost_inputs` checks and parses it."""

    model_config = ConfigDict(extra="forbid")

    tokens: str | None = Field(
        None,
        description="training tokens (300e9, 3e11, 300B, 1.5T): adds time to train, GPU-hours, energy and cost",
    )
    price_per_gpu_hour: float | None = Field(
        None, description="price of one GPU-hour, for the cost (any currency)"
    )
    mfu: str | None = Field(
        None,
        description="take the time from this model FLOPs utilisation (0.45 or 45%), in the convention of the "
        "plan's own MFU: (6·N + 12·L·H·Q·T)·D / (GPUs · peak · MFU), instead of from the plan's predicted tokens/s",
    )
    pue: float | None = Field(
        None,
        description="datacenter power usage effectiveness for the energy (default 1.1, Patterson et al. 2021)",
    )
