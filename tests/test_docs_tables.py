"""The docs' tables of what the code has, checked against the one source each comes from: the
stores (the registry), the extras (``pyproject.toml``), the CLI's commands (its click group),
the servers the tests read (``tests/_servers.py``), and the docs pages that messages and pages
name. A store, extra or command added without its rows fails here, naming the page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dblock.stores._registry import BUILT_IN

try:
    import tomllib
except ImportError:  # Python 3.10: the extras' tests skip
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: extras for working on dblock, not for users: the install page's rows name them, the
#: README's list of extras does not
DEV_EXTRAS = {"dev", "dashboard-test"}
#: earlier names of an extra, kept for the installs that name them
ALIASES = {"asyncio": "async"}


def _rows(path: Path) -> list[str]:
    """Every Markdown table row of ``path``."""
    return [line for line in path.read_text().splitlines() if line.startswith("|")]


def _extras() -> dict[str, list[str]]:
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11+)")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


def _included(requirement: str) -> list[str]:
    """The extras a ``dblock[a,b]`` requirement pulls in; [] for any other requirement."""
    m = re.fullmatch(r"dblock\[([^\]]+)\]", requirement)
    return m.group(1).split(",") if m else []


@pytest.mark.parametrize("name", [e.name for e in BUILT_IN])
def test_every_store_has_its_rows(name: str) -> None:
    """A store's row names its URL scheme and its extra, in the README's store table, the
    install page's extras table, the configuration page's store table; the async page's
    table names the store."""
    e = next(e for e in BUILT_IN if e.name == name)
    scheme = f"`{e.schemes[0]}://"
    readme = [r for r in _rows(ROOT / "README.md") if scheme in r]
    assert readme, f"README.md's store table has no row for {scheme}"
    extra = f"`{e.extra}`" if e.extra else "none"
    assert any(extra in r for r in readme), f"README.md's row for {name} names no {extra}"
    install = _rows(DOCS / "install.md")
    assert any(re.match(rf"\| {re.escape(extra)} \|", r) and scheme in r for r in install), (
        f"docs/install.md's extras table has no row | {extra} | ... {scheme}"
    )
    driver = f"dblock[{e.extra}]" if e.extra else "stdlib"
    assert any(scheme in r and driver in r for r in _rows(DOCS / "configuration.md")), (
        f"docs/configuration.md's store table has no row naming {scheme} and {driver}"
    )
    assert any(r.startswith(f"| {e.title}") for r in _rows(DOCS / "async.md")), (
        f"docs/async.md's table has no row | {e.title} | (what the async client uses)"
    )


@pytest.mark.parametrize("extra", sorted(_extras()) if tomllib else [])
def test_every_extra_has_its_row_in_the_install_page(extra: str) -> None:
    """Its row (first cell the extra; an alias named in its extra's row) names what it
    installs, as ``pyproject.toml`` says: each requirement, or each extra it pulls in."""
    requirements = _extras()[extra]
    rows = _rows(DOCS / "install.md")
    first = ALIASES.get(extra, extra)
    row = next((r for r in rows if r.startswith(f"| `{first}` |")), None)
    assert row, f"docs/install.md's extras table has no row | `{first}` |"
    assert f"`{extra}`" in row, f"docs/install.md's row | `{first}` | does not name {extra}"
    if extra in ("all", "dev"):
        return  # their rows say what they are for; the tests below check what they leave out
    for req in requirements:
        named = [f"`{x}`" for x in _included(req)] or [f"`{req}`"]
        for n in named:
            assert n in row, f"docs/install.md's row for {extra} does not name {n}"


def test_the_install_page_says_what_all_leaves_out() -> None:
    extras = _extras()
    inside: set[str] = set()
    todo = ["all"]
    while todo:  # what `all` pulls in, and what that pulls in
        for req in extras[todo.pop()]:
            todo += [x for x in _included(req) if x not in inside]
            inside.update(_included(req))
    left_out = set(extras) - inside - {"all"} - DEV_EXTRAS - set(ALIASES)
    row = next(r for r in _rows(DOCS / "install.md") if r.startswith("| `all` |"))
    missing = sorted(x for x in left_out if f"`{x}`" not in row)
    assert not missing, f"docs/install.md's `all` row does not say it leaves out {missing}"


def test_the_readme_names_every_extra() -> None:
    readme = (ROOT / "README.md").read_text()
    users = set(_extras()) - DEV_EXTRAS - set(ALIASES) - {"all"}
    missing = sorted(x for x in users if f"`{x}`" not in readme)
    assert not missing, f"README.md's list of extras misses {missing}"


def test_every_cli_command_is_in_the_readme_and_the_cli_page() -> None:
    """Each command of the click group, as ``dblock COMMAND`` in the README and in the examples
    of docs/cli.md (docs/cli-reference.md is generated from the group itself)."""
    import click

    from dblock.cli.app import cli

    for page in (ROOT / "README.md", DOCS / "cli.md"):
        text = page.read_text()
        missing = sorted(
            c
            for c in cli.list_commands(click.Context(cli))
            if not re.search(rf"\bdblock {c}\b", text)
        )
        assert not missing, f"{page.relative_to(ROOT)} names no `dblock {missing}`"


def test_every_test_server_variable_is_in_the_readme_and_contributing() -> None:
    servers = (ROOT / "tests" / "_servers.py").read_text()
    names = sorted(set(re.findall(r"DBLOCK_TEST_(\w+?)_URL", servers)))
    assert len(names) >= 5, names
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"`DBLOCK_TEST_<SERVER>_URL`\s*\(([^;)]*)", readme)
    assert listed, "README.md no longer names DBLOCK_TEST_<SERVER>_URL"
    in_readme = set(re.findall(r"[A-Z]+", listed.group(1)))
    assert not set(names) - in_readme, f"README.md's test variables miss {set(names) - in_readme}"
    contributing = re.sub(r"\s+", " ", (DOCS / "contributing.md").read_text())
    missing = [n for n in names if f"`DBLOCK_TEST_{n}_URL`" not in contributing]
    assert not missing, f"docs/contributing.md's test variables miss {missing}"


def test_every_docs_page_named_exists() -> None:
    """``docs/<page>.md`` named in a message, a docstring, the README or a page: the page is
    there (the stores' pages moved to docs/stores/)."""
    sources = [*(ROOT / "src").rglob("*.py"), ROOT / "README.md", *DOCS.rglob("*.md")]
    missing = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources
        for name in re.findall(r"\bdocs/[\w/.-]+?\.md\b", path.read_text())
        if not (ROOT / name).exists()
    }
    assert not missing, sorted(missing)


def test_the_architecture_pages_capability_table_is_what_each_store_class_declares() -> None:
    """docs/architecture.md's table of capabilities per store: a ✓ exactly where the store's
    class line declares the capability (and every capability and store has its row and
    column), so a store that gains or loses one cannot leave the page behind."""
    import importlib

    from dblock._contract import CAPABILITIES

    classes = {e.name: e.store for e in BUILT_IN}
    classes["quorum"] = "dblock.stores.quorum.store:QuorumStore"
    text = (DOCS / "architecture.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| capability |")]
    assert len(lines) == 1, "docs/architecture.md has no capability table"
    start = text.splitlines().index(lines[0])
    table = []
    for line in text.splitlines()[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    header, rows = table[0], table[2:]
    assert sorted(header[1:]) == sorted(classes)
    assert sorted(row[0] for row in rows) == sorted(c.__name__ for c in CAPABILITIES)
    for row in rows:
        for store, cell in zip(header[1:], row[1:], strict=True):
            module, _, name = classes[store].partition(":")
            cls = getattr(importlib.import_module(module), name)
            capability = next(c for c in CAPABILITIES if c.__name__ == row[0])
            assert cell.startswith("✓") == issubclass(cls, capability), (row[0], store)
