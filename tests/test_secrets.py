"""Secrets in URLs (issue 29, point 5): query parameters such as ``?password=`` and
``?sslpassword=`` are hidden wherever a URL is shown: error messages (the driver's too, as
the ``__cause__``), ``repr(client)``, ``client.url`` and the command line's output."""

from __future__ import annotations

import logging
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


# -- every store, every URL form (issue 46, point 2) ---------------------------------------
#: each store's URL forms with a secret in every place its docs take one (unreachable: port 1;
#: ZooKeeper waits out its connect timeout, kept short)
ADMIN_DIGEST = "ops:3qpG0n6NeR8KXXf7ZG/KtrUk+A4="  # a digest a password can be guessed from
FORMS = {
    "postgresql": f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=1",
    "postgres": f"postgres://u@127.0.0.1:1/db?password={SECRET}&connect_timeout=1",
    "mysql": f"mysql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=1",
    "mariadb": f"mariadb://u:{SECRET}@127.0.0.1:1/db?connect_timeout=1",
    "redis": f"redis://u:{SECRET}@127.0.0.1:1/0?connect_timeout=1",
    "redis-password-only": f"redis://:{SECRET}@127.0.0.1:1/0?connect_timeout=1",
    "rediss": f"rediss://u:{SECRET}@127.0.0.1:1/0?connect_timeout=1",
    "etcd": f"etcd://u:{SECRET}@127.0.0.1:1?connect_timeout=1",
    "etcd+https": f"etcd+https://u:{SECRET}@127.0.0.1:1?connect_timeout=1&ca_cert=/etc/hostname",
    "zookeeper": f"zookeeper://alice:{SECRET}@127.0.0.1:1/app?connect_timeout=0.2",
    "zk": f"zk://alice:{SECRET}@127.0.0.1:1,127.0.0.1:2/app?connect_timeout=0.2",
    "zookeeper-digest": f"zookeeper://127.0.0.1:1/app?digest=alice:{SECRET}&connect_timeout=0.2",
    "zookeeper-admin": f"zookeeper://alice:{SECRET}@127.0.0.1:1/app?admin=digest:{ADMIN_DIGEST}"
    "&connect_timeout=0.2",
    "zookeepers": f"zookeepers://alice:{SECRET}@127.0.0.1:1/app?ca=/etc/hostname"
    f"&keyfile_password={SECRET}&connect_timeout=0.2",
    "sqlite": f"sqlite:///locks.sqlite3?password={SECRET}",
}
#: the same stores' URLs that are wrong in a way the URL parser or the store refuses (exit 2)
BAD_FORMS = {
    "postgresql": f"postgresql://u:{SECRET}@127.0.0.1:x/db",
    "mysql": f"mysql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=nan",
    "redis": f"redis://u:{SECRET}@127.0.0.1:1/x",
    "etcd": f"etcd://u:{SECRET}@127.0.0.1:1?bogus=1",
    "zookeeper-user-info": f"zookeeper://alice:{SECRET}@127.0.0.1:x/app",
    "zookeeper-slash-in-password": f"zookeeper://alice:{SECRET}/x@127.0.0.1:1/app",
    "zookeeper-digest": f"zookeeper://127.0.0.1:1/app?digest=alice:{SECRET}&bogus=1",
    "zookeeper-admin": f"zookeeper://alice:{SECRET}@127.0.0.1:1/app?admin={SECRET}",
    "sqlite": f"sqlite:///locks.sqlite3?timeout=x&digest={SECRET}",
}
ALL_FORMS = [*FORMS.values(), *BAD_FORMS.values()]
ALL_IDS = [*FORMS, *(f"bad-{k}" for k in BAD_FORMS)]
_HIDDEN = (SECRET, quote(SECRET), ADMIN_DIGEST.split(":")[1], "Pw9-qs", "qs3cr3t")


def _assert_hidden(text: str) -> None:
    for part in _HIDDEN:
        assert part not in text, text


def _everything(exc: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    logged = [caplog.text, *(r.getMessage() for r in caplog.records)]
    logged += [
        "".join(traceback.format_exception(*r.exc_info)) for r in caplog.records if r.exc_info
    ]
    return _texts(exc) + "".join(logged)


@pytest.mark.parametrize("url", ALL_FORMS, ids=ALL_IDS)
def test_no_store_shows_a_secret_of_its_url(url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, the drivers' too
    with pytest.raises(dblock.DBLockError) as info:
        dblock.connect(url).close()
    _assert_hidden(_everything(info.value, caplog))
    assert "***" in str(info.value)


def test_a_quorum_shows_no_secret_of_its_members(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    urls = [FORMS["postgresql"], FORMS["redis"], FORMS["zookeeper-digest"]]
    with pytest.raises(dblock.DBLockError) as info:
        dblock.connect(urls).close()
    _assert_hidden(_everything(info.value, caplog))


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("url", ALL_FORMS, ids=ALL_IDS)
def test_the_command_line_shows_no_secret(
    url: str, debug: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """--url's error path (a URL the parser refuses), an unreachable store, --debug's log
    lines and tracebacks: in-process, as a subprocess would print them."""
    from dblock.cli import main

    status = main([*(["--debug"] if debug else []), "--url", url, "list"])
    out, err = capsys.readouterr()
    assert status in (2, 69), err
    _assert_hidden(out + err)
    assert "***" in err


def test_the_command_line_shows_no_secret_of_a_quorum(capsys: pytest.CaptureFixture[str]) -> None:
    from dblock.cli import main

    urls = [FORMS["mysql"], FORMS["zookeeper"], FORMS["etcd"]]
    status = main(["--debug", *(a for u in urls for a in ("--url", u)), "list"])
    out, err = capsys.readouterr()
    assert status == 69, err
    _assert_hidden(out + err)


def test_a_parsed_url_repr_shows_no_secret() -> None:
    from dblock.stores._registry import parse_url

    for url in [*FORMS.values()]:
        _assert_hidden(repr(parse_url(url)))
