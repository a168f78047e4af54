"""The package's import graph has no cycle (issue 17: one job per module, commands registered explicitly), and its
packages follow the processes (issue 42, docs/architecture.md): server and worker never import each other, neither
imports the CLI, the protocol imports nothing of AWP.

Every ``import awp.x`` / ``from awp.x import …`` / ``from awp import x`` counts, also the ones inside functions:
a lazy import hides a cycle from Python's loader, not from the reader."""

from __future__ import annotations

import ast
from pathlib import Path

import awp_testing.mutate
from awp_testing.importgraph import PACKAGE, import_graph, mermaid, module_name, package_of


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_awp_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert {"awp.cli.main", "awp.server.gateway", "awp.server.app", "awp.cli.terminal"} <= set(
        graph
    )  # the walk sees the package
    assert "awp.cli.user" in graph["awp.cli.main"]  # and the edges: cli registers the command modules
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def kit_imports(path: Path) -> list[str]:
    """The imports of the test kit (``awp_testing`` or one of its modules) in ``path``, also inside functions."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return [name for name in found if name.partition(".")[0] == "awp_testing"]


def test_the_runtime_does_not_import_the_test_kit(tmp_path: Path) -> None:
    """awp_testing (throwaway clusters, ``awp serve`` processes, mutate, sqldoc) serves the tests, the benchmarks
    and the developer; the awp package never depends on it (issue 17)."""
    offenders = {module_name(p): found for p in sorted(PACKAGE.rglob("*.py")) if (found := kit_imports(p))}
    assert offenders == {}
    # the check sees the kit's imports, lazy ones too
    assert kit_imports(Path(awp_testing.mutate.__file__)) == ["awp_testing.cluster"]
    probe = tmp_path / "probe.py"
    probe.write_text("import awp_testing.gateway as gw\n\n\ndef f():\n    from awp_testing import cluster\n")
    assert kit_imports(probe) == ["awp_testing.gateway", "awp_testing"]


# Which package may import which (docs/architecture.md, Packages). A top-level module (handlers, eventloop,
# logsafe) is its own "package". The CLI may import everything.
ALLOWED = {
    "protocol": set(),
    "dev": {"logsafe"},
    "server": {"protocol", "eventloop", "logsafe"},
    "worker": {"protocol", "eventloop", "logsafe", "handlers"},
    "handlers": set(),
    "eventloop": set(),
    "logsafe": set(),
    "__main__": {"cli"},
}


def forbidden_edges(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {dep}"
        for module, deps in graph.items()
        for dep in deps
        if package_of(module) != "cli"
        and package_of(dep) != package_of(module)
        and package_of(dep) not in ALLOWED[package_of(module)]
    )


def test_each_package_imports_only_what_its_process_needs() -> None:
    graph = import_graph()
    packages = set(map(package_of, graph))
    assert {"protocol", "server", "worker", "cli", "dev"} <= packages <= {*ALLOWED, "cli", "awp"}
    assert forbidden_edges(graph) == []
    # the rule sees an edge that breaks it
    assert forbidden_edges({"awp.worker.runtime": {"awp.server.parsing"}}) == [
        "awp.worker.runtime -> awp.server.parsing"
    ]


def test_the_package_root_holds_few_files_and_no_module_is_long() -> None:
    root_files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_files) <= 8, root_files
    # the package, the test kit, the tests and the benchmarks
    repo = PACKAGE.parents[1]
    files = [p for top in ("python", "benchmarks") for p in (repo / top).rglob("*.py")]
    assert len(files) > 150
    long = {str(p.relative_to(repo)): n for p in files if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_the_architecture_page_shows_the_import_graph_of_the_code() -> None:
    page = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    assert mermaid(import_graph()) in page, "regenerate it: python -m awp_testing.importgraph"
