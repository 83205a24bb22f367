"""Published optimisation recipes the generated configs default to (and `dstk plan` shows).

GPT-3 (Brown et al. 2020, Table 2.1 and App. B): AdamW with β1 = 0.9, β2 = 0.95, ε = 1e-8, weight decay 0.1,
gradient clipping at 1.0, linear warm-up over the first 375M tokens, cosine decay to 10 % of the peak rate;
peak learning rate and batch size by model size (below). LLaMA (Touvron et al. 2023, §2.2) uses the same
β's, decay, clipping and a 10 % floor, with 2,000 warm-up steps.
"""

from __future__ import annotations

import bisect
import math

# (parameters, peak learning rate, batch size in tokens): GPT-3 Table 2.1
GPT3_TABLE: tuple[tuple[float, float, float], ...] = (
    (125e6, 6.0e-4, 0.5e6),
    (350e6, 3.0e-4, 0.5e6),
    (760e6, 2.5e-4, 0.5e6),
    (1.3e9, 2.0e-4, 1e6),
    (2.7e9, 1.6e-4, 1e6),
    (6.7e9, 1.2e-4, 2e6),
    (13e9, 1.0e-4, 2e6),
    (175e9, 0.6e-4, 3.2e6),
)
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
GRADIENT_CLIPPING = 1.0
MIN_LR_RATIO = 0.1
WARMUP_TOKENS = 375e6


def _interpolate(n_params: float, column: int) -> float:
    """Log-log interpolation in the GPT-3 table, clamped at its ends."""
    sizes = [row[0] for row in GPT3_TABLE]
    if n_params <= sizes[0]:
        return GPT3_TABLE[0][column]
    if n_params >= sizes[-1]:
        return GPT3_TABLE[-1][column]
    i = bisect.bisect_right(sizes, n_params)
    (n0, *a), (n1, *b) = GPT3_TABLE[i - 1], GPT3_TABLE[i]
    y0, y1 = a[column - 1], b[column - 1]
    w = (math.log(n_params) - math.log(n0)) / (math.log(n1) - math.log(n0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def peak_learning_rate(n_params: float) -> float:
    return _interpolate(n_params, 1)


def batch_tokens(n_params: float) -> float:
    return _interpolate(n_params, 2)


def warmup_steps(tokens_per_step: float, total_steps: int) -> int:
    """GPT-3's 375M warm-up tokens in steps, at most a tenth of the run and at least one step."""
    return max(1, min(math.ceil(WARMUP_TOKENS / tokens_per_step), total_steps // 10 or 1))
