from __future__ import annotations

from django.db import models


class Stock(models.Model):
    """A resource guarded by the lock ``stock:<sku>`` and fenced by its token."""

    sku = models.CharField(max_length=40, unique=True)
    level = models.IntegerField()
    fence_token = models.BigIntegerField(null=True)


class Payout(models.Model):
    """One row per run of a payout batch: `once` must leave exactly one."""

    batch = models.CharField(max_length=40)
