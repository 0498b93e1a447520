"""The client pool's modules, read from the source: one class over parts that never
import it back, and no import cycle among them.

Every import counts, one under ``TYPE_CHECKING`` or inside a function too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import orbitive.clients

PACKAGE = Path(orbitive.clients.__file__).parent
#: The modules that may build a ClientPool: the package's face, the adapters, and the
#: transaction mode's router of a key (it pools its server connections in one).
FACES = {"__init__", "psycopg", "sqlalchemy", "asyncpg", "_transaction"}


def imports_within_clients() -> dict[str, set[str]]:
    """Each module of ``orbitive.clients`` and the modules of the package it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    found.update([node.module] if node.module else [a.name for a in node.names])
                elif node.level == 0 and (node.module or "").startswith("orbitive.clients."):
                    found.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                found.update(
                    alias.name.split(".")[2]
                    for alias in node.names
                    if alias.name.startswith("orbitive.clients.")
                )
        graph[path.stem] = found
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (a path back to its start), or none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return []
        for target in sorted(graph.get(module, ())):
            if found := visit(target, [*path, module]):
                return found
        done.add(module)
        return []

    for module in sorted(graph):
        if found := visit(module, []):
            return found
    return []


def test_only_the_face_and_the_adapters_import_the_client_pool() -> None:
    graph = imports_within_clients()
    assert "_client_pool" in graph
    importers = {module for module, targets in graph.items() if "_client_pool" in targets}
    assert importers <= FACES, importers - FACES


def test_the_client_pools_modules_import_each_other_without_a_cycle() -> None:
    graph = imports_within_clients()
    assert len(graph) >= 10  # the whole package was read
    assert cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
