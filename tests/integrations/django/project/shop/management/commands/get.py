from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.test import Client


class Command(BaseCommand):
    help = "GET each PATH through Django's request handling; print a line of status and body."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="+")

    def handle(self, *args: Any, paths: list[str], **options: Any) -> None:
        for path in paths:
            response = Client().get(path)
            body = response.content.decode().replace("\n", " ")
            self.stdout.write(f"{response.status_code} {body}")
