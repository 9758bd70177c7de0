"""The lock engine: every lock semantic, once, as steps that do no I/O.

The engine decides; the store executes; a driver connects them. An engine step is a
generator that yields :mod:`operations <dblock._engine.ops>` — a store call, a subscription,
a wait — and receives their results. The blocking client runs them with
:func:`dblock._drive.run`; an asyncio client awaits the same steps. See docs/architecture.md.
"""

from __future__ import annotations

from .hold import Cancellable, Hold
from .kinds import Spec
from .lease import Checked, Released, check, confirm_loss, reenter, release, renew
from .ops import Call, Op, Sleep, Steps, Subscribe, Unsubscribe, Wait
from .session import acquire_session
from .traits import Traits
from .waiting import QUEUE_TTL, Acquisition

__all__ = [
    "QUEUE_TTL",
    "Acquisition",
    "Call",
    "Cancellable",
    "Checked",
    "Hold",
    "Op",
    "Released",
    "Sleep",
    "Spec",
    "Steps",
    "Subscribe",
    "Traits",
    "Unsubscribe",
    "Wait",
    "acquire_session",
    "check",
    "confirm_loss",
    "reenter",
    "release",
    "renew",
]
