"""The strategies the demo compares (shared by the parent and the worker processes)."""

from __future__ import annotations

from dataclasses import dataclass

#: strategy 8's variants, run side by side: (letter, title)
SEVERAL_SKUS: tuple[tuple[str, str], ...] = (
    ("a", "lock_many over the SKUs"),
    ("b", "a lock per SKU, sorted"),
    ("c", "a lock per SKU, arrival order"),
)
#: variant c: how long it waits for a SKU's lock before it gives up the ones it has and
#: tries the order again (a lock wait timeout is how a deadlock of such locks ends), and
#: the tries an order gets
ARRIVAL_TIMEOUT = 0.1
ARRIVAL_TRIES = 3

#: strategy 9's variants, run side by side: (letter, title)
STALLED_HOLDER: tuple[tuple[str, str], ...] = (
    ("a", "token column (fenced_update)"),
    ("b", "guarded commit (lock.guard)"),
)
#: strategy 9, in one line each: what its variant shows
STALLED_SHOWS = {
    "a": "token column: a stalled holder's write is refused once a newer holder claims the row",
    "b": "no token column: takeovers wait for the guarded COMMIT; a hold already lost is refused",
}
#: strategy 9's lease, and how long its stalled holders stall (well past the lease: a GC
#: pause, a swapped-out process). Short, so that the demo takes about as long as before
STALL_TTL = 0.08
STALL_SECONDS = 0.2
#: strategy 9: the orders (indexes into the order book) whose holder stalls, and where:
#: right after taking the lock, or while processing the order (after reading the stock)
STALLS = {0: "processing", 1: "taken"}


@dataclass(frozen=True)
class Strategy:
    """One way of confirming an outbound order against the inventory row."""

    number: int
    slug: str
    title: str
    #: True if the strategy must never oversell (the demo fails loudly if it does)
    correct: bool
    #: the variants run one after the other, each a row of the report ("": the strategy)
    variants: tuple[str, ...] = ("",)

    def label(self, dialect: str, variant: str = "") -> str:
        """The title (of ``variant``) as it applies on ``dialect``."""
        if variant:
            return dict(STALLED_HOLDER if self.number == 9 else SEVERAL_SKUS)[variant]
        if self.number == 4 and dialect == "sqlite":
            return "BEGIN IMMEDIATE transaction"
        if self.number == 7:
            return {
                "postgresql": "dblock session lock (pg_advisory_lock)",
                "mysql": "dblock session lock (GET_LOCK)",
            }.get(dialect, self.title)
        return self.title

    def skip_reason(self, dialect: str, variant: str = "", sql_store: bool = True) -> str | None:
        """Why the strategy (its ``variant``) cannot run with the inventory on ``dialect``
        and the locks in a SQL store (``sql_store``) or not, or None."""
        if self.number == 7 and dialect == "sqlite":
            return "SQLite has no advisory locks"
        if self.number == 9 and variant == "b" and not sql_store:
            return "lock.guard needs the lock table in the inventory's SQL database"
        return None


STRATEGIES: tuple[Strategy, ...] = (
    Strategy(1, "read-write", "read-check-write, no lock", correct=False),
    Strategy(2, "read-decrement", "read-check, then decrement, no lock", correct=False),
    Strategy(3, "guarded-update", "UPDATE ... WHERE available >= q", correct=True),
    Strategy(4, "for-update", "SELECT ... FOR UPDATE", correct=True),
    Strategy(5, "optimistic", "optimistic version column", correct=True),
    Strategy(6, "dblock", "dblock lock", correct=True),
    Strategy(7, "advisory", "advisory lock", correct=True),
    Strategy(
        8,
        "several-skus",
        "orders of several SKUs",
        correct=True,
        variants=tuple(letter for letter, _ in SEVERAL_SKUS),
    ),
    Strategy(
        9,
        "stalled-holder",
        "a holder stalled past its lease",
        correct=True,
        variants=tuple(letter for letter, _ in STALLED_HOLDER),
    ),
)


def parse_strategies(text: str) -> list[Strategy]:
    """``"1,3,dblock"`` -> strategies in the order given (numbers or slugs), else ValueError."""
    chosen: list[Strategy] = []
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        found = next((s for s in STRATEGIES if item in (str(s.number), s.slug)), None)
        if found is None:
            names = ", ".join(f"{s.number}/{s.slug}" for s in STRATEGIES)
            raise ValueError(f"unknown strategy {item!r} (choose from {names})")
        if found not in chosen:
            chosen.append(found)
    if not chosen:
        raise ValueError("no strategy given")
    return chosen
