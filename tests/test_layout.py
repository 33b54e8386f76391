"""The code's shape, as the design promises it: no import circles (imports under TYPE_CHECKING
and inside functions count), folders that import only downward, floor by floor, no function over
50 lines, no module over 400 lines, and few flat modules beside the packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specrun"
MOST_LINES_PER_FUNCTION = 50
MOST_LINES_PER_MODULE = 400
MOST_FLAT_MODULES = 6


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(name: str, tree: ast.AST) -> set[str]:
    """The specrun modules `name` imports anywhere in its text; `from package import module`
    names the module, `from module import thing` the module."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        found |= _imported_by(node, package)
    return {module for module in found if module in MODULES and module != name}


def _imported_by(node: ast.AST, package: str) -> set[str]:
    """The modules one statement imports (not only specrun's)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    return {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            group.append(node)
            if len(group) > 1:
                groups.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_no_module_imports_itself_back() -> None:
    graph = {name: _imported(name, tree) for name, tree in _trees().items()}
    assert _circles(graph) == []


# The folders (and flat modules) floor by floor, from the front ends down: a folder imports only
# from its own floor and those below it.
FLOORS = (
    {"cli", "serve", "bench", "chat", "api", "__main__"},  # front ends
    {"session", "pair", "config"},  # what a front end asks for: loaded models, pair checks, the checked settings
    {"core", "drafts", "grammar"},  # the speculative loop, the draft sources, grammars
    {"backend", "headers", "hub"},  # llama.cpp, GGUF headers, the hub and model stores
    {"specrun", "errors", "settings", "files", "sequences"},  # what everything shares
)
# The one upward arrow, for types only: a source's builder is handed the session's settings.
TYPE_ONLY_UPWARD = {("specrun.drafts.registry", "specrun.config")}


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _floor(module: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if _folder(module) in floor)


def _type_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _upward_imports() -> list[tuple[str, str, bool]]:
    """(importer, imported, whether only under TYPE_CHECKING) for each import of a higher floor."""
    found = []
    for name, tree in _trees().items():
        package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
        guarded = {id(inner) for node in ast.walk(tree) if _type_only(node) for inner in ast.walk(node)}
        for node in ast.walk(tree):
            for other in _imported_by(node, package) & MODULES.keys():
                if _floor(other) < _floor(name):
                    found.append((name, other, id(node) in guarded))
    return found


def test_every_folder_sits_on_a_floor() -> None:
    assert [name for name in MODULES if not any(_folder(name) in floor for floor in FLOORS)] == []


def test_folders_import_only_downward() -> None:
    assert {(importer, imported) for importer, imported, _ in _upward_imports()} <= TYPE_ONLY_UPWARD
    assert all(type_only for *_, type_only in _upward_imports())


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_function_is_longer_than_a_screen() -> None:
    long = [
        f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for name, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MOST_LINES_PER_FUNCTION
    ]
    assert long == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_is_too_long(name: str) -> None:
    assert len(MODULES[name].read_text(encoding="utf-8").splitlines()) <= MOST_LINES_PER_MODULE


def test_few_modules_sit_flat_beside_the_packages() -> None:
    flat = [path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py")]
    assert len(flat) <= MOST_FLAT_MODULES, sorted(flat)
