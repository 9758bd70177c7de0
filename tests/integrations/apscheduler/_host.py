"""One "host": an APScheduler that fires ``report`` once at a given time, wrapped in
``client.scheduled``, then stops. Arguments: dblock URL, table, epoch seconds, output file."""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, JobExecutionEvent
from apscheduler.schedulers.blocking import BlockingScheduler

import dblock


def main(url: str, table: str, at: str, out: str) -> None:
    client = dblock.connect(url, table=table)
    scheduler = BlockingScheduler(timezone=timezone.utc)

    @client.scheduled("nightly-report", at_most=60, at_least=30)
    def report() -> None:
        with open(out, "a") as f:
            f.write(f"{os.getpid()}\n")

    def stop(event: JobExecutionEvent) -> None:
        scheduler.shutdown(wait=False)

    # misfire_grace_time=None: a host that starts late still fires; at_least keeps it out
    run_date = datetime.fromtimestamp(float(at), tz=timezone.utc)
    scheduler.add_job(report, "date", run_date=run_date, misfire_grace_time=None)
    scheduler.add_listener(stop, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    scheduler.start()
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
