"""How dblock uses PyMySQL: things a wrong setup would make slow rather than wrong."""

from __future__ import annotations

import ssl
import uuid

import dblock
from tests._internals import store_of
from tests._servers import MYSQL_URL, drop_tables, require_server


def test_connections_share_one_default_tls_context() -> None:
    # PyMySQL builds a TLS context per connection by default, loading the CA certificates
    # each time: a new process's or a waiter's first connection would pay for it on the spot
    require_server("mysql", MYSQL_URL)
    table = "t_" + uuid.uuid4().hex[:16]
    try:
        with dblock.connect(MYSQL_URL, table=table) as client:
            backend = store_of(client)
            first, second = backend._connect(), backend._connect()  # type: ignore[attr-defined]
            try:
                assert first.ctx is not None, "PyMySQL no longer offers TLS by default"
                assert first.ctx is second.ctx
                # as PyMySQL's default, and without the CA certificates it loads and never
                # reads (20 ms of a cold start)
                assert first.ctx.verify_mode == ssl.CERT_NONE
                assert first.ctx.check_hostname is False
                assert first.ctx.cert_store_stats()["x509_ca"] == 0
            finally:
                first.close()
                second.close()
    finally:
        drop_tables(MYSQL_URL, table)
