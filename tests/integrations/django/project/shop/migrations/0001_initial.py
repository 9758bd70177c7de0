from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Stock",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("sku", models.CharField(max_length=40, unique=True)),
                ("level", models.IntegerField()),
                ("fence_token", models.BigIntegerField(null=True)),
            ],
        ),
        migrations.CreateModel(
            name="Payout",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("batch", models.CharField(max_length=40)),
            ],
        ),
    ]
