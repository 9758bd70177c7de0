"""The SQL stores' release and renew check the owner, not the token alone: a token is not a
secret (it is printed, logged and written beside the data it fences). Their many-key forms
are checked in tests/contract/test_many_keys.py."""

from __future__ import annotations

import uuid

import dblock
from tests._internals import store_call


def test_another_owner_with_the_right_token_ends_or_renews_nothing(db_url: str, table: str) -> None:
    with dblock.connect(db_url, table=table) as client:
        key, owner = f"owner-{uuid.uuid4().hex[:8]}", f"owner-{uuid.uuid4().hex}"
        token = store_call(client, "acquire", key, owner, 30.0, "lock")
        assert token is not None
        other = f"other-{uuid.uuid4().hex}"
        assert store_call(client, "release", key, other, token) is False
        assert store_call(client, "renew", key, other, token, 30.0) is False
        info = client.info(key)
        assert info is not None and info.token == token
        assert store_call(client, "release", key, owner, token) is True
        assert client.info(key) is None
