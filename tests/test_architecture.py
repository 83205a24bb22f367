"""The package's shape, checked statically (docs/ARCHITECTURE.md): the pure folders (plan, host,
integrations, report, launcher) reach neither the run folders nor a heavy package at any depth — imports inside functions
included, the one named exception being `integrations/validate.py`'s lazy DeepSpeed import — no import cycle
inside `toolkit`, and only entry points at the top level. Each check is a function of a source tree, so the
tests also show that a planted violation fails. Per-architecture facts have one owner too: the table in
`plan/architectures.py`; nothing else branches on an architecture's name (`hf_config.py`, which translates
HF's per-family config keys, excepted)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

TOOLKIT = Path(__file__).resolve().parents[1] / "toolkit"
PURE = ("plan", "host", "integrations", "report", "launcher")
RUN = ("run", "parallel", "data", "commands")
HEAVY = {
    "torch",
    "deepspeed",
    "transformers",
    "peft",
    "datasets",
    "numpy",
    "tokenizers",
    "accelerate",
    "datasketch",
    "datatrove",
}
# module -> heavy packages it may import lazily: DeepSpeed's own config classes judge a config (they import torch,
# and DeepSpeed accepts torch.optim names), so validation is the one pure module that loads them, inside functions
EXCEPTIONS = {"toolkit.integrations.validate": {"deepspeed", "torch"}}
TOP_LEVEL = {"__init__.py", "__main__.py", "cli.py", "errors.py", "paths.py", "demo.py"}
MAX_LINES = 420


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, name: str, known: set[str]) -> tuple[set[str], set[str]]:
    """(toolkit modules, top-level external packages) that `path` imports anywhere in its code, under
    `if TYPE_CHECKING:` excepted (never executed)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    internal, external = set(), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "toolkit":
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    internal.add(target)
            else:
                external.add(target.split(".")[0])
    return internal, external


def graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = modules(root)
    edges, heavy = {}, {}
    for name, path in mods.items():
        internal, external = imports(path, name, set(mods))
        edges[name] = internal
        heavy[name] = external & HEAVY
    return edges, heavy


def boundary_violations(root: Path) -> list[str]:
    """Every path from a pure module to a run-folder module or a heavy package."""
    edges, heavy = graph(root)
    problems = []
    for start in sorted(m for m in edges if m.split(".")[1:2] and m.split(".")[1] in PURE):
        seen, stack = {start: [start]}, [start]
        while stack:
            mod = stack.pop()
            chain = seen[mod]
            if mod.split(".")[1:2] and mod.split(".")[1] in RUN:
                problems.append(f"{' → '.join(chain)} (a run folder)")
                continue
            bad = heavy[mod] - EXCEPTIONS.get(mod, set())
            if bad:
                problems.append(f"{' → '.join(chain)} imports {', '.join(sorted(bad))}")
            for nxt in sorted(edges[mod]):
                if nxt not in seen:
                    seen[nxt] = [*chain, nxt]
                    stack.append(nxt)
    return sorted(set(problems))


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    edges, _ = graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


# Where work sits (docs/ARCHITECTURE.md): a verb parses, calls one library function and prints, so it imports
# neither another verb nor the CLI that lists the verbs; the planner
# reads descriptions and never the machine (toolkit/host); rendering never re-plans. (`dstk launch` judges
# `dstk train`'s arguments with the same flags, which live in toolkit/run/train_flags.py for both.)
VERB_IMPORT_EXCEPTIONS: set[tuple[str, str]] = set()
PLANNER_MODULES = {"toolkit.plan.planner", "toolkit.plan.scaling", "toolkit.plan.elastic"}


def verb_modules(root: Path) -> set[str]:
    """The modules that `commands/__init__.py`'s VERBS table registers, read from its source."""
    tree = ast.parse((root / "commands" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "VERBS":
            table = ast.literal_eval(node.value)
            return {f"toolkit.commands.{module}" for module, _ in table.values()}
    raise AssertionError("commands/__init__.py has no VERBS table")


def placement_violations(root: Path) -> list[str]:
    """Imports that put work in the wrong room: verb → verb, verb → toolkit.cli, plan → host (detection),
    report → the planner."""
    edges, _ = graph(root)
    verbs = verb_modules(root)
    problems = []
    for mod, targets in sorted(edges.items()):
        for target in sorted(targets):
            if mod in verbs and target in verbs and (mod, target) not in VERB_IMPORT_EXCEPTIONS:
                problems.append(f"{mod} imports the verb {target}")
            elif mod in verbs and target == "toolkit.cli":
                problems.append(f"{mod} imports toolkit.cli")
            elif mod.startswith("toolkit.plan") and target.startswith("toolkit.host"):
                problems.append(f"{mod} imports {target} (detection)")
            elif mod.startswith("toolkit.report") and target in PLANNER_MODULES:
                problems.append(f"{mod} imports {target} (the planner)")
    return problems


ARCHITECTURE_NAME_READERS = {"plan/architectures.py", "plan/hf_config.py"}


def architecture_branches(tree: Path) -> list[str]:
    """`file:line` of every comparison of an `.architecture` attribute with a string or tuple of strings."""

    def names_architecture(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "architecture"

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and all(literal(e) for e in node.elts)

    found = []
    for path in sorted(tree.rglob("*.py")):
        rel = str(path.relative_to(tree))
        if rel in ARCHITECTURE_NAME_READERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(names_architecture(x) for x in sides) and any(literal(x) for x in sides):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_per_architecture_facts_live_in_one_table() -> None:
    assert architecture_branches(TOOLKIT) == []


def test_pure_folders_reach_no_run_folder_and_no_heavy_package() -> None:
    assert boundary_violations(TOOLKIT) == []


def test_work_sits_in_its_own_room() -> None:
    assert placement_violations(TOOLKIT) == []


def test_no_import_cycle_inside_toolkit() -> None:
    assert cycles(TOOLKIT) == []


def test_the_top_level_holds_entry_points_only_and_folders_say_what_they_are_for() -> None:
    assert {p.name for p in TOOLKIT.glob("*.py")} <= TOP_LEVEL
    for folder in (p for p in TOOLKIT.iterdir() if p.is_dir() and p.name != "__pycache__"):
        init = folder / "__init__.py"
        if init.exists() and folder.name != "presets":
            assert ast.get_docstring(ast.parse(init.read_text())), (
                f"{folder.name}/__init__.py has no purpose line"
            )


def test_no_module_is_a_room_of_its_own() -> None:
    long = {
        str(p.relative_to(TOOLKIT)): n
        for p in TOOLKIT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize(
    "module,line,expected",
    [
        ("plan/planner.py", "import torch", "toolkit.plan.planner imports torch"),
        (
            "report/charts.py",
            "from toolkit.run import loop",
            "toolkit.report.charts → toolkit.run.loop (a run folder)",
        ),
        ("plan/specs.py", "from toolkit.plan.layout import Layout", "cycle"),
        ("run/models.py", "x = model.architecture in ('gpt2', 'bloom')", "branch"),
        (
            "commands/plan.py",
            "from toolkit.commands.estimate import run",
            "imports the verb toolkit.commands.estimate",
        ),
        (
            "commands/launch.py",
            "from toolkit.cli import build_parser",
            "toolkit.commands.launch imports toolkit.cli",
        ),
        (
            "plan/planner.py",
            "from toolkit.host.local import detect",
            "imports toolkit.host.local (detection)",
        ),
        ("report/render.py", "from toolkit.plan.scaling import scaling_rows", "(the planner)"),
    ],
)
def test_a_planted_violation_fails_the_checks(tmp_path, module, line, expected) -> None:
    tree = tmp_path / "toolkit"
    shutil.copytree(TOOLKIT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    target = tree / module
    # an import inside a function, where a module-level check would not look
    target.write_text(target.read_text() + f"\n\ndef _planted() -> None:\n    {line}\n")
    if expected == "cycle":
        assert any("toolkit.plan.specs" in c for c in cycles(tree))
    elif any(k in expected for k in ("the verb", "imports toolkit.cli", "(detection)", "(the planner)")):
        assert placement_violations(TOOLKIT) == []
        assert [p for p in placement_violations(tree) if expected in p] != [], placement_violations(tree)
    elif expected == "branch":
        assert [b.split(":")[0] for b in architecture_branches(tree)] == [module]
    else:
        assert any(p.endswith(expected) for p in boundary_violations(tree)), boundary_violations(tree)
