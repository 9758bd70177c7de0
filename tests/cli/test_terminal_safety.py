"""Keys are anyone's text: human output escapes what a terminal would act on (issue 29,
point 9), JSON output keeps it exact; ``list`` shows each hold's kind (point 18)."""

from __future__ import annotations

import io
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dblock
from dblock.cli import main
from dblock.cli.status_line import HolderStatus
from tests.cli.conftest import wait_for

#: clear screen, set the window title (OSC, BEL-terminated), right-to-left override, an 8-bit
#: CSI, a line separator, a zero-width space, DEL and a carriage return
HOSTILE = "\x1b[2J\x1b]0;pwned\x07\u202eevil\x9b31m\u2028\u200bx\x7f\ry"
UNSAFE = ["\x1b", "\x07", "\u202e", "\x9b", "\u2028", "\u200b", "\x7f", "\r"]


def printable(text: str) -> str:
    """What human output shows: non-printable characters escaped as repr does."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def assert_safe(text: str) -> None:
    for char in UNSAFE:
        assert char not in text, f"raw {char!r} in {text!r}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/locks.sqlite3"


@pytest.fixture
def hostile_key() -> str:
    return "k-" + uuid.uuid4().hex[:8] + HOSTILE


@pytest.fixture
def holding(url: str, hostile_key: str) -> Iterator[dblock.Lock]:
    with dblock.connect(url) as client:
        lock = client.lock(hostile_key, ttl=60)
        assert lock.acquire(blocking=False)
        yield lock
        lock.release()


def test_printable_escapes_like_repr() -> None:
    from dblock.cli.output import printable

    assert printable("plain key:é 日本 a\\b") == "plain key:é 日本 a\\b"
    assert printable(HOSTILE) == repr(HOSTILE)[1:-1]
    assert_safe(printable(HOSTILE))
    assert printable("\ud800") == "\\ud800"  # a lone surrogate (undecodable argv bytes)


def test_list_escapes_keys_and_shows_the_kind(
    url: str, hostile_key: str, holding: dblock.Lock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", url, "list"]) == 0
    out = capsys.readouterr().out
    assert_safe(out)
    assert printable(hostile_key) in out
    header = out.splitlines()[0].split()
    assert header[:3] == ["key", "kind", "owner"], out
    assert " lock " in out

    assert main(["--url", url, "list", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["key"] == hostile_key  # exact
    assert record["kind"] == "lock"


def test_info_escapes_and_json_is_exact(
    url: str, hostile_key: str, holding: dblock.Lock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", url, "info", hostile_key]) == 0
    out = capsys.readouterr().out
    assert_safe(out)
    assert f"key:         {printable(hostile_key)}\n" in out

    assert main(["--url", url, "info", hostile_key, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == hostile_key

    assert main(["--url", url, "info", hostile_key + "-free"]) == 1
    err = capsys.readouterr().err
    assert_safe(err)
    assert "is not held" in err


def test_busy_and_once_messages_escape(
    url: str, hostile_key: str, holding: dblock.Lock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", url, "run", "--no-wait", hostile_key, "--", "true"]) == 75
    err = capsys.readouterr().err
    assert_safe(err)
    assert "is busy" in err

    once_key = "once-" + HOSTILE
    assert main(["--url", url, "once", once_key, "--", sys.executable, "-c", ""]) == 0
    assert main(["--url", url, "once", once_key, "--", "true"]) == 0
    err = capsys.readouterr().err
    assert_safe(err)
    assert "has already succeeded" in err


def test_usage_errors_escape_the_arguments(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # click quotes the unexpected argument in its message
    assert main(["--url", url, "info", "k", "extra" + HOSTILE]) == 2
    err = capsys.readouterr().err
    assert_safe(err)
    assert "extra" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_escapes_the_key(url: str, hostile_key: str, holding: dblock.Lock) -> None:
    stream = _Terminal()
    with dblock.connect(url) as client, HolderStatus(client, hostile_key, stream):
        wait_for(lambda: "held by" in stream.getvalue(), what="the holder on the status line")
    shown = stream.getvalue()
    assert printable(hostile_key) in shown
    for char in UNSAFE:  # the status line itself redraws with ESC sequences and \r
        assert char in ("\x1b", "\r") or char not in shown
    assert "\x1b]0;pwned" not in shown and "\x1b[2J" not in shown


def test_list_table_has_a_kind_column(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with dblock.connect(url) as client, client.rwlock("report").read_lock():
        assert main(["--url", url, "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["key", "kind", "owner"]
    assert lines[-1].split()[:2] == ["report", "read"]
