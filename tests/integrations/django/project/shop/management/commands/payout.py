from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

import dblock
from dblock.contrib.django import once
from shop.gate import wait_at
from shop.models import Payout


class Command(BaseCommand):
    help = "Pay out BATCH at most once successfully."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("batch")
        parser.add_argument("--gate")

    def handle(self, *args: Any, batch: str, gate: str | None, **options: Any) -> None:
        try:
            with once(f"payout:{batch}", ttl=30, note="payout"):
                wait_at(gate)
                Payout.objects.create(batch=batch)
        except dblock.InProgress:
            self.stdout.write("in progress")
            sys.exit(75)
        except dblock.AlreadyDone:
            self.stdout.write("already done")
            return
        self.stdout.write("ran")
