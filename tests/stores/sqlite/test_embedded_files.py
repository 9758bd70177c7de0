"""The embedded default's files are the user's alone (issue 29, point 6): the state directory
is created 0700 and the database (with its -wal/-shm/-journal files) 0600, and a directory
owned by someone else or writable by others is refused with a clear error."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dblock


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG state home; DBLOCK_URL unset, so connect() uses the embedded default."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    monkeypatch.delenv("DBLOCK_URL", raising=False)
    return home


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _use(client: dblock.Client) -> None:
    lock = client.lock("k", ttl=5)
    assert lock.acquire(blocking=False)
    lock.release()


def test_default_directory_and_files_are_private(state: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which gives 0755 / 0644
    try:
        with dblock.connect() as client:
            _use(client)
            directory = state / "dblock"
            assert _mode(directory) == 0o700
            assert _mode(state) == 0o700  # a missing state home is made as XDG says
            files = sorted(directory.iterdir())
            assert directory / "locks.sqlite3" in files
            assert any(f.name.endswith("-wal") for f in files)  # WAL mode: -wal and -shm exist
            for f in files:
                assert _mode(f) == 0o600, f
    finally:
        os.umask(old)


def test_command_line_default_is_private(state: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    env.pop("DBLOCK_URL", None)
    fresh = _dblock(env, "list")
    # a fresh install holds nothing, and a read-only command creates nothing
    assert fresh.returncode == 0, fresh.stderr
    assert not (state / "dblock").exists()
    done = _dblock(env, "run", "--no-wait", "k", "--", "true")
    assert done.returncode == 0, done.stderr
    assert _mode(state / "dblock") == 0o700
    assert _mode(state / "dblock" / "locks.sqlite3") == 0o600


def test_loose_modes_of_our_own_directory_are_tightened(state: Path) -> None:
    """A directory and file of ours with looser modes (0755 / 0644) are made private."""
    directory = state / "dblock"
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    db = directory / "locks.sqlite3"
    db.touch()
    db.chmod(0o644)
    with dblock.connect() as client:
        _use(client)
    assert _mode(directory) == 0o700
    assert _mode(db) == 0o600


def _dblock(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dblock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def _nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_owned_by_someone_else_is_refused(state: Path) -> None:
    directory = state / "dblock"
    directory.mkdir(parents=True, mode=0o700)
    os.chown(directory, _nobody(), -1)
    with pytest.raises(dblock.ConfigurationError, match="owned by uid"):
        dblock.connect()
    assert not (directory / "locks.sqlite3").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_database_file_owned_by_someone_else_is_refused(state: Path) -> None:
    directory = state / "dblock"
    directory.mkdir(parents=True, mode=0o700)
    db = directory / "locks.sqlite3"
    db.touch(mode=0o600)
    os.chown(db, _nobody(), -1)
    with pytest.raises(dblock.ConfigurationError, match="owned by uid"):
        dblock.connect()


def test_directory_writable_by_others_is_refused(state: Path) -> None:
    directory = state / "dblock"
    directory.mkdir(parents=True)
    directory.chmod(0o777)
    with pytest.raises(dblock.ConfigurationError, match="writable by other users"):
        dblock.connect()
    assert not (directory / "locks.sqlite3").exists()


def test_symlink_to_someone_elses_directory_is_refused(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(elsewhere, _nobody(), -1)
    else:
        elsewhere.chmod(0o777)  # not ours to trust either way
    state.mkdir()
    (state / "dblock").symlink_to(elsewhere)
    with pytest.raises(dblock.ConfigurationError):
        dblock.connect()


def test_command_line_refusal_is_a_usage_error(state: Path) -> None:
    directory = state / "dblock"
    directory.mkdir(parents=True)
    directory.chmod(0o777)
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    env.pop("DBLOCK_URL", None)
    done = _dblock(env, "list")
    assert done.returncode == 2, done.stderr
    assert "writable by other users" in done.stderr
    assert "Traceback" not in done.stderr


def test_explicit_url_keeps_the_users_choice(tmp_path: Path) -> None:
    """A file the user names is created as the umask says (it may be shared on purpose)."""
    old = os.umask(0o022)
    try:
        with dblock.connect(f"sqlite:///{tmp_path}/shared/locks.sqlite3") as client:
            _use(client)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "shared" / "locks.sqlite3") == 0o644
