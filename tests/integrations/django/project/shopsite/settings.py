"""A minimal Django project whose database the tests choose: SHOP_DATABASES is the JSON of
settings.DATABASES, SHOP_DBLOCK (optional) that of settings.DBLOCK."""

from __future__ import annotations

import json
import os

SECRET_KEY = "dblock-tests-only"  # noqa: S105 - a test project
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
INSTALLED_APPS = ["dblock.contrib.django", "shop"]
MIDDLEWARE = ["shop.middleware.busy_is_409"]
ROOT_URLCONF = "shopsite.urls"
DATABASES = json.loads(os.environ["SHOP_DATABASES"])
if any(db["ENGINE"].endswith("mysql") for db in DATABASES.values()):
    # no mysqlclient here (it needs C headers): PyMySQL stands in, as Django's docs allow
    import pymysql

    pymysql.version_info = (2, 2, 1, "final", 0)  # what Django asks mysqlclient for
    pymysql.install_as_MySQLdb()
if "SHOP_DBLOCK" in os.environ:
    DBLOCK = json.loads(os.environ["SHOP_DBLOCK"])
TEST_RUNNER = "dblock.contrib.django.testing.DiscoverRunner"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
