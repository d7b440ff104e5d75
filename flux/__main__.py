"""``python -m flux``: the ``flux`` command (see :mod:`flux.cli`)."""

from flux.cli import main

main(prog_name="flux")
