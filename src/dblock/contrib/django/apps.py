"""The app: label ``dblock``, its migration makes the lock table, and a system check."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class DblockConfig(AppConfig):
    name = "dblock.contrib.django"
    label = "dblock"
    verbose_name = "dblock"
    default = True

    def ready(self) -> None:
        checks.register(check_settings)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``dblock.E001``: settings.DBLOCK or the database it names is something dblock cannot use
    (every ``manage.py`` command runs the checks), without connecting."""
    from .config import ImproperlyConfigured, target

    try:
        target()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="dblock.E001")]
    return []
