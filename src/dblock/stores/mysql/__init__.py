"""The MySQL / MariaDB store: a lock table, ``GET_LOCK`` session holds, a doorbell per key
for its waiters, on PyMySQL (aiomysql under asyncio).

``store.py`` is the store, ``statements.py`` its statements, ``session.py`` its session
holds, ``doorbell.py`` its wake-ups, ``green.py`` aiomysql behind PyMySQL's interface. This
module holds only the registry's entry (no driver is imported here)."""

from __future__ import annotations

from ..._url import server_url
from .._entry import StoreEntry

ENTRY = StoreEntry(
    name="mysql",
    title="MySQL / MariaDB",
    schemes=("mysql", "mariadb"),
    usage="mysql://user:password@host:port/db",
    store="dblock.stores.mysql.store:MysqlStore",
    parse=server_url,
    extra="mysql",
    check_parameters="dblock.stores.mysql.store:check_parameter_names",
    drivers=("pymysql",),
    async_drivers=("aiomysql",),
    ddl_url="mysql://localhost/db",
)
