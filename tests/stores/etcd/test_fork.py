"""A forked child calls etcd through a gRPC client of its own, never the parent's."""

from __future__ import annotations

import os

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
