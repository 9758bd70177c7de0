"""A forked child calls etcd through a gRPC client of its own, never the parent's."""

from __future__ import annotations

import os

import pytest

import dblock
from tests._internals import store_of

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def test_a_forked_child_makes_its_own_grpc_client(url: str, table: str) -> None:
    # gRPC closes the parent's connections in a child: a call that raced their reconnection
    # failed with "Stream removed (Closed on fork)" (about 1 fork in 200 here)
    with dblock.connect(url, table=table) as client, client.lock("k", ttl=30) as lock:
        rpc = store_of(client).rpc
        parents = rpc.client()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            wrong = "the child failed"
            try:
                own = rpc.client()
                if own is parents:
                    wrong = "the child called through the parent's client"
                elif client.lock("k").acquire(blocking=False):
                    wrong = "the child took the parent's lock"
                elif rpc.client() is not own:
                    wrong = "the child's client was replaced again"
                else:
                    wrong = ""
            except BaseException as exc:  # reported to the parent, which fails the test
                wrong = f"the child raised {type(exc).__name__}: {exc}"
            finally:
                os.write(write, wrong.encode()[:2000] or b"-")
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        said = os.read(read, 4096)
        os.close(read)
        assert said == b"-"
        assert rpc.client() is parents  # the parent's own client lives on, its hold too
        assert lock.held and client.lock("k").locked()
