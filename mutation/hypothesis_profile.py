"""A pytest plugin for mutation runs: Hypothesis draws the same examples every run.

Loaded with ``-p mutation.hypothesis_profile`` before the test modules are
imported, so their ``@settings(...)`` inherit it. Without it a mutant could
survive one run and die in the next, and the report would not be reproducible.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("mutation", derandomize=True, database=None, print_blob=False)
settings.load_profile("mutation")
