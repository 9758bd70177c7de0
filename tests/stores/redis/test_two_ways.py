"""The store's own tests run twice (conftest's ``operations``): this one shows each run calls
the operations the way it names."""

from __future__ import annotations

import dblock
from tests._private_servers import PrivateServer
from tests._servers import raw_redis
from tests.stores.redis.conftest import command_calls


def test_each_run_calls_the_operations_the_way_it_names(
    server: PrivateServer, operations: str
) -> None:
    raw = raw_redis(server.url)
    with dblock.connect(server.url, table="ways") as client:
        raw.config_resetstat()
        with client.lock("k"):
            pass
        calls = command_calls(raw)
    raw.close()
    used, unused = ("fcall", "evalsha") if operations == "functions" else ("evalsha", "fcall")
    assert calls.get(used, 0) >= 2
    assert unused not in calls
