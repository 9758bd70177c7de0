"""The public surface is what the README documents, and `import dblock` stays light."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys

import pytest

import dblock

API_NAMES = {
    "connect",
    "connect_async",
    "Client",
    "Lock",
    "LockInfo",
    "LeaderInfo",
    "DBLockError",
    "LockTimeout",
    "NotHeld",
    "LockLost",
    "InProgress",
    "AlreadyDone",
    "ConfigurationError",
    "BackendError",
}


def test_exports_are_the_contract() -> None:
    assert set(dblock.__all__) - {"__version__"} == API_NAMES
    for name in API_NAMES:
        assert getattr(dblock, name).__module__ == "dblock", name


def test_error_tree() -> None:
    assert issubclass(dblock.LockTimeout, dblock.DBLockError)
    assert issubclass(dblock.LockTimeout, TimeoutError)
    assert issubclass(dblock.NotHeld, RuntimeError)
    assert issubclass(dblock.LockLost, dblock.NotHeld)
    assert issubclass(dblock.ConfigurationError, ValueError)
    for cls in (dblock.InProgress, dblock.AlreadyDone, dblock.BackendError):
        assert issubclass(cls, dblock.DBLockError)


@pytest.mark.parametrize("cls", [dblock.LockLost, dblock.LockTimeout, dblock.BackendError])
def test_errors_pickle_with_their_key(cls: type[dblock.DBLockError]) -> None:
    err = pickle.loads(pickle.dumps(cls("boom on 'k'", key="k")))
    assert type(err) is cls
    assert (str(err), err.key) == ("boom on 'k'", "k")


def test_connect_async_takes_what_connect_takes() -> None:
    assert inspect.iscoroutinefunction(dblock.connect_async)
    assert inspect.signature(dblock.connect_async).parameters.keys() == (
        inspect.signature(dblock.connect).parameters.keys()
    )
    # the async classes, for annotations, load asyncio only when asked for
    assert dblock.AsyncClient.__name__ == "AsyncClient"
    assert dblock.AsyncLock.__name__ == "AsyncLock"


def test_signatures() -> None:
    connect = inspect.signature(dblock.connect)
    assert list(connect.parameters)[:3] == ["url", "table", "create_schema"]
    # options added since are keyword-only, after the contract's
    assert list(connect.parameters)[3:] == ["max_connections"]
    assert connect.parameters["max_connections"].kind is inspect.Parameter.KEYWORD_ONLY
    assert connect.parameters["table"].default == "dblock_locks"
    lock = inspect.signature(dblock.Client.lock)
    assert list(lock.parameters)[1:] == [
        "key", "ttl", "timeout", "reentrant", "auto_renew", "fair", "on_lost",
    ]  # fmt: skip
    assert lock.parameters["ttl"].default == 30.0
    acquire = inspect.signature(dblock.Lock.acquire)
    assert list(acquire.parameters)[1:] == ["blocking", "timeout"]
    purge = inspect.signature(dblock.Client.purge)
    assert purge.parameters["include_once"].kind is inspect.Parameter.KEYWORD_ONLY


def test_import_loads_no_driver_and_no_cli_toolkit() -> None:
    # nor asyncio: the blocking client must not pay for the event loop it does not use
    code = (
        "import sys, dblock; "
        "heavy = {'psycopg', 'pymysql', 'click', 'rich', 'asyncio', 'greenlet', 'aiomysql',"
        " 'sqlalchemy'}"
        " & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
