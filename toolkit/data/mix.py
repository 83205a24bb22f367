"""Domain mixture: which documents of each domain enter training, so that token shares follow the weights.

Only downsampling, never repetition, so no token is seen twice per epoch: with weights w_d and available
tokens n_d, the total is T = min_d n_d / w_d (the domain that runs out first sets it) and domain d keeps its
documents in a seeded random order until it has w_d·T tokens. The realised shares then miss the weights by
at most one document per domain.

Weights come from `--mix web=0.6,code=0.3,...` (normalised to sum to 1), or from a temperature: w_d ∝
n_d^(1/T), the exponentiated sampling of XLM (Conneau & Lample 2019, §3.1: α = 1/T = 0.5) and mT5 (Xue et
al. 2021: α = 0.3), which flattens a long-tailed mix towards small domains. T = 1 keeps the natural
proportions (nothing dropped); T → ∞ approaches equal shares. Those papers reach the target by repeating
small languages; here the large domains are cut instead.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from toolkit.errors import UserError

_EXAMPLE = "e.g. --mix web=0.6,code=0.3,books=0.1"


def parse_mix(spec: str) -> dict[str, float]:
    """`name=weight,...` → weights normalised to sum to 1; a malformed spec is a UserError naming --mix."""
    weights: dict[str, float] = {}
    for part in spec.split(","):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name:
            raise UserError(f"--mix: {part.strip()!r} is not DOMAIN=WEIGHT ({_EXAMPLE})")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight <= 0:
            raise UserError(
                f"--mix: the weight of {name} must be a positive number, got {value!r} ({_EXAMPLE})"
            )
        if name in weights:
            raise UserError(f"--mix: domain {name} is given twice")
        weights[name] = weight
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}


def temperature_weights(tokens: dict[str, int], temperature: float) -> dict[str, float]:
    """w_d ∝ n_d^(1/T) (XLM, mT5); T = 1 gives the natural shares."""
    if temperature <= 0:
        raise UserError(f"--temperature: {temperature} must be positive")
    raw = {d: n ** (1 / temperature) if n else 0.0 for d, n in tokens.items()}
    total = sum(raw.values())
    return {d: r / total for d, r in raw.items()} if total else dict.fromkeys(tokens, 0.0)


def check_mix(mix: dict[str, float] | None, available: dict[str, int]) -> None:
    """Every domain named in `mix` must have something left (`available`: documents or tokens per domain)."""
    if mix is None:
        return
    unknown = sorted(set(mix) - set(available))
    if unknown:
        raise UserError(
            f"--mix: unknown domain {unknown[0]!r}; the input has {', '.join(sorted(available)) or 'no documents'}"
        )
    empty = sorted(d for d in mix if not available[d])
    if empty:
        raise UserError(f"--mix: domain {empty[0]!r} has no documents left after filtering")


def mixture_weights(
    tokens: dict[str, int], mix: dict[str, float] | None, temperature: float
) -> dict[str, float]:
    """The weight of every domain in `tokens` (available tokens after filtering); a domain missing from
    `mix` gets weight 0 (its documents are left out)."""
    if mix is None:
        return temperature_weights(tokens, temperature)
    check_mix(mix, tokens)
    return {d: mix.get(d, 0.0) for d in tokens}


def token_budgets(tokens: dict[str, int], weights: dict[str, float]) -> dict[str, float]:
    """Tokens to keep per domain: w_d · min_e(n_e / w_e). A domain whose budget reaches its available tokens
    (up to float rounding: with natural weights every domain is the limit) keeps all of them."""
    ratios = [tokens[d] / w for d, w in weights.items() if w > 0]
    if not ratios:
        return dict.fromkeys(tokens, 0.0)
    total = min(ratios)
    budgets = {d: total * weights.get(d, 0.0) for d in tokens}
    return {d: float(tokens[d]) if b >= tokens[d] * (1 - 1e-9) else b for d, b in budgets.items()}


def select(
    domain_ids: np.ndarray, lengths: np.ndarray, names: list[str], budgets: dict[str, float], seed: int
) -> np.ndarray:
    """Boolean mask over documents: each domain's documents in a seeded random order, taken while the
    domain's running token count stays within its budget."""
    keep = np.zeros(len(domain_ids), dtype=bool)
    for k, name in enumerate(names):
        idx = np.flatnonzero(domain_ids == k)
        budget = budgets.get(name, 0.0)
        if lengths[idx].sum() <= budget:
            keep[idx] = True
            continue
        order = np.random.default_rng([seed, zlib.crc32(name.encode())]).permutation(idx)
        taken = np.searchsorted(np.cumsum(lengths[order]), budget, side="right")
        keep[order[:taken]] = True
    return keep


def shares(tokens: dict[str, int]) -> dict[str, float]:
    total = sum(tokens.values())
    return {d: (n / total if total else 0.0) for d, n in tokens.items()}
