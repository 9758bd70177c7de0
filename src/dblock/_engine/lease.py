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
from .._contract import Store
from .._errors import BackendError
from .hold import Hold
from .ops import Call, Steps

log = logging.getLogger("dblock")


def reenter(hold: Hold) -> Steps[bool | None]:
    """One more acquisition of ``hold`` by its owner, if the store confirms it is still ours.

    Local memory is not enough: an operator may have force-released it, or its lease may have
    run out while the process was paused. One round trip renews it with its token (as a
    renewal would). Returns True (counted), None if it was not live to begin with (nothing
    asked), or False if the store no longer has it: the hold is lost, and the caller reports
    the loss and acquires afresh, with a new token.
    """
    if not hold.live() or hold.count == 0:
        return None
    sent = time.monotonic()
    if not (yield hold.spec.renew_call(hold.owner, hold.token, hold.ttl)):
        hold.cancel_job()
        hold.lost = True
        return False
    hold.renewed(sent, hold.ttl)
    hold.cancel_job()
    hold.count += 1
    return True


def renew(hold: Hold, ttl: float) -> Steps[bool]:
    """Extend the lease to ``ttl`` from now; False if it was gone (the hold is then lost)."""
    if hold.lost:
        return False
    sent = time.monotonic()
    if not (yield hold.spec.renew_call(hold.owner, hold.token, ttl)):
        hold.lost = True
        hold.cancel_job()
        return False
    hold.renewed(sent, ttl)
    hold.cancel_job()
    return True


@dataclass(frozen=True, slots=True)
class Released:
    """What one release did: ``final`` if it ended the hold in the store; ``lost`` if the lease
    had been lost (the caller raises LockLost)."""

    final: bool
    lost: bool


def release(hold: Hold) -> Steps[Released]:
    """Undo one acquisition; the last one ends the hold in the store."""
    if hold.count > 1:
        hold.count -= 1
        return Released(final=False, lost=hold.lost)
    hold.cancel_job()  # stop renewing before releasing
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
    if not hold.renews(auto_renew):
        hold.lost = True  # a watched lease that was not renewed has run out
        return Checked(None, True)
    sent = time.monotonic()
    try:
        ok = yield hold.spec.renew_call(hold.owner, hold.token, hold.ttl)
    except BackendError as exc:
        if time.monotonic() < hold.expires_by:
            _observe.renewal_failed(hold, exc)
            return Checked(min(time.monotonic() + max(hold.ttl / 10, 0.05), hold.expires_by), False)
        ok = False
    if not ok:
        hold.lost = True
        return Checked(None, True)
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
