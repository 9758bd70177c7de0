"""LockedTask's options and keys, checked in this process (no worker): what a wrong
definition raises, which calls share a key, and the token and skip marker of a direct call."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from celery import Celery

import dblock
from dblock.contrib.celery import LockedTask, skipped


@pytest.fixture
def client(tmp_path: Path) -> Iterator[dblock.Client]:
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as c:
        yield c


@pytest.fixture
def app() -> Celery:
    return Celery(f"app_{uuid.uuid4().hex[:8]}", set_as_current=False)


def _define(app: Celery, fn: Any, **options: Any) -> Any:
    task = app.task(base=LockedTask, shared=False, **options)(fn)  # this app only
    assert task.name  # a lazily made task is made (and its options checked) here
    return task


def test_importing_dblock_and_its_contrib_package_loads_no_celery() -> None:
    code = (
        "import sys, dblock, dblock.contrib; print(sorted(m for m in sys.modules if 'celery' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_celery_the_module_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['celery'] = None\n"
        "try:\n    import dblock.contrib.celery\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "ConfigurationError dblock.contrib.celery needs Celery: pip install 'dblock[celery]'"
    )


def test_the_same_call_gives_the_same_key_however_its_arguments_are_passed(app: Celery) -> None:
    def settle(order_id: int, amount: float = 1.0, dblock_token: int | None = None) -> None: ...

    task = _define(app, settle)
    key = task.dblock_key_for(42)
    assert key == task.dblock_key_for(order_id=42) == task.dblock_key_for(42, 1.0)
    assert key == f'celery:{task.name}:{{"amount": 1.0, "order_id": 42}}'
    assert task.dblock_key_for(43) != key
    assert task.dblock_key_for(42, 2.0) != key
    long = task.dblock_key_for("x" * 1000)
    assert len(long) <= 255
    assert long.startswith(f"celery:{task.name}:sha256:")
    assert task.dblock_key_for("x" * 1001) != long


def test_a_template_or_a_function_makes_the_key(app: Celery) -> None:
    def settle(order_id: int, amount: float) -> None: ...

    by_template = _define(app, settle, name="t1", dblock_key="settle:{order_id}")
    assert by_template.dblock_key_for(7, 1.0) == by_template.dblock_key_for(7, amount=2.0)
    assert by_template.dblock_key_for(7, 1.0) == "settle:7"
    by_function = _define(
        app, settle, name="t2", dblock_key=lambda order_id, amount: f"o{order_id}"
    )
    assert by_function.dblock_key_for(7, amount=1.0) == "o7"
    not_text = _define(app, settle, name="t3", dblock_key=lambda order_id, amount: order_id)
    with pytest.raises(TypeError, match="lock key must be a str"):
        not_text.dblock_key_for(7, 1.0)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"dblock_key": "settle:{order}"}, dblock.ConfigurationError, r"names \['order'\]"),
        ({"dblock_busy": "block"}, dblock.ConfigurationError, "skip, retry, wait"),
        ({"dblock_once": True, "dblock_busy": "wait"}, dblock.ConfigurationError, "once-task"),
        ({"dblock_ttl": 0}, ValueError, "dblock_ttl"),
        ({"dblock_countdown": -1}, ValueError, "dblock_countdown"),
        ({"dblock_timeout": "5"}, TypeError, "dblock_timeout"),
        ({"dblock_key": 5}, TypeError, "dblock_key"),
    ],
)
def test_a_wrong_option_is_refused_when_the_task_is_defined(
    app: Celery, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    def settle(order_id: int) -> None: ...

    with pytest.raises(error, match=message):
        _define(app, settle, **options)


def test_a_direct_call_gets_its_token_and_skips_a_key_held_elsewhere(
    app: Celery, client: dblock.Client
) -> None:
    def settle(order_id: int, dblock_token: int | None = None) -> int | None:
        return dblock_token

    task = _define(app, settle, dblock_client=client, dblock_key="settle:{order_id}")
    first = task(1)
    assert isinstance(first, int)
    assert task(order_id=1) > first
    with client.lock("settle:1", ttl=30):  # another owner (the task's lock is not re-entrant)
        marker = task(1)
    assert skipped(marker)
    assert marker == {"dblock": "skipped", "key": "settle:1", "reason": "busy"}
    with pytest.raises(TypeError, match="dblock_token is given by dblock"):
        task(1, dblock_token=5)


def test_a_body_without_the_token_parameter_runs_without_it(
    app: Celery, client: dblock.Client
) -> None:
    def settle(order_id: int) -> int:
        return order_id * 2

    task = _define(app, settle, dblock_client=client)
    assert task(21) == 42
    assert client.list() == []  # released after the call


def test_a_task_class_with_its_own_run_is_checked_and_locks_the_same(
    app: Celery, client: dblock.Client
) -> None:
    class Settle(LockedTask):  # type: ignore[misc]
        dblock_key = "settle:{order_id}"

        def run(self, order_id: int, dblock_token: int | None = None) -> int | None:
            return dblock_token

    Settle.dblock_client = client
    task = app.register_task(Settle())
    assert task.dblock_key_for(order_id=3) == "settle:3"
    assert isinstance(task(3), int)
    with client.lock("settle:3", ttl=30):
        assert skipped(task(3))
    with pytest.raises(dblock.ConfigurationError, match="names"):

        class Wrong(LockedTask):  # type: ignore[misc]
            dblock_key = "settle:{order}"

            def run(self, order_id: int) -> None: ...


def test_a_task_without_a_key_of_its_own_is_keyed_by_its_registered_name(app: Celery) -> None:
    class Report(LockedTask):  # type: ignore[misc]
        name = "reports.nightly"

        def run(self, day: str) -> None: ...

    task = app.register_task(Report())
    assert task.dblock_key_for("2026-11-26") == 'celery:reports.nightly:{"day": "2026-11-26"}'
