"""The project's own tests, run by ``manage.py test`` (Django's runner, its test database)."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection
from django.test import TestCase

from dblock.contrib.django import close_client, get_client, locked, once


@locked("nightly:{name}", ttl=30, timeout=0)
def nightly(name: str) -> str:
    return name


class OnceInTheTestDatabase(TestCase):
    def test_once_records_its_outcome_in_the_test_database(self) -> None:
        with once("test-payout:1", ttl=30):
            pass
        client = get_client()
        assert client.state("test-payout:1") == "succeeded"
        assert quote(connection.settings_dict["NAME"]) in client.url

    def test_a_locked_function_follows_a_client_made_anew(self) -> None:
        first = get_client()
        assert nightly("a") == "a"
        close_client()  # e.g. a test's teardown: the next call must not use the closed one
        assert nightly("a") == "a"
        assert get_client() is not first
        assert get_client().list("nightly:") == []  # both calls released their hold
