"""``dblock run`` stops CMD when its lease is lost because the database is out of reach.

The outage (each provider's ``outage`` hook, tests/providers.py) touches nothing but this
test's own table or database (``own_store``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.providers import Provider

from .conftest import Dblock, alive, finish, wait_for

TTL = "1"


@contextmanager
def own_database(provider: Provider, cli: Dblock) -> Iterator[Dblock]:
    """A runner on a store of the test's own (``outage`` may break it for everyone)."""
    with provider.own_store() as url:
        if url == cli.url:
            yield cli
            return
        runner = Dblock(url, cli.table, cli.work)
        try:
            yield runner
        finally:
            runner.cleanup()


@pytest.mark.slow
@pytest.mark.needs("outage")
def test_lease_loss_stops_cmd(provider: Provider, cli: Dblock, key: str) -> None:
    with own_database(provider, cli) as runner:
        proc = runner.start("run", "--ttl", TTL, key, *runner.child("sleep"))
        wait_for(runner.ready_pids, what="CMD to start")
        (pid,) = runner.ready_pids()
        with provider.outage(runner.url, runner.table):
            status, _, err = finish(runner, proc)
            assert status == 70, err
            assert "lost the lease" in err
            assert not alive(pid)
        assert "Traceback" not in err
        # the lease ran out: the next run gets the key
        again = runner.run("run", "--timeout", "10", key, "--", "true")
        assert again.returncode == 0, again.stderr


def test_force_release_stops_cmd(cli: Dblock, key: str) -> None:
    proc = cli.start("run", "--ttl", "2", key, *cli.child("sleep"))
    wait_for(cli.ready_pids, what="CMD to start")
    (pid,) = cli.ready_pids()
    refused = cli.run("release", key)
    assert refused.returncode == 2
    assert "--force" in refused.stderr
    released = cli.run("release", key, "--force")
    assert released.returncode == 0, released.stderr
    assert key in released.stdout
    status, _, err = finish(cli, proc)
    assert status == 70, err
    assert not alive(pid)
    assert cli.run("release", key, "--force").returncode == 1
