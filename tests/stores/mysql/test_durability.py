"""What waits for the disk: every acquisition does, a release that only frees the lock doesn't.

A release issues no token, and the commit of any later acquisition, which waits for the disk,
makes the release durable first (the log is written in order); a crash may undo only the
latest releases, which leaves their locks held until their leases end. A token a waiter is
handed is on disk before the waiter has it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._private_servers import SLOW_MS, private_mariadb
from tests.stores._durability import crash_as_the_waiter_gets_it


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slow_ms", "waiter_query", "gated"),
    [(SLOW_MS, "", True), (1500, "?read_timeout=3", False)],
    ids=["through-the-gate", "gate-wait-runs-out"],
)
def test_mysql_a_handed_over_token_survives_the_server_dying_as_the_waiter_gets_it(
    tmp_path: Path, slow_ms: int, waiter_query: str, gated: bool
) -> None:
    """InnoDB lets other sessions read a commit before it has written it to its log. A waiter
    woken by a hand-over that took the lock from such a read could be left, after a crash,
    holding a token the database no longer knows, and would see it issued again (a hold and a
    token the server restart undid). A waiter whose wait at the gate runs out first (a third
    of its read timeout: 1 s) must not take the hand-over it reads: it takes the lock again
    with a commit of its own."""
    with private_mariadb(tmp_path) as db:
        held, handed, note = crash_as_the_waiter_gets_it(db, slow_ms, waiter_query)
    # handed over; or handed over, then taken again by the waiter's own write (tokens come
    # from the table's sequence on MariaDB: larger, maybe by more than one)
    assert handed > held
    assert note == (str(held) if gated else None), "the hold on disk came by a hand-over"
