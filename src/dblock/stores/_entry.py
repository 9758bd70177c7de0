"""What the registry knows of a store without importing it: one :class:`StoreEntry`, in its
package's ``__init__`` (built-in stores) or behind an entry point of the ``dblock.stores``
group (a store of another distribution). Nothing here imports a driver."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .._errors import ConfigurationError

if TYPE_CHECKING:
    from .._contract import Store
    from .._url import DatabaseURL

#: ``parse(url, dialect, safe)``: the URL as the store reads it (``safe``: redacted, for
#: messages); raises ConfigurationError naming what is wrong
URLParser = Callable[[str, str, str], "DatabaseURL"]
#: a store class as the registry calls it: ``(url, schema, table)``
Opener = Callable[["DatabaseURL", "str | None", str], "Store"]


@dataclass(frozen=True)
class StoreEntry:
    """One store, as URL parsing, opening a store, ``dblock schema``, the wheel's smoke test,
    the architecture test and the docs tables see it."""

    #: the store's name: a parsed URL's ``dialect``, its package, its docs page
    name: str
    #: how the docs and messages name it ("PostgreSQL")
    title: str
    #: the URL schemes that reach it, the first being the canonical one
    schemes: tuple[str, ...]
    #: the URL's form, for the message that refuses an unknown scheme
    usage: str
    #: ``"module:Class"`` of the store class (imported only when a URL of it is opened)
    store: str
    #: reads a URL of one of ``schemes``
    parse: URLParser
    #: the extra that installs its driver (``pip install 'dblock[extra]'``); None: the
    #: standard library's
    extra: str | None = None
    #: the modules its extra installs, which ``import dblock`` must never load
    drivers: tuple[str, ...] = ()
    #: the asyncio driver it uses under ``connect_async``, where it has one of its own (an
    #: extra of its own installs it: ``mysql-async``)
    async_drivers: tuple[str, ...] = ()
    #: a URL that opens the store without connecting, to print its DDL (``dblock schema``);
    #: None: the store needs no DDL
    ddl_url: str | None = None
    #: the classes of a client the application holds that may stand in for a URL
    #: (``"module.Class"``; a subclass counts as its base), borrowed by ``borrow``
    clients: tuple[str, ...] = ()
    #: ``"module:function"``: ``(client, schema, table, max_connections, runtime)`` -> the
    #: store on that client
    borrow: str | None = None
    #: how messages name the clients it takes ("a redis.Redis")
    client_help: str = ""
    #: classes refused with a reason of their own: (``"module.Class"``, why)
    client_refusals: tuple[tuple[str, str], ...] = ()
    #: ``"module:function"``: ``(url)`` -> None, or ConfigurationError for a URL parameter
    #: the store does not take, judged without connecting (None: its driver judges them)
    check_parameters: str | None = None

    def load(self) -> type[Store]:
        """The store class; a ConfigurationError naming the extra if its driver is missing."""
        module_name, _, class_name = self.store.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(
                f"the {self.name} store needs its driver ({exc.name}): "
                f"pip install 'dblock[{self.extra}]'"
            ) from exc
        cls: type[Store] = getattr(module, class_name)
        return cls

    def open(self, url: DatabaseURL, schema: str | None, table: str) -> Store:
        """A new store on ``url``'s lock table ``table`` (in ``schema``, where it has them)."""
        return cast(Opener, self.load())(url, schema, table)
