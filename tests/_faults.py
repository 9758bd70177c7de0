"""Server-side faults for tests: kill a client's connections from the database side."""

from __future__ import annotations

from typing import Any

import dblock
from tests._internals import store_of
from tests._servers import raw_connect


def session_ids(client: dblock.Client) -> list[int]:
    """Server-side ids of the client's pooled connections (reaches into the pool: tests only)."""
    backend: Any = store_of(client)
    ids = []
    for conn in list(backend._idle):
        if client.dialect == "postgresql":
            ids.append(conn.pgconn.backend_pid)  # a psycopg connection, or its async adapter
        elif client.dialect == "mysql":
            ids.append(conn.thread_id())
    return ids


def kill_sessions(client: dblock.Client, url: str) -> int:
    """Terminate every pooled connection of ``client`` from the server side; return how many."""
    conn = raw_connect(url)
    if client.dialect == "redis":
        # its connections carry the store's own name; the pub/sub listener ('P') is spared
        name = store_of(client)._options["client_name"]
        found = conn.client_list()
        ids = [c["id"] for c in found if c.get("name") == name and "P" not in c["flags"]]
    else:
        ids = session_ids(client)
    try:
        cur = None if client.dialect == "redis" else conn.cursor()
        for sid in ids:
            if client.dialect == "redis":
                conn.client_kill_filter(_id=sid)
            elif client.dialect == "postgresql":
                cur.execute("SELECT pg_terminate_backend(%s)", (sid,))
            else:
                try:
                    cur.execute(f"KILL {int(sid)}")
                except Exception as exc:  # 1094: already gone (killed before, not yet reused)
                    if exc.args[0] != 1094:
                        raise
    finally:
        conn.close()
    return len(ids)
