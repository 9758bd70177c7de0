"""``dblock run KEY KEY... -- CMD`` (lock_many) in real subprocesses, on every store with
ManyKeys: every key is held while CMD runs, and none when it was not had."""

from __future__ import annotations

import json
import shlex
import uuid

import pytest

from .conftest import Dblock

pytestmark = pytest.mark.needs("ManyKeys")


def _keys(n: int) -> list[str]:
    stem = "rm-" + uuid.uuid4().hex[:8]
    return [f"{stem}-{i}" for i in range(n)]


def test_every_key_is_held_while_cmd_runs_and_cmd_sees_each_token(cli: Dblock) -> None:
    keys = _keys(3)
    listing = shlex.join(cli.argv("list", "--json"))
    script = f'printf "%s\\n%s\\n" "$DBLOCK_KEYS" "$DBLOCK_TOKENS"; {listing}'
    done = cli.run("run", *keys, "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert json.loads(lines[0]) == keys
    tokens = json.loads(lines[1])
    held = {h["key"]: h["token"] for h in map(json.loads, lines[2:]) if h["key"] in keys}
    assert held == tokens and sorted(tokens) == sorted(keys)
    assert all(cli.run("info", k).returncode == 1 for k in keys), "released after CMD"
