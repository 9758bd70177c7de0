"""The shape docs/architecture.md promises: no import cycles, an engine that does no I/O and
knows no store by name, stores that declare their capabilities."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from dblock.backends import BACKENDS, CAPABILITIES, Store

SRC = Path(__file__).resolve().parent.parent / "src" / "dblock"
#: the modules that hold the lock semantics and drive them: no store is named there
CORE = ["_engine", "_core.py", "_drive.py", "_lock.py", "_client.py", "_patterns.py", "_rwlock.py"]
STORE_NAMES = {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "redis"}
#: what the engine may not import: drivers, sockets, processes, event loops
IO_MODULES = {"socket", "select", "selectors", "subprocess", "asyncio", "sqlite3", "psycopg"}
IO_MODULES |= {"pymysql", "urllib", "http", "redis"}


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            subs = [f"{target}.{alias.name}" for alias in node.names]
            found = [s for s in subs if s in modules]
            out.update(found)
            if len(found) < len(subs):
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_of_src_has_no_cycle() -> None:
    modules = _modules()
    graph = {m: _imports(m, p, modules) & set(modules) - {m} for m, p in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _core_files() -> list[Path]:
    files: list[Path] = []
    for name in CORE:
        path = SRC / name
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return files


def test_the_engine_imports_nothing_that_does_io() -> None:
    modules = _modules()
    for path in sorted((SRC / "_engine").rglob("*.py")):
        name = "dblock._engine" + ("" if path.stem == "__init__" else f".{path.stem}")
        roots = {i.split(".")[0] for i in _imports(name, path, modules)}
        assert not roots & IO_MODULES, f"{path.name} imports {roots & IO_MODULES}"
        source = path.read_text()
        assert "sleep(" not in source.replace("Sleep(", ""), f"{path.name} sleeps"


def test_no_store_is_named_in_the_core() -> None:
    for path in _core_files():
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docstrings:
                assert node.value not in STORE_NAMES, f"{path.name}:{node.lineno} names a store"


def test_the_core_does_not_probe_stores_with_getattr() -> None:
    for path in _core_files():
        if path.name == "_drive.py":  # dispatches the engine's calls to contract methods
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in {
                "getattr",
                "hasattr",
            }:
                target = ast.unparse(node.args[0])
                assert "store" not in target and "backend" not in target, (
                    f"{path.name}:{node.lineno} probes {target}"
                )


@pytest.mark.parametrize("scheme", sorted(BACKENDS))
def test_every_store_implements_the_contract_and_declares_what_it_has(scheme: str) -> None:
    module_name, class_name, _extra = BACKENDS[scheme]
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:  # its driver is an optional extra
        pytest.skip(f"driver not installed: {exc.name}")
    assert issubclass(cls, Store)
    assert not getattr(cls, "__abstractmethods__", None), "every declared operation exists"
    declared = [c for c in CAPABILITIES if issubclass(cls, c)]
    assert declared, f"{class_name} declares no capability at all"


def test_the_cli_imports_only_the_public_api_and_its_own_modules() -> None:
    modules = _modules()
    allowed = {"dblock", "dblock.tools", "dblock.dashboard"}  # public modules
    for name, path in modules.items():
        if not name.startswith("dblock.cli"):
            continue
        used = {i for i in _imports(name, path, modules) if i.split(".")[0] == "dblock"}
        stray = {i for i in used if i not in allowed and not i.startswith("dblock.cli")}
        assert not stray, f"{name} imports {sorted(stray)}"


#: where a blocking wait is right even under the async client: threads of their own (the
#: statement watchdog), code the async client runs on a worker thread (SQLite's operations and
#: connecting), and the blocking runtime itself
_THREAD_ONLY = {"_runtime.py", "_renewer.py", "watchdog.py", "_forksafe.py"}
_BLOCKING_WAITS = ("time.sleep(", "threading.Event(", "threading.Thread(", "threading.Condition(")


def test_store_and_client_code_waits_only_through_its_runtime() -> None:
    """The async client runs this code on the event loop: a wait that does not go through
    ``rt`` (sleep, event, thread) would block every task of the loop."""
    for path in sorted(SRC.rglob("*.py")):
        if path.name in _THREAD_ONLY or "cli" in path.parts or "demo" in path.parts:
            continue
        if path.name in ("bench.py",):
            continue
        source = path.read_text()
        for wait in _BLOCKING_WAITS:
            if wait in source:
                lines = [n for n, line in enumerate(source.splitlines(), 1) if wait in line]
                allowed = path.name == "sqlite.py" and wait == "time.sleep("  # worker thread
                assert allowed, f"{path.relative_to(SRC)}:{lines} waits with {wait}"


def test_the_async_client_implements_no_lock_semantics() -> None:
    """The async surface runs the blocking client's code (one implementation): it reaches no
    store and no engine step directly."""
    modules = _modules()
    used = set(_imports("dblock._async_client", SRC / "_async_client.py", modules))
    assert not {i for i in used if i.startswith(("dblock._engine", "dblock.backends"))}, used
