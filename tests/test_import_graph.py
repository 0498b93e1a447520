"""The import graph of ``src/orbitive``, read from the source: no cycles, twins one way.

Every import counts as an edge, wherever it stands: at module level, under
``if TYPE_CHECKING:`` or inside a function. A cycle means two modules need each
other, whatever the interpreter tolerates at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "orbitive"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package by name; a C module by its ``.pyi`` stub (no edges)."""
    found = {module_name(path): path for path in sorted((SRC / PACKAGE).rglob("*.pyi"))}
    found.update((module_name(path), path) for path in sorted((SRC / PACKAGE).rglob("*.py")))
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The modules of the package that ``name`` (at ``path``) imports, anywhere in it."""
    if path.suffix == ".pyi":
        return
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # "from . import x" names a module x when there is one, else an attribute
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        for target in targets:
            module = target
            while module and module not in known:  # an attribute of a module: its module
                module = module.rpartition(".")[0]
            if module and module != name and module.startswith(PACKAGE):
                yield module


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_every_kind_of_import() -> None:
    edges = graph()
    assert "orbitive.store._engine" in edges["orbitive.store._engine_async"]  # module level
    assert "orbitive.store._postgres" in edges["orbitive.store._url"]  # inside a function


def test_src_has_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_cycle_is_found_when_there_is_one() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


def test_async_twins_import_their_sync_twins_never_the_reverse() -> None:
    edges = graph()
    twins = [
        (name, name.removesuffix("_async"))
        for name in edges
        if name.endswith("_async") and name.removesuffix("_async") in edges
    ]
    assert len(twins) >= 4  # store: _engine, _lock, _postgres, _shm
    for asynchronous, synchronous in twins:
        assert asynchronous not in edges[synchronous], f"{synchronous} imports {asynchronous}"


#: What each package of ``orbitive`` may import besides itself (docs/architecture.md).
LAYERS: dict[str, set[str]] = {
    "_core": set(),
    "lock": {"_core"},
    "pool": {"_core"},
    "store": {"_core", "lock"},
    "clients": {"_core", "pool", "store"},  # a budget across hosts holds store leases
    "metrics": {"_core", "lock", "pool", "clients"},
    "celery": {"_core", "store"},
    "limits": {"_core", "store"},  # postgresql:// runs on the store's PostgreSQL engine
    "cli": {"", "_core", "lock", "pool", "store", "clients", "metrics"},
    "": {"_core", "cli"},  # the root package, and python -m orbitive
}


def package_of(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def test_packages_import_only_the_layers_below_them() -> None:
    crossings = {
        (name, target)
        for name, targets in graph().items()
        for target in targets
        if package_of(target) != package_of(name)
        and package_of(target) not in LAYERS[package_of(name)]
    }
    assert not crossings, f"imports against the layering: {sorted(crossings)}"
