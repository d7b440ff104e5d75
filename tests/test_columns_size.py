"""A DELIVER's keys column is counted toward its frame budget with room to spare: the
estimate is never below what MessagePack makes of it, whatever the keys' characters."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from flux.message_meta import columns, columns_size

_KEYS = st.lists(st.one_of(st.none(), st.text(min_size=1, max_size=64)), min_size=1,
                 max_size=40)


@given(keys=_KEYS, due=st.booleans())
def test_the_estimate_covers_the_packed_keys(keys: list[str | None], due: bool) -> None:
    n = len(keys)
    dues: list[float | None] = [1.5e9 + i if due and i % 2 else None for i in range(n)]
    meta: dict[str, Any] | None = columns(keys, [None] * n, dues)
    if meta is not None:
        assert columns_size(meta) >= len(msgpack.packb(meta))


def test_keys_make_a_column_only_when_some_message_has_one() -> None:
    assert columns([None, None], [None, None], [None, None]) is None
    assert columns([None, "k"], [None, None], [None, None]) == {"keys": [None, "k"]}
