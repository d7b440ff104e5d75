"""A wire fuzzer for a real ``flux serve`` (``python -m fuzz``, ``make fuzz``).

:mod:`fuzz.frames` makes structured mutations of every client frame kind (fields
replaced by values of other types and sizes, dropped and added, unknown kinds) and
byte-level ones (bit flips, truncations); :mod:`fuzz.runner` sends them over many
connections at once while a good client publishes and reads back between rounds,
and checks what DESIGN.md promises: no process died or was replaced, a connection
closes only for a listed reason after its typed ERROR, every well-framed request is
answered, and the good data stays intact.
"""
