"""A hold's life after the grant: re-entry, renewal, loss detection, release. No I/O here.

What "lost" means: the lease of a hold is gone (expired, taken over by another owner,
force-released, or not renewed before it ran out because the store was unreachable). From
that moment another owner may act on what the lock protects. The client tells its user in
three ways: ``held`` turns False, ``on_lost`` is called once (in the background), and
``release()`` / ``renew()`` raise LockLost.

Every step here runs with the hold's mutex held by the client, so the caller, the renewer
and a loss notice never act on one hold at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .. import _observe
from .._contract import CommitGuards, Store
from .._errors import BackendError, GuardOpen
from .hold import Hold
from .ops import Call, Steps

#: how often (s) the background job looks whether a guarded transaction has ended: no I/O,
#: a flag of the caller's connection
GUARD_POLL = 0.05


def renewal(hold: Hold, ttl: float) -> Call:
    """The call that renews ``hold``. After a guarded transaction ended, its lease may have
    run out while that transaction held the row (a renewal would have waited for it, so
    none was sent): nobody could take the key then, and a key taken since names another
    owner or token, so the row still naming ours is renewed, expired or not."""
    if hold.after_guard:  # cleared by the caller once the renewal succeeded
        return Call(
            CommitGuards.renew_after_guard, hold.spec.tokens_of(hold.token), hold.owner, ttl
        )
    return hold.spec.renew_call(hold.owner, hold.token, ttl)


def refuse_while_guarded(hold: Hold, what: str) -> None:
    """Raise GuardOpen if a guarded transaction of ``hold`` is open: ``what`` ("release()",
    "renew()") would wait for that transaction's own row lock. The caller checks before it
    takes the hold's mutex (a renewal sent as the guard began may hold it, waiting for the
    guarded transaction, whose owner may be the caller's own thread). A refused release
    stops renewal, as when the store cannot be reached: if the caller never comes back (the
    error leaves a `with` block), the lease ends within its ttl."""
    if not hold.guarded():
        return
    if what == "release()":
        hold.cancel_job()
        hold.job = None
    raise _guard_open(hold, what)


def _guard_open(hold: Hold, what: str) -> GuardOpen:
    return GuardOpen(
        f"{what} of lock {hold.key!r} while the transaction that lock.guard(conn) guards is "
        "still open: it would wait for that transaction's own lock on the hold's row, and "
        "never return. Commit or roll back that transaction first (conn is still in a "
        "transaction: the guarded one, or one begun since)",
        key=hold.key,
    )


log = logging.getLogger("dblock")


def reenter(hold: Hold) -> Steps[bool | None]:
    """One more acquisition of ``hold`` by its owner, if the store confirms it is still ours.

    Local memory is not enough: an operator may have force-released it, or its lease may have
    run out while the process was paused. One round trip renews it with its token (as a
    renewal would). Returns True (counted), None if it was not live to begin with (nothing
    asked), or False if the store no longer has it: the hold is lost, and the caller reports
    the loss and acquires afresh, with a new token.
    """
    if hold.count == 0 or hold.lost or hold.ending or not hold.ours():
        return None
    if hold.guarded():  # its guarded transaction holds the row: ours until that ends
        hold.count += 1
        return True
    if not hold.live() and not hold.after_guard:
        return None
    sent = time.monotonic()
    if not (yield renewal(hold, hold.ttl)):
        hold.cancel_job()
        hold.lost = True
        return False
    hold.after_guard = False
    hold.renewed(sent, hold.ttl)
    hold.cancel_job()
    hold.count += 1
    return True


def renew(hold: Hold, ttl: float) -> Steps[bool]:
    """Extend the lease to ``ttl`` from now; False if it was gone (the hold is then lost)."""
    if hold.lost:
        return False
    sent = time.monotonic()
    if not (yield renewal(hold, ttl)):
        hold.lost = True
        hold.cancel_job()
        return False
    hold.after_guard = False
    hold.renewed(sent, ttl)
    hold.cancel_job()
    return True


@dataclass(frozen=True, slots=True)
class Released:
    """What one release did: ``final`` if it ended the hold in the store; ``lost`` if the lease
    had been lost (the caller raises LockLost)."""

    final: bool
    lost: bool


def release(hold: Hold, revive: bool = False) -> Steps[Released]:
    """Undo one acquisition; the last one ends the hold in the store. ``revive``: the hold
    is renewed in the background, so a lease that ran out while a guarded transaction held
    its row (no renewal was sent then) is renewed first, if nobody took the key since."""
    if hold.count > 1:
        hold.count -= 1
        return Released(final=False, lost=hold.lost)
    hold.cancel_job()  # stop renewing before releasing
    if revive and hold.after_guard and not hold.lost and time.monotonic() >= hold.expires_by:
        sent = time.monotonic()
        if (yield renewal(hold, hold.ttl)):
            hold.after_guard = False
            hold.renewed(sent, hold.ttl)
        else:
            hold.lost = True
    hold.ending = True
    try:
        released = yield hold.spec.end_call(hold.owner, hold.token)
    except BackendError as exc:
        if not hold.lost:
            # Not released: the hold may still stand, and release() may be called again.
            # The caller wanted it released: renewal stays stopped, so if the store stays out
            # of reach the lease lapses by itself within its ttl instead of living as long as
            # this process.
            hold.ending = False
            hold.job = None
            raise
        # Known lost (on_lost has run): the store is still told, for what its end records
        # (a once outcome, a session's connection), but no answer of its can change the
        # verdict, so the hold ends here with LockLost instead of staying registered.
        log.debug("release of the lost hold of %r could not reach the store: %s", hold.key, exc)
        released = False
    except BaseException:
        hold.ending = False  # interrupted before the answer: the hold may still stand
        raise
    hold.count = 0
    if not released:
        hold.lost = True
    return Released(final=True, lost=hold.lost)


@dataclass(frozen=True, slots=True)
class Checked:
    """After a background check: when to check again (None: not), and whether the hold was
    found lost just now (the caller reports it, once)."""

    again: float | None
    lost_now: bool


def check(hold: Hold, auto_renew: bool, watched: bool) -> Steps[Checked]:
    """The background job: renew the hold, or notice that its lease is gone."""
    if hold.count == 0 or hold.lost:
        return Checked(None, False)
    if hold.guarded():  # nobody can take it now, and a renewal would wait: look again soon
        return Checked(time.monotonic() + GUARD_POLL, False)
    if not hold.renews(auto_renew):
        hold.lost = True  # a watched lease that was not renewed has run out
        return Checked(None, True)
    sent = time.monotonic()
    try:
        ok = yield renewal(hold, hold.ttl)
    except BackendError as exc:
        if time.monotonic() < hold.expires_by:
            _observe.renewal_failed(hold, exc)
            return Checked(min(time.monotonic() + max(hold.ttl / 10, 0.05), hold.expires_by), False)
        ok = False
    if not ok:
        hold.lost = True
        return Checked(None, True)
    hold.after_guard = False
    hold.renewed(sent, hold.ttl)
    return Checked(hold.next_check(auto_renew, watched), False)


def confirm_loss(hold: Hold) -> Steps[bool]:
    """After a pushed force-release notice: True if the store confirms the hold is gone (it
    is then lost); False for a notice about an earlier hold of the same owner."""
    if hold.count == 0 or hold.lost:
        return False
    key = hold.key
    if hold.spec.shared:  # one of several holds of the key
        holds = yield Call(Store.list_holds, key)
    else:
        holds = [(yield Call(Store.info, key))]
    if any(
        i is not None and i.key == key and (i.owner, i.token) == (hold.owner, hold.token)
        for i in holds
    ):
        return False
    hold.lost = True
    hold.cancel_job()
    return True
