"""Exit statuses and messages of failures: usage errors, unreachable databases, --debug."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from dblock.cli import main

PASSWORD = "Sup3r-S3cret-Pw"  # noqa: S105 - must never show up in output
UNREACHABLE = [
    f"postgresql://dbuser:{PASSWORD}@127.0.0.1:1/db",
    f"mysql://dbuser:{PASSWORD}@127.0.0.1:1/db",
    "sqlite:////proc/self/no-such-dir/locks.sqlite3",
]
COMMANDS = ["run", "once", "list", "info", "release", "purge", "schema", "demo", "bench"]


def dblock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dblock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.mark.parametrize("url", UNREACHABLE, ids=["postgresql", "mysql", "sqlite"])
@pytest.mark.parametrize(
    "args",
    [
        ["run", "--no-wait", "k", "--", "true"],
        ["list"],
        ["info", "k"],
        ["release", "k", "--force"],
        ["purge"],
    ],
    ids=lambda args: args[0],
)
def test_unreachable_database_exits_69_with_one_line(url: str, args: list[str]) -> None:
    done = dblock("--url", url, *args)
    assert done.returncode == 69
    assert done.stdout == ""
    stderr = done.stderr
    if PASSWORD in url:  # the warning about a password on the command line comes first
        warning, _, stderr = stderr.partition("\n")
        assert warning.startswith("dblock: warning: --url holds a password")
    assert stderr.count("\n") == 1, done.stderr
    assert stderr.startswith("dblock: database unavailable: ")
    assert PASSWORD not in done.stderr
    assert "Traceback" not in done.stderr
    if "sqlite" not in url:
        assert "dbuser:***@127.0.0.1:1/db" in done.stderr


def test_debug_shows_the_traceback() -> None:
    done = dblock("--debug", "--url", UNREACHABLE[0], "list")
    assert done.returncode == 69
    assert "Traceback" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("dblock: database unavailable: ")


def test_url_from_the_environment() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dblock", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "DBLOCK_URL": UNREACHABLE[0]},
        check=False,
    )
    assert done.returncode == 69
    assert PASSWORD not in done.stderr
    assert "127.0.0.1:1" in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_option_exits_2(command: str, tmp_path: Path) -> None:
    args = [command, "--no-such-option"]
    if command in ("demo", "bench"):
        args = ["--no-such-option", command]  # their own options go to the launched module
    done = dblock("--url", f"sqlite:///{tmp_path}/l.db", *args)
    assert done.returncode == 2
    assert "No such option" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "k"],  # no CMD
        ["run", "--ttl", "0", "k", "--", "true"],
        ["run", "--ttl", "nan", "k", "--", "true"],
        ["run", "--timeout", "-1", "k", "--", "true"],
        ["run", "--timeout", "1", "--no-wait", "k", "--", "true"],
        ["run", "--conflict-exit-code", "256", "k", "--", "true"],
        ["run", "", "--", "true"],
        ["info", "k" * 256],
        ["release", "k"],  # without --force
        ["purge", "--older-than", "-5"],
        ["schema", "--dialect", "oracle"],
        ["--table", "no such table", "list"],
        ["--url", "oracle://scott:tiger@db/x", "list"],
        ["list", "--url", "oracle://scott:tiger@db/x"],
    ],
)
def test_bad_arguments_exit_2(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["--url", f"sqlite:///{tmp_path}/l.db", *args])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Usage:" in err
    assert "Traceback" not in err
    assert "tiger" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "Example" in out
    assert f"dblock {command}" in out


def test_group_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out
    assert main(["--version"]) == 0
    assert "0." in capsys.readouterr().out
    done = dblock("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("dblock, version ")


def test_missing_module_of_demo_or_bench_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "dblock.bench", None)  # makes the import fail
    assert main(["bench", "--duration", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dblock: dblock.bench is not available")


def test_bench_gets_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setitem(sys.modules, "dblock.bench", types.SimpleNamespace(main=fake_main))
    assert main(["--url", "sqlite:///x.db", "bench", "--duration", "1"]) == 0
    assert main(["bench", "--url", "sqlite:///y.db"]) == 0
    assert seen == [["--url", "sqlite:///x.db", "--duration", "1"], ["--url", "sqlite:///y.db"]]


def test_bench_gets_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dblock bench --table T` reaches the bench, not only dblock's own --table."""
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setitem(sys.modules, "dblock.bench", types.SimpleNamespace(main=fake_main))
    assert main(["bench", "--table", "my_locks", "--duration", "1"]) == 0
    assert main(["--table", "app.locks", "--url", "sqlite:///x.db", "bench"]) == 0
    assert seen == [
        ["--table", "my_locks", "--duration", "1"],
        ["--url", "sqlite:///x.db", "--table", "app.locks"],
    ]
