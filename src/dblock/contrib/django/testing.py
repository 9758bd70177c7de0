"""A test runner that lets Django drop its test database: ``TEST_RUNNER =
"dblock.contrib.django.testing.DiscoverRunner"``.

The dblock client keeps connections of its own to the test database; PostgreSQL refuses to
drop a database others are connected to, so the client is closed first. A project with a
runner of its own calls ``dblock.contrib.django.close_client()`` in its
``teardown_databases`` the same way.
"""

from __future__ import annotations

from typing import Any

from django.test.runner import DiscoverRunner as DjangoRunner

from .client import close_client


class DiscoverRunner(DjangoRunner):
    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        close_client()
        super().teardown_databases(old_config, **kwargs)


__all__ = ["DiscoverRunner"]
