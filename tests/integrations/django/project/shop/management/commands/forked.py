from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from dblock.contrib.django import get_client, lock


class Command(BaseCommand):
    help = "Lock in a forked child with the client its parent made (gunicorn --preload)."

    def handle(self, *args: Any, **options: Any) -> None:
        client = get_client()
        with lock("fork:parent", ttl=30) as parent:
            pid = os.fork()
            if pid == 0:  # the child: the parent's client, its own connections
                status = 1
                try:
                    with lock("fork:child", ttl=30, timeout=10) as child:
                        # the parent's hold is not the child's (no re-entry into it)
                        parents = lock("fork:parent").acquire(blocking=False)
                        ok = get_client() is client and child.token and not parents
                        status = 0 if ok else 1
                finally:
                    os._exit(status)
            _, status = os.waitpid(pid, 0)
            assert parent.held
        self.stdout.write(f"child exited {os.waitstatus_to_exitcode(status)}")
