"""The router's adoption state on disk: it holds the broker secret, so it is private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from flux.router.state import STATE_VERSION, FileStateStore

STATE = {"version": STATE_VERSION, "port": 7070, "control": "127.0.0.1:1", "shard_count": 1,
         "secret": "ab" * 32, "shards": []}


def test_the_state_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    store = FileStateStore("127.0.0.1", 7070, tmp_path)
    old = os.umask(0)  # whatever the umask, the file is 0600
    try:
        store.save(STATE)
    finally:
        os.umask(old)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load() == STATE
    store.clear()
    assert store.load() is None


def test_a_state_file_of_another_version_is_ignored(tmp_path: Path) -> None:
    store = FileStateStore("127.0.0.1", 7070, tmp_path)
    store.save({**STATE, "version": 1})
    assert store.load() is None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the file to another user")
def test_a_state_file_another_user_owns_is_ignored(tmp_path: Path) -> None:
    store = FileStateStore("127.0.0.1", 7070, tmp_path)
    store.save(STATE)
    os.chown(store.path, 65534, 65534)
    assert store.load() is None
