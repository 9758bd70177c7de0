"""The shape docs/architecture.md promises: no import cycle, no import from a lower layer into
a higher one, an engine that does no I/O and knows no store by name, one package per store that
imports no other store's package, and stores that declare their capabilities. (The docs'
tables of stores, extras and commands: tests/test_docs_tables.py.)"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from dblock._contract import CAPABILITIES, Store
from dblock.stores._registry import BUILT_IN, entries
from tests.providers import (
    HARNESS_CAPABILITIES,
    PROVIDERS,
    STORE_CAPABILITIES,
    provider_folders,
)

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "dblock"
#: the modules that hold the lock semantics and drive them: no store is named there
CORE = ["_engine", "_core.py", "_drive.py", "_lock.py", "_client.py", "_patterns.py", "_rwlock.py"]
STORE_NAMES = {n for e in BUILT_IN for n in (e.name, *e.schemes)}
#: every store's package (the quorum has no URL scheme of its own, so no registry entry)
STORE_PACKAGES = sorted(p.name for p in (SRC / "stores").iterdir() if (p / "__init__.py").exists())
#: what the engine may not import: drivers (every store's, from the registry), sockets,
#: processes, event loops
DRIVERS = {d.split(".")[0] for e in BUILT_IN for d in (*e.drivers, *e.async_drivers)}
IO_MODULES = {"socket", "select", "selectors", "subprocess", "asyncio", "urllib", "http"}
IO_MODULES |= {"sqlite3", "greenlet"} | DRIVERS
#: the layers, lowest first: a module imports only from its own layer or lower ones. What no
#: layer names (the public surface, the CLI, integrations) stands above them all.
LAYERS: list[tuple[str, ...]] = [
    # what everything stands on: errors, types, timing, URLs, the runtimes
    (
        "dblock._bounded",
        "dblock._errors",
        "dblock._types",
        "dblock._forksafe",
        "dblock._green",
        "dblock._timing",
        "dblock._validate",
        "dblock._observe",
        "dblock._renewer",
        "dblock._runtime",
        "dblock._loop_runtime",
        "dblock._url",
    ),
    ("dblock._contract",),  # what the engine asks of a store
    ("dblock._engine",),  # the lock semantics, no I/O
    # what several stores share, and a store's registry entry
    tuple(
        f"dblock.stores.{p.stem}"
        for p in sorted((SRC / "stores").glob("_*.py"))
        if p.stem not in ("_registry", "_sqla", "_clients")
    ),
    tuple(f"dblock.stores.{name}" for name in STORE_PACKAGES),  # one package per store
    ("dblock.stores._registry", "dblock.stores._sqla", "dblock.stores._clients", "dblock.stores"),
]


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


def _store_classes() -> dict[str, str]:
    """Every store's class path: the registry's, and the quorum's (opened by a list of URLs)."""
    found = {e.name: e.store for e in entries()}
    found["quorum"] = "dblock.stores.quorum.store:QuorumStore"
    return found


@pytest.mark.parametrize("name", sorted(_store_classes()))
def test_every_store_implements_the_contract_and_declares_what_it_has(name: str) -> None:
    module_name, _, class_name = _store_classes()[name].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:  # its driver is an optional extra
        pytest.skip(f"driver not installed: {exc.name}")
    assert issubclass(cls, Store)
    assert not getattr(cls, "__abstractmethods__", None), "every declared operation exists"
    declared = [c for c in CAPABILITIES if issubclass(cls, c)]
    assert declared, f"{class_name} declares no capability at all"


@pytest.mark.parametrize("provider", [p.name for p in PROVIDERS])
def test_every_provider_declares_the_capabilities_its_store_class_declares(provider: str) -> None:
    """Each provider's store capabilities (the contract tests skip by them) are exactly
    those its store's class line declares: read from the class, and none declared by hand
    among the provider's markers, which are harness capabilities only."""
    entry = next(p for p in PROVIDERS if p.name == provider)
    assert entry.store, f"provider {provider} names no store class"
    assert entry.markers <= HARNESS_CAPABILITIES, sorted(entry.markers - HARNESS_CAPABILITIES)
    module_name, _, class_name = entry.store.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:  # its driver is an optional extra
        pytest.skip(f"driver not installed: {exc.name}")
    declared = {c.__name__ for c in CAPABILITIES if issubclass(cls, c)}
    assert entry.capabilities & STORE_CAPABILITIES == declared
    assert {c.__name__ for c in CAPABILITIES} == STORE_CAPABILITIES


def test_every_store_has_a_provider_in_its_test_folder() -> None:
    """Each store package has tests/stores/<name>/provider.py, whose providers run its class
    (tests/providers.py collects them; a store without one would run no contract test)."""
    folders = provider_folders()
    assert sorted(folders) == STORE_PACKAGES
    for folder in folders:
        classes = {e.store for e in PROVIDERS if e.store.startswith(f"dblock.stores.{folder}.")}
        assert classes, f"tests/stores/{folder}/provider.py runs no class of stores/{folder}/"


def test_every_store_has_a_package_and_every_package_a_store() -> None:
    assert sorted(_store_classes()) == STORE_PACKAGES
    for e in BUILT_IN:
        assert e.store.startswith(f"dblock.stores.{e.name}."), e.store


def _layer(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (length of the prefix, layer)
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), i)
    return None if best is None else best[1]


def test_no_module_imports_from_a_higher_layer() -> None:
    modules = _modules()
    top = len(LAYERS)
    wrong = []
    for name, path in modules.items():
        here = _layer(name)
        here = top if here is None else here
        for target in _imports(name, path, modules) & set(modules):
            there = _layer(target)
            there = top if there is None else there
            if there > here:
                wrong.append(f"{name} (layer {here}) imports {target} (layer {there})")
    assert wrong == []


def test_the_layer_check_finds_an_import_from_below() -> None:
    assert _layer("dblock._engine.waiting") == 2
    assert _layer("dblock.stores.mysql.doorbell") == 4
    assert _layer("dblock.stores._pool") == 3
    assert _layer("dblock.stores") == 5
    assert _layer("dblock._lock") is None


def test_no_store_package_imports_another_store_or_the_registry() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] != "stores" or parts[2] not in STORE_PACKAGES:
            continue
        for target in _imports(name, path, modules):
            t = target.split(".")
            other = len(t) >= 3 and t[:2] == ["dblock", "stores"] and t[2] != parts[2]
            if other and (t[2] in STORE_PACKAGES or t[2] in ("_registry", "_sqla", "_clients")):
                wrong.append(f"{name} imports {target}")
            if target == "dblock.stores":
                wrong.append(f"{name} imports the stores' package")
    assert wrong == []


def test_the_shared_store_modules_import_no_store_package() -> None:
    modules = _modules()
    for name, path in modules.items():
        if _layer(name) != 3 or not name.startswith("dblock.stores."):
            continue
        used = {i for i in _imports(name, path, modules) if i.startswith("dblock.stores.")}
        assert not {i for i in used if i.split(".")[2] in STORE_PACKAGES}, (name, used)


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
_THREAD_ONLY = {"_runtime.py", "_renewer.py", "_watchdog.py", "_forksafe.py"}
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
                sqlite = path.relative_to(SRC).as_posix() == "stores/sqlite/store.py"
                allowed = sqlite and wait == "time.sleep("  # worker thread
                assert allowed, f"{path.relative_to(SRC)}:{lines} waits with {wait}"


def test_the_async_client_implements_no_lock_semantics() -> None:
    """The async surface runs the blocking client's code (one implementation): it reaches no
    store and no engine step directly."""
    modules = _modules()
    used = set(_imports("dblock._async_client", SRC / "_async_client.py", modules))
    assert not {i for i in used if i.startswith(("dblock._engine", "dblock.stores"))}, used
