"""Secrets in URLs (issue 29, point 5): query parameters such as ``?password=`` and
``?sslpassword=`` are hidden wherever a URL is shown: error messages (the driver's too, as
the ``__cause__``), ``repr(client)``, ``client.url`` and the command line's output."""

from __future__ import annotations

import subprocess
import sys
import traceback
from urllib.parse import quote

import pytest

import dblock
from dblock._url import redact
from tests._servers import POSTGRESQL_URL

SECRET = "Pw9-qs3cr3t"  # noqa: S105 - must never show up


def _texts(exc: BaseException) -> str:
    return "".join([str(exc), repr(exc), *traceback.format_exception(exc)])


@pytest.mark.parametrize(
    "name", ["password", "sslpassword", "PassWord", "pass%77ord", "sslkey", "auth_token", "secret"]
)
def test_redact_hides_secret_query_parameters(name: str) -> None:
    url = f"postgresql://u@h:5432/db?connect_timeout=3&{name}={SECRET}&sslmode=disable"
    safe = redact(url)
    assert SECRET not in safe
    assert f"{name}=***" in safe
    assert "connect_timeout=3" in safe
    assert "sslmode=disable" in safe


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # an '@' in a secret value is not the end of a user part: the parameters after it
        (
            f"postgresql://h:1/?password={SECRET}@&sslpassword={SECRET}",
            "password=***&sslpassword=***",
        ),
        (
            f"postgresql://u:{SECRET}@h:1/db?password={SECRET}@x&a=1",
            "u:***@h:1/db?password=***&a=1",
        ),
        (f"postgresql://u:{SECRET}?x@h:1/db", "u:***@h:1/db"),  # a '?' in a password
    ],
)
def test_redact_does_not_mistake_an_at_sign_in_a_value_for_the_user_part(
    url: str, shown: str
) -> None:
    safe = redact(url)
    assert SECRET not in safe
    assert shown in safe


@pytest.mark.parametrize(
    "url",
    [
        # reaches no server: the message names the URL
        f"postgresql://u@127.0.0.1:1/db?password={SECRET}&connect_timeout=1",
        f"postgresql://u@127.0.0.1:1/db?sslpassword={SECRET}&connect_timeout=1",
        f"postgresql://u@127.0.0.1:1/db?connect_timeout=1&password={SECRET}@x",  # '@' in a value
        f"postgresql://u:{SECRET}@127.0.0.1:1/db?sslpassword={quote(SECRET + '&x')}"
        "&connect_timeout=1",
        # parameters dblock does not take: refused, and the message quotes the URL
        f"mysql://u@127.0.0.1:1/db?password={SECRET}",
        f"sqlite:///locks.sqlite3?password={SECRET}",
        # a bad value of a parameter dblock reads, beside a secret
        f"sqlite:///locks.sqlite3?timeout=nan&token={SECRET}",
        f"postgresql://u@127.0.0.1:1/db?connect_timeout=x&password={SECRET}",
    ],
)
def test_error_messages_hide_query_secrets(url: str) -> None:
    with pytest.raises(dblock.DBLockError) as info:
        dblock.connect(url)
    assert SECRET not in _texts(info.value)
    assert quote(SECRET) not in _texts(info.value)


def test_client_url_and_repr_hide_query_secrets(pg_table: str) -> None:
    # libpq takes sslpassword (the client key's passphrase) and ignores it without TLS
    url = f"{POSTGRESQL_URL}?sslpassword={SECRET}&connect_timeout=5"
    with dblock.connect(url, table=pg_table) as client:
        assert SECRET not in client.url
        assert SECRET not in repr(client)
        assert "sslpassword=***" in client.url


def test_driver_error_chain_is_scrubbed() -> None:
    """A driver message that quotes a secret is scrubbed in the whole chain."""
    from dblock._url import scrub_exception

    def fail() -> None:
        try:
            raise OSError(f"bad option value {SECRET!r}")
        except OSError as exc:
            raise RuntimeError("wrapped") from exc

    with pytest.raises(RuntimeError) as info:
        fail()
    scrub_exception(info.value, [SECRET])
    assert SECRET not in _texts(info.value)


def test_command_line_hides_query_secrets() -> None:
    url = f"postgresql://u@127.0.0.1:1/db?password={SECRET}&connect_timeout=1"
    done = subprocess.run(
        [sys.executable, "-m", "dblock", "--url", url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 69, done.stderr
    assert "password=***" in done.stderr
    assert SECRET not in done.stdout + done.stderr
