"""Types of the C functions of a member's held offsets and keys (``_held_keys.c``)."""

from collections.abc import Sequence

def hold_keys(key_of: dict[int, str], keys: dict[str, int], offsets: Sequence[int],
              key_at: dict[int, str], /) -> None: ...
def let_go(in_flight: dict[int, int], key_of: dict[int, str], keys: dict[str, int],
           offsets: Sequence[int], /) -> list[str] | None: ...
