"""No import cycles among autoplan's modules.

The import graph is read with ``ast`` from ``autoplan/**/*.py`` (no module is imported):
an edge ``a -> b`` for each ``import b`` / ``from b import x`` / ``from . import b`` in
``a``. Two graphs are checked:

- module-level imports (those at the top of a module, in top-level ``if``/``try``/``with``
  blocks, ``if TYPE_CHECKING:`` left out): a cycle there makes what a module sees at
  import time depend on which module was imported first;
- every import, those inside functions included: a deferred import that closes a cycle
  hides a dependency both ways (``dtensor.strategies`` <-> ``dtensor.loss_parallel`` did,
  through ``Strategy``), and the fix is to move the shared piece, not to defer.

A failure names one cycle, module by module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "autoplan"


def module_files(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level_imports(body: list[ast.stmt]):
    """The import statements that run when the module is imported."""
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        elif isinstance(statement, ast.If):
            if not _is_type_checking(statement.test):
                yield from module_level_imports(statement.body)
            yield from module_level_imports(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, *(h.body for h in statement.handlers), statement.orelse, statement.finalbody):
                yield from module_level_imports(block)
        elif isinstance(statement, ast.With):
            yield from module_level_imports(statement.body)


def every_import(tree: ast.Module):
    """Every import statement, those inside functions and classes included."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph(modules: dict[str, tuple[Path, bool]], deferred: bool) -> dict[str, set[str]]:
    """Module -> the autoplan modules it imports (module-level only unless ``deferred``)."""
    graph = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        statements = every_import(tree) if deferred else module_level_imports(tree.body)
        targets = set()
        for statement in statements:
            if isinstance(statement, ast.Import):
                targets.update(alias.name for alias in statement.names if alias.name in modules)
                continue
            base = statement.module or ""
            if statement.level:  # relative: from the module's own package, up level - 1
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(statement.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in statement.names:
                if f"{base}.{alias.name}" in modules:  # from package import submodule
                    targets.add(f"{base}.{alias.name}")
                elif base in modules:
                    targets.add(base)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None: depth-first, in sorted order (the same
    cycle reported every run)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


@pytest.mark.parametrize("deferred", [False, True], ids=["module-level imports", "every import"])
def test_autoplan_has_no_import_cycle(deferred):
    modules = module_files()
    assert "autoplan.dtensor.strategies" in modules and "autoplan.pipeline.problem" in modules  # the walk found the package
    graph = import_graph(modules, deferred)
    assert graph["autoplan.dtensor.strategies"] >= {"autoplan.dtensor.loss_parallel", "autoplan.dtensor.strategy"}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_and_named(tmp_path):
    """The checker itself: a planted cycle through a deferred, relative import is reported,
    and only when deferred imports are counted."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from .a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import a\n")
    modules = module_files(package)
    assert find_cycle(import_graph(modules, deferred=False)) is None
    assert find_cycle(import_graph(modules, deferred=True)) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]
    (package / "sub" / "b.py").write_text("import pkg.c\n")
    (package / "c.py").write_text("try:\n    from pkg.sub.a import y\nexcept ImportError:\n    pass\n")
    assert find_cycle(import_graph(modules, deferred=False)) == ["pkg.c", "pkg.sub.a", "pkg.sub.b", "pkg.c"]
