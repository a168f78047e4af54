"""The import graph of the ``awp`` package, module by module and package by package (docs/architecture.md,
Packages), read from the source with :mod:`ast`: every ``import awp.x`` / ``from awp.x import …`` /
``from awp import x`` counts, also inside functions (a lazy import hides an edge from Python's loader, not from
the reader).

``python -m awp_testing.importgraph`` prints the package picture of docs/architecture.md (a Mermaid graph);
``--modules`` prints every module's edges. python/tests/unit/test_import_graph.py checks the rules and that the
page shows the picture this prints.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

import awp

PACKAGE = Path(awp.__file__).parent
# The packages by process, in the picture's order, and what each is (docs/architecture.md).
PACKAGES = {
    "cli": "the awp command",
    "dev": "local cluster, migrations",
    "server": "awp serve",
    "worker": "awp worker",
    "handlers": "handlers API",
    "protocol": "wire types and limits",
    "eventloop": "event loop",
    "logsafe": "safe log lines",
}
BEGIN = "<!-- import graph: python -m awp_testing.importgraph -->"
END = "<!-- end of import graph -->"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from awp.server.ui import dag`` imports the submodule awp.server.ui.dag (and runs the package's
            # __init__, which is not an edge of the importer's making); ``from awp.server.ui import setup_ui``
            # imports the package.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [s for s in subs if s in modules] or [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != "awp":
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    """{module: the awp modules it imports}."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {name: imports_of(path, modules) - {name} for name, path in files.items()}


def package_of(module: str) -> str:
    """``awp.server.db`` → ``server``; a module at the package's root is its own package (``awp.handlers`` →
    ``handlers``); ``awp`` itself → ``awp``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, deps in graph.items():
        for dep in deps:
            if package_of(dep) != package_of(module):
                edges.setdefault(package_of(module), set()).add(package_of(dep))
    return edges


def mermaid(graph: dict[str, set[str]]) -> str:
    """The package picture: one box per package (its module count), one arrow per package it imports."""
    counts = Counter(package_of(m) for m in graph if package_of(m) in PACKAGES)
    edges = package_graph(graph)
    lines = [BEGIN, "```mermaid", "flowchart TD"]
    for name, what in PACKAGES.items():
        n = counts[name]
        label = f"awp.{name}<br/>{what}" + (f"<br/>{n} modules" if n > 1 else "")
        lines.append(f'    {name}["{label}"]')
    for name in PACKAGES:
        lines += [f"    {name} --> {dep}" for dep in sorted(edges.get(name, ()), key=list(PACKAGES).index)]
    return "\n".join([*lines, "```", END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", action="store_true", help="every module's edges instead of the picture")
    args = parser.parse_args()
    graph = import_graph()
    if args.modules:
        for module in sorted(graph):
            print(module, "->", " ".join(sorted(graph[module])))
    else:
        print(mermaid(graph))


if __name__ == "__main__":
    main()
