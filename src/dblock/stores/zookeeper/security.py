"""ZooKeeper in production: who the client is, what every node it makes lets others do, TLS,
and kazoo's log kept quiet and free of secrets (docs/stores/zookeeper.md, "Authentication, ACLs
and TLS").

- ``zookeeper://user:password@hosts/chroot`` (or ``?digest=user:password``): digest
  authentication. ``?sasl=DIGEST-MD5`` or ``?sasl=GSSAPI``: SASL instead (kazoo, with
  pure-sasl).
- With an identity, every node dblock creates carries an ACL that gives that identity, and
  the ``?admin=`` identity if one is named, every permission, and nobody else any: ZooKeeper
  checks a delete against the parent's ACL, so a key's holds (its children) can be deleted
  or joined by those two only. Set at create (kazoo's ``default_acl``): no extra request.
- ``zookeepers://`` or ``?tls=true``: TLS, with ``ca``, ``certfile``, ``keyfile``,
  ``keyfile_password``, ``verify_certs`` and ``check_hostname`` as kazoo takes them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib.util
import logging
import os
import ssl
import sys
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, CREATOR_ALL_ACL, Id, Permissions, make_digest_acl

from ..._errors import ConfigurationError
from ..._runtime import THREADS
from ..._url import DatabaseURL, scrub, scrub_exception

#: the URL parameters this module reads (the store reads its timeouts itself)
PARAMS = frozenset(
    {
        "digest",
        "sasl",
        "admin",
        "tls",
        "ca",
        "certfile",
        "keyfile",
        "keyfile_password",
        "verify_certs",
        "check_hostname",
    }
)
_TLS_ONLY = frozenset({"ca", "certfile", "keyfile", "keyfile_password"})
_SASL = ("DIGEST-MD5", "GSSAPI")
_ADMIN_SCHEMES = ("digest", "sasl", "x509", "ip")
HELP = (
    "digest=user:password, sasl (DIGEST-MD5, GSSAPI), admin (digest:USER:HASH, sasl:PRINCIPAL, "
    "x509:DN or ip:ADDRESS), tls (true, false), and with TLS ca, certfile, keyfile, "
    "keyfile_password, verify_certs, check_hostname (true, false)"
)

log = logging.getLogger("dblock.zookeeper")


@dataclass(frozen=True)
class Security:
    """What a ZooKeeper URL asks for: ``kazoo`` holds KazooClient's keywords."""

    #: whom the client authenticates as (its user name or SASL mechanism), for messages
    identity: str | None = None
    kazoo: dict[str, Any] = field(default_factory=dict)


def _flag(url: DatabaseURL, name: str, default: bool) -> bool:
    raw = url.query.get(name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise ConfigurationError(
            f"URL parameter {name}={raw!r} in {url.safe!r} must be true or false"
        )
    return raw.lower() == "true"


def _admin(url: DatabaseURL, raw: str) -> ACL:
    """The ``admin`` parameter as an ACL entry with every permission."""
    # a query string reads an unencoded '+' as a space, and base64 has '+' but never a space
    raw = raw.replace(" ", "+")
    scheme, _, rest = raw.partition(":")
    if scheme not in _ADMIN_SCHEMES:  # ops:HASH, the form kazoo's digest helper prints
        scheme, rest = "digest", raw
    user, _, digest = rest.rpartition(":") if scheme == "digest" else (rest, "", "")
    try:
        good = len(base64.b64decode(digest, validate=True)) == 20 if scheme == "digest" else True
    except binascii.Error:
        good = False
    if not rest or (scheme == "digest" and not user) or not good:
        raise ConfigurationError(
            f"URL parameter admin in {url.safe!r} must name the admin identity as ZooKeeper's "
            "ACLs do: digest:USER:HASH (HASH: base64 of the SHA-1 of USER:PASSWORD, as "
            "kazoo.security.make_digest_acl_credential prints it; never the password), "
            "sasl:PRINCIPAL, x509:DN or ip:ADDRESS (docs/stores/zookeeper.md)"
        )
    return ACL(Permissions.ALL, Id(scheme, rest))


def security(url: DatabaseURL) -> Security:
    """The identity, ACL and TLS settings of ``url``; ConfigurationError naming a bad one."""
    identity, acl, kazoo = _identity(url)
    if "admin" in url.query:
        if not acl:
            raise ConfigurationError(
                f"admin= in {url.safe!r} needs the client's own identity too (user:password@ "
                "or sasl=): without it nodes would be the admin's alone"
            )
        acl.append(_admin(url, url.query["admin"]))
    if acl:
        kazoo["default_acl"] = acl
    return Security(identity, kazoo | _tls(url))


def _credentials(url: DatabaseURL) -> tuple[str | None, str | None]:
    """The user and password: the URL's user info, or ``digest=user:password``."""
    user, password = url.user, url.password
    if "digest" in url.query:
        if user is not None:
            raise ConfigurationError(
                f"{url.safe!r} names its user twice: give user:password@ or digest=, not both"
            )
        user, colon, password = url.query["digest"].partition(":")
        password = password if colon else None
    if user is not None and password is None and "sasl" not in url.query:
        raise ConfigurationError(
            f"ZooKeeper URL {url.safe!r} names user {user!r} without a password: "
            "digest authentication takes user:password"
        )
    return user, password


def _identity(url: DatabaseURL) -> tuple[str | None, list[ACL], dict[str, Any]]:
    """Who the client is (for messages), the ACL that gives that identity every permission,
    and kazoo's keywords that authenticate it; nobody and no ACL without credentials."""
    user, password = _credentials(url)
    if "sasl" not in url.query:
        if user is None or password is None:
            return None, [], {}
        # the digest alone, not "auth" (every id of the session): on a TLS port the server
        # also authenticates the client's certificate, which others may share
        acl = [make_digest_acl(user, password, all=True)]
        return user, acl, {"auth_data": [("digest", f"{user}:{password}")]}
    mechanism = url.query["sasl"].upper()
    if mechanism not in _SASL:
        raise ConfigurationError(
            f"URL parameter sasl in {url.safe!r} must be one of {', '.join(_SASL)}"
        )
    if mechanism == "DIGEST-MD5" and (not user or password is None):
        raise ConfigurationError(f"sasl=DIGEST-MD5 needs user:password@ in {url.safe!r}")
    if importlib.util.find_spec("puresasl") is None:  # kazoo imports it only to connect
        raise ConfigurationError(
            f"sasl= in {url.safe!r} needs the pure-sasl package: pip install pure-sasl"
        )
    options = {"mechanism": mechanism}
    if mechanism == "DIGEST-MD5":
        options |= {"username": str(user), "password": str(password)}
    elif user:
        options["principal"] = user
    identity = f"{user} (SASL {mechanism})" if user else f"SASL {mechanism}"
    # the ids the server authenticated the session as: SASL names are the server's to map
    # (Kerberos realms), so they are not spelled out here
    return identity, list(CREATOR_ALL_ACL), {"sasl_options": options}


def _tls(url: DatabaseURL) -> dict[str, Any]:
    """kazoo's TLS keywords ({} without TLS)."""
    query = url.query
    tls = url.raw.lower().startswith("zookeepers:")
    if tls and query.get("tls", "true").lower() != "true":
        raise ConfigurationError(f"a zookeepers:// URL is TLS: drop tls= from {url.safe!r}")
    given = sorted(_TLS_ONLY & set(query))
    if not _flag(url, "tls", tls):
        if given:
            raise ConfigurationError(
                f"URL parameter(s) {given} in {url.safe!r} apply to TLS only: use "
                "zookeepers:// or tls=true"
            )
        return {}
    if ("certfile" in query) != ("keyfile" in query):
        raise ConfigurationError(
            f"{url.safe!r}: a client certificate takes both certfile= and keyfile="
        )
    for name in ("ca", "certfile", "keyfile"):
        if name in query and not os.path.isfile(query[name]):
            shown = "" if name == "keyfile" else f" {query[name]!r}"  # keyfile's is hidden
            raise ConfigurationError(f"URL parameter {name}:{shown} no such file")
    verify = _flag(url, "verify_certs", True)
    check = _flag(url, "check_hostname", verify)
    if check and not verify:
        raise ConfigurationError(f"check_hostname=true in {url.safe!r} needs verify_certs=true")
    return {
        "use_ssl": True,
        "verify_certs": verify,
        "check_hostname": check,
        **{k: query[k] for k in _TLS_ONLY if k in query},
    }


def refused(
    exc: NoAuthError, what: str, where: str, sec: Security, secrets: tuple[str, ...]
) -> ConfigurationError:
    """The error for a request ZooKeeper refused for want of permission (NoAuth): not a
    server that retrying would bring back, but a wrong password or another identity's nodes."""
    scrub_exception(exc, secrets)
    who = f"user {sec.identity!r}" if sec.identity else "a client without credentials"
    if what in ("force_release", "purge"):
        hint = f"{what} deletes nodes that other clients made: connect as"
    else:
        hint = "a wrong password, or the table's nodes were made by another identity: use"
    hint += (
        " the identity that made them, or the admin identity that their URLs name with "
        "?admin= (docs/stores/zookeeper.md, 'Authentication, ACLs and TLS')"
    )
    return ConfigurationError(f"ZooKeeper refused {what} to {who} on {where}: {hint}")


def tls_failure(exc: BaseException | None) -> ssl.SSLError | None:
    """The TLS error behind a failed connection (kazoo raises its own from the socket's)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ssl.SSLError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class KazooLog:
    """kazoo's logger, as dblock's: every line at DEBUG on ``dblock.zookeeper``, with the
    URL's secrets scrubbed.

    kazoo logs each failed connection attempt as a warning, and keeps trying until
    ``start``'s timeout: nine lines before dblock's own error about an unreachable ensemble.
    dblock reports that failure itself, with the last of them (``last``), so they are
    debugging detail (``--debug`` shows them)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = secrets
        #: kazoo's last warning about an exception (a connection attempt's failure), and
        #: whether TLS failed in it
        self.last: str | None = None
        self.tls_failed = False

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.DEBUG:  # kazoo's BLATHER: every request, with its payload
            return
        error = next((a for a in args if isinstance(a, BaseException)), None)
        if level >= logging.WARNING and error is not None:  # an attempt's failure
            self.last = scrub(str(msg) % args, self._secrets)
            self.tls_failed = tls_failure(error) is not None
        if not log.isEnabledFor(logging.DEBUG):
            return
        info = kwargs.get("exc_info")
        if isinstance(info, BaseException):
            scrub_exception(info, self._secrets)
        elif info:  # logger.exception(): the exception being handled
            current = sys.exc_info()[1]
            if current is not None:
                scrub_exception(current, self._secrets)
        text = scrub(str(msg) % args if args else str(msg), self._secrets)
        log.debug("kazoo: %s", text, exc_info=info)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kwargs)

    warn = warning

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, **kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=True, **kwargs)

    def isEnabledFor(self, level: int) -> bool:  # logging.Logger's name
        return True  # every line may be the last failure (see ``log``)


def stop_behind(zk: KazooClient) -> None:
    """Stop a client that did not connect, on a thread of its own: kazoo's ``stop`` waits for
    its connection thread, which sits in a read bounded by the session timeout when a server
    accepts and never answers; the caller's connect timeout is not to wait for that."""

    def stop() -> None:
        with contextlib.suppress(Exception):
            zk.stop()
            zk.close()

    THREADS.start("dblock-zk-stop", stop)  # kazoo's threads, whichever runtime called
