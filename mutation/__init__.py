"""Mutation testing of the shard and the client core (``make mutate``; not part of ``make test``).

Lives here: the driver around mutmut (generate the mutants, draw a seeded sample,
run them, write ``mutation/REPORT.md``), the mutants judged equivalent with the
reason for each, a pytest plugin that derandomises Hypothesis for the run, and
the fixed simulator seeds the run adds to the unit and property tests. What is
mutated and which tests run is ``[tool.mutmut]`` in ``pyproject.toml``.
"""
