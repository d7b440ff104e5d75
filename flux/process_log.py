"""How the router and shard processes format their log lines.

Each line starts with the wall time to the millisecond (logging's own clock: the
time a line was written, for people and for lining lines up with a client's
observations; broker logic never reads it), then the process and the level.
"""

from __future__ import annotations

import logging
import sys

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


def log_format(process: str) -> str:
    """The format of ``process``'s lines (``"flux router"``, ``"flux shard 0"``)."""
    return f"%(asctime)s.%(msecs)03d {process} [%(levelname)s] %(message)s"


def configure(process: str) -> None:
    """Send INFO and above to standard error, each line stamped with its wall time."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=log_format(process),
                        datefmt=DATE_FORMAT)
