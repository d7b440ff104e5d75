"""Start-up hook of the broker's processes in a chaos run with ``--plant NAME`` only.

Python imports ``sitecustomize`` when it is on the path; the chaos runner puts this
directory on ``PYTHONPATH`` (and sets ``CHAOS_PLANT``) for ``flux serve`` and the
shards it starts, and for nothing else.
"""

import os
import sys

_name = os.environ.get("CHAOS_PLANT")
if _name:
    try:
        from chaos.planted import plant

        plant(_name)
        print(f"chaos: planted bug {_name!r} in pid {os.getpid()}", file=sys.stderr)
    except Exception as exc:  # never stop the broker from starting: the run shows the bug
        print(f"chaos: could not plant {_name!r}: {exc}", file=sys.stderr)
