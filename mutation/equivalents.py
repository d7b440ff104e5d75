"""Surviving mutants judged equivalent: no test can tell them from the original.

Keyed by mutmut's mutant name (module, function, number), each with the reason
in one line. A name goes stale when its function changes; the report then lists
the mutant with the other survivors until it is judged again.
"""

from __future__ import annotations

EQUIVALENT: dict[str, str] = {
}
