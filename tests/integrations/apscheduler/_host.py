"""One "host": an APScheduler that fires ``report`` once at a given time, wrapped in
``client.scheduled``, then stops. Arguments: dblock URL, table, epoch seconds, output file."""

from __future__ import annotations

import os
import sys
import threading
from datetime import datetime, timezone

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_REMOVED, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler

import dblock


def main(url: str, table: str, at: str, out: str) -> None:
    client = dblock.connect(url, table=table)
    scheduler = BackgroundScheduler(timezone=timezone.utc)

    @client.scheduled("nightly-report", at_most=60, at_least=30)
    def report() -> None:
        with open(out, "a") as f:
            f.write(f"{os.getpid()}\n")

    # stop once the job ran and the scheduler dropped it (a shutdown before the drop makes
    # APScheduler's own loop fail to find the job)
    ran, dropped = threading.Event(), threading.Event()

    def note(event: JobEvent) -> None:
        (dropped if event.code == EVENT_JOB_REMOVED else ran).set()

    # misfire_grace_time=None: a host that starts late still fires; at_least keeps it out
    run_date = datetime.fromtimestamp(float(at), tz=timezone.utc)
    scheduler.add_listener(note, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | EVENT_JOB_REMOVED)
    scheduler.add_job(report, "date", run_date=run_date, misfire_grace_time=None)
    scheduler.start()
    if not (ran.wait(60) and dropped.wait(60)):
        sys.exit("the job did not run")
    scheduler.shutdown()
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
