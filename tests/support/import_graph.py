"""The import graph of Python packages, read from their source with ``ast`` (nothing is
imported): which module imports which, and the third-party packages each one imports.

Every import statement counts: at module level, inside a function, and under
``if TYPE_CHECKING:``, since an import moved into a function or a type-only block still ties
the two modules together. A package's ``__init__`` is not counted as a dependency of its
submodules: Python runs it first, but the submodule's code does not use it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ImportGraph:
    # Module name -> its source file.
    modules: dict[str, Path] = field(default_factory=dict)
    # Module name -> the modules of the graph it imports.
    edges: dict[str, set[str]] = field(default_factory=dict)
    # Module name -> the top-level names of the other packages it imports (redis, flask, ...).
    external: dict[str, set[str]] = field(default_factory=dict)

    def reach(self, module: str) -> set[str]:
        """Every module ``module`` imports, directly or through others."""
        seen: set[str] = set()
        todo = [module]
        while todo:
            for imported in self.edges[todo.pop()]:
                if imported not in seen:
                    seen.add(imported)
                    todo.append(imported)
        seen.discard(module)
        return seen

    def path(self, start: str, goal: str) -> list[str]:
        """One chain of imports from ``start`` to ``goal`` (for a failure's message)."""
        came_from: dict[str, str] = {}
        todo = [start]
        while todo:
            current = todo.pop(0)
            for imported in sorted(self.edges[current]):
                if imported not in came_from and imported != start:
                    came_from[imported] = current
                    todo.append(imported)
        if goal not in came_from:
            return []
        chain = [goal]
        while chain[-1] != start:
            chain.append(came_from[chain[-1]])
        return chain[::-1]

    def cycles(self) -> list[list[str]]:
        """Each set of modules that import one another round a circle (Tarjan's strongly
        connected components of more than one module)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def visit(module: str) -> None:
            index[module] = low[module] = len(index)
            stack.append(module)
            on_stack.add(module)
            for imported in sorted(self.edges[module]):
                if imported not in index:
                    visit(imported)
                    low[module] = min(low[module], low[imported])
                elif imported in on_stack:
                    low[module] = min(low[module], index[imported])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 10 * len(self.modules) + 100))
        try:
            for module in sorted(self.modules):
                if module not in index:
                    visit(module)
        finally:
            sys.setrecursionlimit(limit)
        return sorted(found)


def build(packages: Mapping[str, Path]) -> ImportGraph:
    """The graph of the named packages: ``{"app": Path("app"), "loom": Path("sdk/loom")}``."""
    graph = ImportGraph()
    for name, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            graph.modules[".".join(parts)] = path
    for module, path in graph.modules.items():
        is_package = path.name == "__init__.py"
        imported: set[str] = set()
        external: set[str] = set()
        for target in _imported_names(ast.parse(path.read_text(), str(path)), module,
                                      is_package):
            owner = _owner(target, graph.modules)
            if owner is not None:
                imported.add(owner)
            elif target.split(".")[0] not in packages:
                external.add(target.split(".")[0])
        imported.discard(module)
        graph.edges[module] = imported
        graph.external[module] = external
    return graph


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """Each dotted name an import statement of ``tree`` may load: for ``from a import b``,
    both ``a.b`` (when b is a module) and ``a``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([node.module] if node.module else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}" if alias.name != "*" else base


def _owner(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module of the graph that ``name`` is, or that defines it (``app.x.f`` -> ``app.x``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None
