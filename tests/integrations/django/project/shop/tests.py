"""The project's own tests, run by ``manage.py test`` (Django's runner, its test database)."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection
from django.test import TestCase

from dblock.contrib.django import get_client, once


class OnceInTheTestDatabase(TestCase):
    def test_once_records_its_outcome_in_the_test_database(self) -> None:
        with once("test-payout:1", ttl=30):
            pass
        client = get_client()
        assert client.state("test-payout:1") == "succeeded"
        assert quote(connection.settings_dict["NAME"]) in client.url
