"""A forked child calls etcd through a gRPC client of its own, never the parent's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import dblock
from tests._forked import wrong_in_child
from tests._internals import store_of

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def test_a_forked_child_makes_its_own_grpc_client(url: str, table: str) -> None:
    # gRPC closes the parent's connections in a child: a call that raced their reconnection
    # failed with "Stream removed (Closed on fork)" (about 1 fork in 200 here)
    with dblock.connect(url, table=table) as client, client.lock("k", ttl=30) as lock:
        rpc = store_of(client).rpc
        parents = rpc.client()

        def in_child() -> str:
            own = rpc.client()
            if own is parents:
                return "the child called through the parent's client"
            if client.lock("k").acquire(blocking=False):
                return "the child took the parent's lock"
            if rpc.client() is not own:
                return "the child's client was replaced again"
            return ""

        assert wrong_in_child(in_child) == ""
        assert rpc.client() is parents  # the parent's own client lives on, its hold too
        assert lock.held and client.lock("k").locked()


_FORKS_FOR_CMD = """
import collections, json, sys
from dblock.cli import environment, supervisor
environment.set_up_own_process()  # what the dblock executable does first
import dblock
client = dblock.connect(sys.argv[1], table=sys.argv[2])
statuses = collections.Counter()
with client.lock("k", ttl=2, auto_renew=True):  # gRPC busy: renewals
    for _ in range(int(sys.argv[3])):
        child = supervisor.Child(["true"])
        statuses[child.process.wait()] += 1
print(json.dumps(statuses))
"""


# alone: its hogs take every CPU for most of a minute, which the parallel part's tests of
# timing (a quorum's answer window, a lease) would feel
@pytest.mark.serial
def test_the_executables_forks_for_cmd_survive_grpc(url: str, table: str) -> None:
    # gRPC's fork support restarted its poller in the child forked for CMD; the close of
    # every descriptor before exec then aborted it now and then (SIGABRT: 6 children in 1000
    # here on busy CPUs; `dblock run` exited 134 without running CMD)
    # the child's poller must call epoll_wait after the close: busy CPUs delay it that long
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FORKS_FOR_CMD, url, table, "1000"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"0": 1000}, done.stderr[-2000:]
