"""dblock for Django: ``INSTALLED_APPS += ["dblock.contrib.django"]``.

The locks live in a database of ``settings.DATABASES`` (``settings.DBLOCK["DATABASE"]``,
default ``"default"``); ``manage.py migrate`` creates the lock table there, and
``manage.py dblock list|info|release|purge`` inspects it. See docs/django.md.

>>> from dblock.contrib.django import locked, once
>>> with once(f"send-invoice:{invoice.pk}", ttl=300):
...     send(invoice)
"""

from __future__ import annotations

from .client import close_client, get_client
from .config import ImproperlyConfigured
from .patterns import fenced_update, lock, locked, once

__all__ = [
    "ImproperlyConfigured",
    "close_client",
    "fenced_update",
    "get_client",
    "lock",
    "locked",
    "once",
]
