"""The package's layers, read from its own imports: no import circles, no layer importing from a layer above it,
and no package import hidden inside a function (the way circles used to be dodged).

``LAYERS`` is the one place the order is written, bottom first; the README's "Layout" table describes each layer.
A module belongs to the layer named by its first package below ``compressive_transformer`` (``core.models.lm`` is in
``core``); the package's ``__init__`` (the public import paths) stands above every layer. Imports of optional heavy
dependencies may sit inside functions; imports of this package may not.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = "compressive_transformer"
LAYERS = (
    "core",
    "data",
    "runs",
    "inference",
    "training",
    "audio",
    "harness",
    "analysis",
    "agents",
    "experiments",
    "commands",
    "cli",
    "launch",
)
# Modules that import an optional extra at their top: like the extra itself, they may be imported inside a function
# (the command that needs them), so that a user without the extra can run every other command.
OPTIONAL = {
    "compressive_transformer.harness.model": "lm_eval, the [lm-eval] extra",
    "compressive_transformer.agents.train": "gymnasium and torchrl, the [rl] extra",
    "compressive_transformer.agents.evaluate": "gymnasium, the [rl] extra",
    "compressive_transformer.core.kernels.fused_triton": "triton, with CUDA (or the [triton] extra's interpreter)",
}
# Modules that import the package inside a function on purpose: the console entry point imports the command line (torch
# and every command) inside main, so that Ctrl-C during those seconds ends in one line instead of a traceback.
DEFERRED = {"compressive_transformer.launch": "the console entry point"}
ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / PACKAGE


def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__`` named by its package); hidden
    folders (``benchmarks/.venv-peers``, the peers' environment) hold no module of it."""
    files = {}
    for path in sorted(package_dir.rglob("*.py")):
        if any(part.startswith(".") for part in path.relative_to(package_dir).parts):
            continue
        parts = [package, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement may refer to (``from a import b`` is ``a.b`` or ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def imports(files: dict[str, Path], package: str) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the package's modules it imports; and the imports of the package made inside functions."""
    graph: dict[str, set[str]] = defaultdict(set)
    hidden = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _targets(node, module, path.name == "__init__.py"):
                while name and name not in files:  # `from pkg.mod import function` -> pkg.mod
                    name = name.rpartition(".")[0]
                if not name.startswith(package) or name == module:
                    continue
                graph[module].add(name)
                if _enclosing_function(node, parents) and name not in OPTIONAL and module not in DEFERRED:
                    hidden.append(f"{module} (line {node.lineno}) imports {name} inside a function")
                break
    return graph, hidden


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    """The module's floor: its index in :data:`LAYERS`; the package's ``__init__`` stands above all of them."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(LAYERS)
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: belongs to no layer; put it in one of {', '.join(LAYERS)}")
    return LAYERS.index(parts[1])


FILES = module_files(SOURCE, PACKAGE)
GRAPH, HIDDEN = imports(FILES, PACKAGE)


def test_every_module_belongs_to_a_layer() -> None:
    for module in FILES:
        layer_of(module)


def test_no_import_circles() -> None:
    assert circles(GRAPH) == []


def test_no_layer_imports_from_a_layer_above_it() -> None:
    back = [
        f"{module} ({LAYERS[layer_of(module)] if layer_of(module) < len(LAYERS) else 'package'}) imports {target}"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert back == []


def test_no_package_import_is_hidden_in_a_function() -> None:
    assert HIDDEN == []


def test_benchmarks_have_no_import_circles() -> None:
    files = module_files(ROOT / "benchmarks", "benchmarks")
    graph, _ = imports(files, "benchmarks")
    assert circles(graph) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    graph = defaultdict(set, graph)
    assert sorted(circles(graph)) == expected


def test_the_reader_sees_hidden_relative_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "runs").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "runs" / "__init__.py").write_text("")
    (pkg / "runs" / "files.py").write_text("X = 1\n")
    (pkg / "core" / "model.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..runs import files\n"
        "def f():\n    from pkg.runs.files import X\n    import json\n    return X\n"
    )
    graph, hidden = imports(module_files(pkg, "pkg"), "pkg")
    assert graph["pkg.core.model"] == {"pkg.runs.files"}
    assert hidden == ["pkg.core.model (line 5) imports pkg.runs.files inside a function"]
