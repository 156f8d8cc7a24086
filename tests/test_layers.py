"""The import graph of `bertforge/`, read from the source with `ast` (nothing is imported or executed).

Three rules keep the package's layers pointing one way (ARCHITECTURE.md):

1. **Layers.** tokenization (0) ← modeling (1) ← training (2) ← {pretraining, tasks} (3) ← {serving,
   distillation} (4) ← cli (5). The helpers every layer shares (`_files`, `_checks`, `corpus`, `metrics/`) sit below them
   all and import none of them; `quickstart`, `__main__` and the package root (`bertforge/__init__.py`,
   which re-exports the public API) sit at the cli level. A module may import its own layer and those
   below it, never one above; siblings (pretraining and tasks; serving and distillation) do not import
   each other.
2. **No cycle.** Every import counts, at module top or inside a function, except those guarded by
   `if TYPE_CHECKING:` (never executed, they cannot form a cycle at run time). A `from X import name`
   where `X.name` is a module is an edge to that module; any other `from X import name` is an edge to X
   (a package's `__init__`).
3. **Imports at the top.** An import inside a function (or method) is allowed only for an optional
   extra (onnx, onnxruntime, starlette/uvicorn, matplotlib, ...), and the statement's line then carries
   the comment `# optional extra`.

Each failure lists every violation as `module:line -> target`, grouped by the package of the importing
module, so that each package's owner sees theirs: the layer and top-level checks run once per package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bertforge"
OPTIONAL_MARK = "# optional extra"

# The layer of each module, by its first name under `bertforge` ("" for the package root).
LAYERS = {
    "_files": -1, "_checks": -1, "corpus": -1, "metrics": -1,
    "tokenization": 0,
    "modeling": 1,
    "training": 2,
    "pretraining": 3, "tasks": 3,
    "serving": 4, "distillation": 4,
    "cli": 5, "quickstart": 5, "reproduce": 5, "__main__": 5, "": 5,
}
SIBLINGS = {frozenset({"pretraining", "tasks"}), frozenset({"serving", "distillation"})}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted ("bertforge.training.loop")
    line: int
    target: str  # the imported module, dotted; for an outside import, its top-level name
    internal: bool  # the target is a bertforge module
    in_function: bool
    type_checking: bool
    marked: bool  # the statement carries `# optional extra`


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Every module under `root` by dotted name (a package by its name, for its `__init__.py`)."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(root: Path = PACKAGE) -> list[Import]:
    """Every import statement under `root`, resolved to the modules it names."""
    known = modules(root)
    found: list[Import] = []
    for name, path in known.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True, type_checking)
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    for item in child.body:
                        visit_one(item, in_function, True)
                    for item in child.orelse:
                        visit_one(item, in_function, type_checking)
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    record(child, in_function, type_checking)
                else:
                    visit(child, in_function, type_checking)

        def visit_one(node: ast.AST, in_function: bool, type_checking: bool) -> None:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                record(node, in_function, type_checking)
            else:
                visit(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)), type_checking)

        def record(node: ast.Import | ast.ImportFrom, in_function: bool, type_checking: bool) -> None:
            text = "\n".join(lines[node.lineno - 1: (node.end_lineno or node.lineno)])
            marked = OPTIONAL_MARK in text
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    package = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{node.module}" if node.module else package
                else:
                    base = node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for target in dict.fromkeys(targets):
                internal = target == "bertforge" or target.startswith("bertforge.")
                if internal:
                    while target not in known and "." in target:  # `import bertforge.x.y` of a name
                        target = target.rpartition(".")[0]
                else:
                    target = target.split(".")[0]
                found.append(Import(name, node.lineno, target, internal, in_function, type_checking, marked))

        visit(ast.parse(source, filename=str(path)), False, False)
    return found


def top_name(module: str) -> str:
    """`bertforge.training.loop` -> "training"; the package root -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer(module: str) -> int:
    top = top_name(module)
    if top not in LAYERS:
        raise KeyError(f"{module}: no layer for {top!r}; add it to LAYERS in tests/test_layers.py")
    return LAYERS[top]


def layer_violations(found: list[Import]) -> list[Import]:
    """Imports that point up the layers (or across between the siblings pretraining and tasks)."""
    bad = []
    for item in found:
        if not item.internal or item.type_checking:
            continue
        source, target = top_name(item.source), top_name(item.target)
        if layer(item.target) > layer(item.source) or (
                source != target and frozenset({source, target}) in SIBLINGS):
            bad.append(item)
    return bad


def function_import_violations(found: list[Import]) -> list[Import]:
    """Imports inside a function that do not carry `# optional extra`."""
    return [item for item in found if item.in_function and not item.marked]


def cycles(found: list[Import]) -> list[list[str]]:
    """The import cycles among bertforge's modules: one shortest cycle per strongly connected component."""
    graph: dict[str, set[str]] = {}
    for item in found:
        if item.internal and not item.type_checking and item.target != item.source:
            graph.setdefault(item.source, set()).add(item.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the graph is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    result = []
    for component in components:
        members = set(component)
        start = component[0]
        # Breadth-first from `start` back to itself within the component: the shortest cycle through it.
        paths = {start: [start]}
        queue = [start]
        cycle = None
        while queue and cycle is None:
            node = queue.pop(0)
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    cycle = paths[node] + [start]
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        result.append(cycle or component)
    return result


def report(items: list[Import], what: str) -> str:
    groups: dict[str, list[str]] = {}
    for item in sorted(items, key=lambda i: (i.source, i.line)):
        groups.setdefault(top_name(item.source) or "bertforge", []).append(
            f"  {item.source}:{item.line} -> {item.target}")
    return f"{len(items)} {what}:\n" + "\n".join(
        f"{package}:\n" + "\n".join(lines) for package, lines in sorted(groups.items()))


ALL_IMPORTS = imports()
PACKAGES = sorted({top_name(m) or "bertforge" for m in modules()})


def _of(package: str, items: list[Import]) -> list[Import]:
    return [i for i in items if (top_name(i.source) or "bertforge") == package]


def test_every_module_has_a_layer():
    missing = sorted({top_name(m) for m in modules()} - set(LAYERS))
    assert not missing, f"no layer in tests/test_layers.py for: {missing}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down_the_layers(package):
    bad = _of(package, layer_violations(ALL_IMPORTS))
    assert not bad, report(bad, "imports from a higher layer (tokenization 0 < modeling 1 < training 2 < "
                                "pretraining, tasks 3 < serving, distillation 4 < cli 5; helpers below all)")


def test_no_import_cycle():
    found = cycles(ALL_IMPORTS)
    assert not found, f"{len(found)} import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_at_module_top(package):
    bad = _of(package, function_import_violations(ALL_IMPORTS))
    assert not bad, report(bad, f"imports inside a function without {OPTIONAL_MARK!r}")


# -- the checker itself, on a small made-up package -------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "bertforge"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_checker_finds_each_kind_of_violation(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "modeling/__init__.py": "from .bert import Model\n",
        "modeling/bert.py": "from ..training.loop import Trainer\n",
        "training/__init__.py": "",
        "training/loop.py": ("from typing import TYPE_CHECKING\n"
                             "from ..modeling import Model\n"
                             "if TYPE_CHECKING:\n    from ..tasks import glue\n"
                             "def f():\n    import json\n    import onnx  # optional extra\n"),
        "tasks/__init__.py": "",
        "tasks/glue.py": "from ..pretraining import x\n",
        "pretraining/__init__.py": "x = 1\n",
    })
    found = imports(root)
    up = {(i.source, i.target) for i in layer_violations(found)}
    assert up == {("bertforge.modeling.bert", "bertforge.training.loop"),
                  ("bertforge.tasks.glue", "bertforge.pretraining")}  # TYPE_CHECKING-only: not counted
    assert [(i.source, i.line, i.target) for i in function_import_violations(found)] == [
        ("bertforge.training.loop", 6, "json")]
    assert cycles(found) == [["bertforge.modeling", "bertforge.modeling.bert", "bertforge.training.loop",
                              "bertforge.modeling"]]
    text = report(layer_violations(found), "up")
    assert "modeling:\n  bertforge.modeling.bert:1 -> bertforge.training.loop" in text


def test_checker_passes_a_clean_package(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "from .serving import pipeline\n",
        "_files.py": "import os\n",
        "tokenization/__init__.py": "from .._files import x\n",
        "modeling/__init__.py": "from ..tokenization import Tok\nfrom . import bert\n",
        "modeling/bert.py": "import torch\n",
        "serving/__init__.py": "from ..modeling import bert\n",
    })
    found = imports(root)
    assert not layer_violations(found) and not function_import_violations(found) and not cycles(found)
    assert ("bertforge.modeling", "bertforge.modeling.bert") in {(i.source, i.target) for i in found}
