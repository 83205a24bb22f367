"""A small synthetic corpus, generated (never downloaded), with learnable structure in three domains.

The demo and the tests need text whose loss falls visibly within ~100 steps of a few-million-parameter model:
templated sentences over a small vocabulary (facts about towns, small Python functions, a recurring story)
have that property, and a seeded generator makes every run identical.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOWNS = ["Arden", "Bexley", "Corfe", "Dunmore", "Elgin", "Fenwick", "Garth", "Hollin", "Ivel", "Jarrow"]
THINGS = ["parks", "bridges", "schools", "markets", "libraries", "mills", "wells", "towers"]
NAMES = ["Ada", "Bram", "Cora", "Dane", "Edda", "Finn", "Gwen", "Hugo"]
ACTIONS = ["walked to", "wrote a letter to", "sailed past", "painted", "visited", "remembered"]
OPS = [("add", "+"), ("sub", "-"), ("mul", "*"), ("max_of", "max")]


def _web(rng: random.Random) -> str:
    town, thing = rng.choice(TOWNS), rng.choice(THINGS)
    n, m = rng.randint(2, 40), rng.randint(100, 9000)
    facts = [
        f"It was founded in {rng.randint(1100, 1900)}.",
        f"The mayor is {rng.choice(NAMES)}, elected in {rng.randint(1990, 2024)}.",
        f"The nearest town is {rng.choice(TOWNS)}, {rng.randint(2, 90)} miles away.",
        f"Its market opens on day {rng.randint(1, 28)} of every month.",
    ]
    return (
        f"The town of {town} has {n} {thing} and about {m} people. {rng.choice(facts)} Visitors to {town} "
        f"often count the {thing}: there are {n} of them. {rng.choice(facts)} The population of {town} is {m}."
    )


def _code(rng: random.Random) -> str:
    name, op = rng.choice(OPS)
    a, b = rng.choice("xyzab"), rng.choice("uvwcd")
    body = f"max({a}, {b})" if op == "max" else f"{a} {op} {b}"
    # bounds, names and labels drawn per document: 100 functions used in ~10⁷ ways, so the corpus survives
    # the default deduplication (exact, then near) the way a real code corpus would, not as 100 repeated snippets
    n, k, acc = rng.randint(2, 99), rng.randint(0, 99), rng.choice(["total", "acc", "out", "result", "s"])
    label = rng.choice(["sum", "value", "answer", "got", "result is"])
    return (
        f"def {name}_{a}{b}({a}, {b}):\n    return {body}\n\n\n{acc} = {rng.randint(0, 9)}\n"
        f'for i in range({n}):\n    {acc} += {name}_{a}{b}(i, {k})\nprint("{label}", {acc})\n'
    )


def _books(rng: random.Random) -> str:
    who, other = rng.sample(NAMES, 2)
    lines = [f"{who} {rng.choice(ACTIONS)} {rng.choice(TOWNS)}." for _ in range(rng.randint(2, 5))]
    return (
        f"Chapter {rng.randint(1, 30)}. " + " ".join(lines) + f" Then {who} met {other}, and they went home."
    )


GENERATORS = {"web": _web, "code": _code, "books": _books}


def write_corpus(out_dir: Path, docs_per_domain: int = 2000, seed: int = 0) -> list[Path]:
    """One JSONL file per domain (`{"text": ...}` per line); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (domain, make) in enumerate(GENERATORS.items()):
        rng = random.Random(seed * 1000 + i)
        path = out_dir / f"{domain}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for _ in range(docs_per_domain):
                f.write(json.dumps({"text": make(rng)}) + "\n")
        paths.append(path)
    return paths
