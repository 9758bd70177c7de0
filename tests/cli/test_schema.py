"""``dblock schema --dialect``: the DDL of every dialect, printed without connecting."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .conftest import Dblock


def test_schema_without_connecting() -> None:
    for dialect in ("postgresql", "mysql", "sqlite"):
        done = subprocess.run(
            [
                *Dblock("postgresql://nobody:pw@127.0.0.1:1/none", "locks", Path()).argv(
                    "schema", "--dialect", dialect
                )
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert '"locks"' in done.stdout or "`locks`" in done.stdout
        assert done.stdout.rstrip().endswith(";")
