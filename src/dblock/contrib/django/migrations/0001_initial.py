"""dblock's lock tables, as ``dblock schema`` prints them for this database's dialect."""

from __future__ import annotations

from django.db import migrations

from dblock.contrib.django.operations import CreateLockTables


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [CreateLockTables()]
