"""The package's shape: no import circles among its modules, and no source file over 600 lines.

**The import graph.**  Every ``.py`` under ``src/microspec`` is a node, named by its module (a package's
``__init__.py`` is a node of its own, printed ``pkg.__init__``).  Every import of the package from one module is an
edge — top-level imports and lazy ones inside functions alike, ``import microspec.x``, ``from microspec.x import y``
and relative ``from .x import y`` (resolved against the importing module) — except those under ``if
TYPE_CHECKING:``, which never run.  An import names a module: ``from a.b import c`` is an edge to ``a.b.c`` when that
is a module (``from . import mod`` imports the submodule ``mod``), otherwise to ``a.b`` (a module, or the package's
``__init__`` when ``a.b`` is a package); ``import a.b.c`` is an edge to the longest of ``a.b.c``, ``a.b``, ``a`` that
is a module.  A lazy import is an edge too: deferring an import into a function hides a circle from Python's import
machinery, not from the design.

**Package ``__init__`` modules**, the rule: importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first.

- A package ``__init__`` importing its own submodules is an edge like any other (the ``__init__`` runs them).
- A module's own enclosing packages (``a`` and ``a.b`` for ``a.b.c``) have always begun initialising before the
  module itself runs, so reaching one of them only to get at a sibling module (``from .sibling import x``,
  ``from . import sibling``, ``from a.b.sibling import x``) is no dependency on its ``__init__``: no edge to it.
  Importing a *name defined by* an enclosing package's ``__init__`` (``from . import SomeClass``, ``from a.b import
  SomeClass``) is an edge to that ``__init__``; where the ``__init__`` imports the module (directly or not) the two
  form a circle, and a real one: the name exists only once the ``__init__`` has run past it, and it is running the
  ``__init__`` that imports the module.
- Importing a module of *another* package (``a.x.y`` from ``a.b.c``) runs that package's ``__init__`` (``a.x``) too:
  an edge to it as well as to ``a.x.y``.  (The top package ``microspec`` encloses every module, so its ``__init__``
  is never such a target.)

Circles are the strongly connected components of more than one node (Tarjan's algorithm); the test fails listing
the members of each, with the edges among them.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "microspec"
MAX_LINES = 600


@functools.lru_cache(maxsize=None)
def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) for every ``.py`` of the package."""
    out = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        init = parts[-1] == "__init__"
        if init:
            parts.pop()
        out[".".join(parts)] = (path, init)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, typing: bool = False):
    """Every Import / ImportFrom node, at any depth, outside ``if TYPE_CHECKING:`` bodies (``typing``: inside them
    too)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if not typing and isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)  # the else branch runs
            continue
        stack.extend(ast.iter_child_nodes(node))


def _ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages whose ``__init__`` runs before the module."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports (see the module docstring for the rule); ``typing``: the imports
    under ``if TYPE_CHECKING:`` are edges too (the design's dependencies, which type annotations name)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, init) in modules.items():
        package = name if init else name.rpartition(".")[0]
        own = set(_ancestors(name)) | ({name} if init else set())  # packages already initialising when it runs

        def add(target: str, via_name: bool) -> None:
            """An edge to module ``target``; ``via_name``: a name taken from the package ``target``'s ``__init__``."""
            if target not in modules:
                return
            for pkg in _ancestors(target):  # another package's __init__ runs first
                if pkg not in own and pkg in modules:
                    graph[name].add(pkg)
            if target in own and not via_name:
                return  # reaching an enclosing package only on the way to one of its modules
            if target != name:
                graph[name].add(target)

        def longest_module(dotted: str) -> str | None:
            parts = dotted.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in modules:
                    return ".".join(parts[:i])
            return None

        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path)), typing):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                        target = longest_module(alias.name)
                        if target is not None:
                            add(target, via_name=False)
                continue
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
                if base != PACKAGE and not base.startswith(PACKAGE + "."):
                    continue
            if base not in modules:  # a name imported from a module path that does not exist here
                target = longest_module(base)
                if target is not None:
                    add(target, via_name=False)
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    add(base, via_name=False)  # the package itself (its __init__ runs first)
                    add(sub, via_name=False)
                else:
                    add(base, via_name=modules[base][1])
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
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
                    out.append(sorted(component))
    return out


def cycles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    graph = import_graph() if graph is None else graph
    return sorted(c for c in strongly_connected(graph) if len(c) > 1)


def _label(name: str) -> str:
    return f"{name}.__init__" if _modules()[name][1] else name


def test_graph_rules_on_the_package_itself():
    """Spot checks of the rule: relative, absolute and lazy imports resolve to modules; a sibling import does not
    reach the package ``__init__``; another package's import reaches its ``__init__``."""
    graph = import_graph()
    assert "microspec.vocab.base" in graph["microspec.vocab"]  # an __init__ importing its submodule
    assert "microspec.vocab" not in graph["microspec.vocab.frequency"]  # `from .base import ...`: a sibling only
    assert {"microspec.models.native", "microspec.models"} <= graph["microspec.drafters.eagle"]
    assert "microspec.cli.freq" in graph["microspec.cli"]  # `from . import freq`: the submodule
    assert all(PACKAGE not in targets for targets in graph.values())  # the top package encloses everything


def _described(graph: dict[str, set[str]], found: list[list[str]]) -> str:
    lines = []
    for component in found:
        members = set(component)
        edges = sorted(f"{_label(a)} -> {_label(b)}" for a in component for b in graph[a] if b in members)
        lines.append(f"  {{{', '.join(_label(m) for m in component)}}}\n      " + "\n      ".join(edges))
    return "\n".join(lines)


def test_no_import_circles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, f"{len(found)} import circle(s) among the package's modules:\n" + _described(graph, found)


def test_no_import_circles_counting_type_annotations():
    """The imports under ``if TYPE_CHECKING:`` (the design's dependencies, which type annotations name) form no
    circle either: a helper that takes a whole object of the module using it names an interface instead (the loop's
    ``DraftSource``, the prefill's ``GenerationState``, the builders' ``DraftNetwork``)."""
    graph = import_graph(typing=True)
    found = cycles(graph)
    assert not found, (f"{len(found)} import circle(s) counting the TYPE_CHECKING imports:\n"
                       + _described(graph, found))


def test_no_source_file_over_600_lines():
    long = []
    for name, (path, _) in _modules().items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long.append(f"{path.relative_to(SRC.parent)} ({n} lines)")
    assert not long, f"source files over {MAX_LINES} lines: " + ", ".join(sorted(long))


if __name__ == "__main__":  # print the graph's circles without pytest
    for component in cycles():
        print(", ".join(_label(m) for m in component))
    sys.exit(0)
