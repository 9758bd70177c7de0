"""Database URLs: parsing, the embedded default, and redaction for messages."""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import (
    SplitResult,
    parse_qsl,
    quote,
    quote_plus,
    unquote,
    unquote_plus,
    urlsplit,
)

from ._errors import ConfigurationError
from ._validate import MAX_CONNECTIONS

#: the longest connect or read timeout a URL may ask for, seconds
MAX_URL_TIMEOUT: Final = 3600

#: A query parameter whose name contains one of these (any case) is a secret: libpq's
#: ``password``/``sslpassword``/``passfile``, ``sslkey``, any token or key a driver may take,
#: and the credentials ZooKeeper's URL documents (``digest=user:password``, and ``admin``, whose
#: digest a password can be guessed from). Hiding a harmless one (a key file's path) costs
#: nothing; showing a secret cannot be undone.
SECRET_PARAM: Final = re.compile(
    r"pass|pwd|secret|token|key|credential|auth|digest|admin", re.IGNORECASE
)


def is_secret_param(name: str) -> bool:
    """True if the URL query parameter ``name`` may hold a secret (see ``SECRET_PARAM``)."""
    return SECRET_PARAM.search(name) is not None


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed database URL. ``safe`` is the URL with every secret (the password, and the
    value of every query parameter named like a secret) replaced by ``***``."""

    # the URL as given, its password and parameters: out of repr(), as they hold secrets
    raw: str = field(repr=False)
    dialect: str
    safe: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str = ""
    query: dict[str, str] = field(default_factory=dict, repr=False)
    #: ``?max_connections=N``: the pool's bound (taken out of ``query``; None: not given)
    max_connections: int | None = None
    #: the embedded default: its directory and files are kept private to this user
    private: bool = False

    @property
    def secrets(self) -> tuple[str, ...]:
        """The secret values this URL carries, to scrub from any text shown to a user."""
        found = [v for k, v in self.query.items() if is_secret_param(k) and v]
        return (self.password, *found) if self.password else tuple(found)


def default_url() -> str:
    """``DBLOCK_URL``, else the embedded SQLite file in the user's state directory."""
    env = os.environ.get("DBLOCK_URL")
    if env:
        return env
    return embedded_url()


def quorum_urls(url: object) -> list[str] | None:
    """The member URLs of a quorum client, or None for a single store.

    A quorum is a list (or tuple) of URLs, or a string of URLs separated by whitespace (so
    ``DBLOCK_URL`` and ``url=None`` may name one): each part must have a scheme (``://``), so
    a single SQLite path with a space in it stays one URL. A quorum needs at least three
    distinct stores.
    """
    if url is None:
        url = os.environ.get("DBLOCK_URL") or None
        if url is None:
            return None
    urls: list[str]
    if isinstance(url, str):
        parts = url.split()
        if len(parts) < 2 or not all("://" in p for p in parts):
            return None
        urls = parts
    elif isinstance(url, (list, tuple)):
        if not all(isinstance(u, str) for u in url):
            raise TypeError("a quorum's URLs must be str")
        urls = [u.strip() for u in url]
    else:
        return None  # a SQLAlchemy engine, or a type that parse_url refuses
    if len(urls) < 3:
        raise ConfigurationError(
            f"a quorum needs at least three store URLs, got {len(urls)}: "
            + " ".join(redact(u) for u in urls)
        )
    if len(set(urls)) < len(urls):
        raise ConfigurationError(
            "a quorum's stores must be independent: a URL is given twice in "
            + " ".join(redact(u) for u in urls)
        )
    return urls


def embedded_url() -> str:
    """The embedded default: an SQLite file in the user's state directory (XDG)."""
    from pathlib import Path  # here: a command given its URL starts without it

    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return "sqlite:///" + str(Path(state) / "dblock" / "locks.sqlite3")


def redact(url: str) -> str:
    """The URL with anything that may be a secret replaced by ``***``.

    It does not trust a URL parser (malformed URLs are exactly where parsers and drivers
    disagree). First the value of every parameter named like a secret goes, up to the next
    ``&``, wherever it stands (a value may hold ``@``, a password ``?``); then everything
    between the first ``:`` of the user part and the last ``@``.
    """
    url = _SECRET_PARAM.sub(_hide_param, url)
    head, at, tail = url.rpartition("@")
    if at:
        start = head.find("//") + 2 if "//" in head else head.find(":") + 1
        colon = head.find(":", start)
        if colon >= 0:
            url = f"{head[: colon + 1]}***@{tail}"
    return url


#: ``name=value`` after ``?`` or ``&``, the value up to the next ``&``
_SECRET_PARAM = re.compile(r"(?<=[?&])([^=&?#]+)=([^&]*)")


def _hide_param(match: re.Match[str]) -> str:
    name = match.group(1)
    return f"{name}=***" if is_secret_param(unquote_plus(name)) else match.group(0)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (as given, or percent-encoded as in a URL) replaced by ``***``."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        if not secret:
            continue
        for form in {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}:
            text = text.replace(form, "***")
    return text


def scrub_exception(exc: BaseException, secrets: Iterable[str]) -> None:
    """Scrub secrets from the string arguments of ``exc`` and of its causes, in place: a
    driver's exception travels as the ``__cause__`` of dblock's, and a logged traceback
    shows its text (libpq may quote parts of the connection string)."""
    values = tuple(s for s in secrets if s)
    seen: set[int] = set()
    current: BaseException | None = exc
    while values and current is not None and id(current) not in seen:
        seen.add(id(current))
        # an exception type that forbids it is left alone
        with contextlib.suppress(AttributeError, TypeError):
            current.args = tuple(
                scrub(a, values) if isinstance(a, str) else a for a in current.args
            )
        if isinstance(current, OSError):  # its message shows the file names (a key file's)
            for name in ("filename", "filename2"):
                value = getattr(current, name, None)
                if isinstance(value, str):
                    setattr(current, name, scrub(value, values))
        current = current.__cause__ or current.__context__


def url_number(
    raw: str | None,
    name: str,
    default: float,
    *,
    safe: str,
    minimum: float,
    maximum: float,
    integer: bool = False,
) -> float:
    """The value ``raw`` of the URL query parameter ``name`` as a number in [minimum, maximum]
    (``default`` if absent); ConfigurationError naming the parameter otherwise (nan, inf,
    junk, out of range). ``safe`` is the redacted URL, for the message."""
    if raw is None:
        return default
    kind = "a whole number" if integer else "a number"
    try:
        value = float(int(raw, 10)) if integer else float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not minimum <= value <= maximum:
        shown = "***" if is_secret_param(name) else raw
        raise ConfigurationError(
            f"URL parameter {name}={shown!r} in {safe!r} must be {kind} from {minimum:g} to "
            f"{maximum:g}"
        )
    return value


def checked_url(url: str | None) -> tuple[str, str]:
    """``url`` (None: the default) and its redacted form, once it is a str without control
    characters; the first checks of ``dblock.tools.parse_url``."""
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, not {type(url).__name__}")
    safe = redact(url)
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ConfigurationError(f"database URL {safe!r} contains control characters")
    return url, safe


def split_url(url: str, safe: str) -> tuple[SplitResult, int | None, dict[str, str], int | None]:
    """A one-host URL's parts, its port, its query without ``max_connections``, and that
    (the pool's bound, checked; None if not given)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # urllib's message would quote the bad part, which may be the password
        raise ConfigurationError(
            f"invalid database URL {safe!r}: the host:port part does not parse; "
            "percent-encode '/', '?', '#', '@' and ':' in the user name and password"
        ) from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    pool = query.pop("max_connections", None)
    max_connections = None
    if pool is not None:
        max_connections = int(
            url_number(
                pool,
                "max_connections",
                0,
                safe=safe,
                minimum=1,
                maximum=MAX_CONNECTIONS,
                integer=True,
            )
        )
    return parts, port, query, max_connections


def server_url(url: str, dialect: str, safe: str) -> DatabaseURL:
    """``scheme://user:password@host:port/database?query``: a store on one server."""
    parts, port, query, max_connections = split_url(url, safe)
    return DatabaseURL(
        url,
        dialect,
        safe,
        host=parts.hostname,
        port=port,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=unquote(parts.path.lstrip("/")),
        query=query,
        max_connections=max_connections,
    )


def endpoints_url(url: str, dialect: str, safe: str) -> DatabaseURL:
    """A URL of several endpoints: ``host`` is the ``host:port[,host:port...]`` list as given."""
    parts = urlsplit(url)
    user, at, hosts = parts.netloc.rpartition("@")
    name, colon, password = user.partition(":")
    return DatabaseURL(
        url,
        dialect,
        safe,
        host=hosts,
        user=unquote(name) if at and name else None,
        password=unquote(password) if at and colon else None,
        database=unquote(parts.path.lstrip("/")),
        query=dict(parse_qsl(parts.query, keep_blank_values=True)),
    )
