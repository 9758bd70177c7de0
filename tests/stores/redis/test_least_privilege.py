"""A Redis user with only the permissions docs/stores/redis.md lists ("Least privilege") runs
every kind of hold, the waits and hand-overs between clients, the inspections and the
maintenance, as functions (FCALL): nothing is refused, and nothing falls back to scripts.
The same list without ``function|load`` works once an admin has loaded the library."""

from __future__ import annotations

import pytest

import dblock
from tests._private_servers import PrivateServer
from tests._servers import raw_redis
from tests.stores._least_privilege import documented, every_kind
from tests.stores.redis.conftest import command_calls


def _documented_rules() -> list[str]:
    """The rules of docs/stores/redis.md's ``ACL SETUSER locks on >password ...`` line."""
    lines = documented("redis.md", "ACL SETUSER locks on ")
    assert len(lines) == 1, "docs/stores/redis.md lists the permissions on one line"
    words = lines[0].split()
    return words[words.index(">password") + 1 :]


#: the documented permissions, for tables under dblock:*
RULES = _documented_rules()


@pytest.fixture
def operations() -> str:
    """The user's own permissions decide how operations run."""
    return "functions"


def _everything(url: str) -> None:
    with dblock.connect(url, table="app") as a, dblock.connect(url, table="app") as b:
        every_kind(a, b)


def _as_user(server: PrivateServer, rules: list[str]) -> dict[str, int]:
    """Run ``_everything`` as a user with ``rules``: the commands the server ran, once it is
    checked that the server refused the user nothing (``ACL LOG``: a refusal that dblock
    survives, as a pub/sub channel it falls back from, shows there too)."""
    raw = raw_redis(server.url)
    try:
        raw.execute_command("ACL", "SETUSER", "locks", "reset", "on", ">pw", *rules)
        raw.config_resetstat()
        raw.execute_command("ACL", "LOG", "RESET")
        _everything(server.url.replace("redis://", "redis://locks:pw@"))
        refused = raw.execute_command("ACL", "LOG")
        assert not refused, refused
        return command_calls(raw)
    finally:
        raw.close()


def test_the_documented_permissions_run_everything_as_functions(server: PrivateServer) -> None:
    calls = _as_user(server, RULES)
    assert calls.get("fcall", 0) > 10, calls
    assert calls.get("subscribe", 0) >= 1, "waiters and holders hear releases"
    assert "evalsha" not in calls and "eval" not in calls, "fell back to scripts"


def test_without_function_load_once_an_admin_loaded_the_library(server: PrivateServer) -> None:
    with dblock.connect(server.url, table="admin") as admin, admin.lock("load", ttl=5):
        pass  # an admin's first call loads the library
    calls = _as_user(server, [r for r in RULES if r != "+function|load"])
    assert calls.get("fcall", 0) > 10, calls
    assert "function|load" not in calls and "evalsha" not in calls, calls
