"""Generate the mutants with mutmut, draw the seeded sample, and run it.

mutmut keeps everything in ``mutants/`` (git-ignored): a mutated copy of
``flux/``, per-file ``.meta`` files with each mutant's exit code, and the
test-to-function map of its stats run. This module adds ``mutants/flux-run.json``:
the sample drawn, its seed and the run's wall time, which the report reads.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

MUTANTS = Path("mutants")
RUN_FILE = MUTANTS / "flux-run.json"
AREAS = ("flux/shard/", "flux/client/")


@dataclass
class RunRecord:
    """What ``mutants/flux-run.json`` holds: which mutants were drawn and how long they took."""

    seed: int
    per_area: int
    generated: dict[str, int]
    sample: list[str]
    run_seconds: float = 0.0
    rerun_seconds: list[float] = field(default_factory=list)
    # per earlier run of the sample: {area: {verdict: count}}, as it stood before a re-run
    earlier: list[dict[str, dict[str, int]]] = field(default_factory=list)

    def save(self) -> None:
        RUN_FILE.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls) -> RunRecord:
        return cls(**json.loads(RUN_FILE.read_text()))


def generate(workers: int) -> None:
    """Write the mutated copy of ``flux/`` and the ``.meta`` files, running no test.

    ``mutmut run`` does this before it runs anything; its steps are called here
    so that the sample can be drawn from the full list first.
    """
    from mutmut.__main__ import create_mutants, store_lines_covered_by_tests
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    set_mutant_under_test("mutant_generation")
    MUTANTS.mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    store_lines_covered_by_tests()
    create_mutants(workers)


def meta_files() -> list[Path]:
    """The ``.meta`` file of each mutated module, in path order."""
    return sorted(MUTANTS.glob("flux/**/*.py.meta"))


def source_of(meta: Path) -> str:
    """``mutants/flux/shard/dedup.py.meta`` -> ``flux/shard/dedup.py``."""
    return str(meta.relative_to(MUTANTS)).removesuffix(".meta")


def exit_codes() -> dict[str, tuple[str, int | None]]:
    """Every generated mutant: its module's path and its exit code (None: not run)."""
    codes: dict[str, tuple[str, int | None]] = {}
    for meta in meta_files():
        data = json.loads(meta.read_text())
        for name, code in data["exit_code_by_key"].items():
            codes[name] = (source_of(meta), code)
    return codes


def draw_sample(names_by_area: dict[str, list[str]], per_area: int, seed: int) -> list[str]:
    """Up to ``per_area`` mutants of each area, drawn without replacement.

    The draw is ``random.Random(f"{seed}:{area}").sample`` over the area's sorted
    mutant names, so the same seed and the same code give the same sample.
    ``per_area`` 0 takes every mutant.
    """
    sample: list[str] = []
    for area, names in sorted(names_by_area.items()):
        ordered = sorted(names)
        if per_area and per_area < len(ordered):
            ordered = sorted(random.Random(f"{seed}:{area}").sample(ordered, per_area))
        sample.extend(ordered)
    return sample


def area_of(path: str) -> str:
    return next(area for area in AREAS if path.startswith(area))


def run_mutants(names: Iterable[str], workers: int) -> float:
    """``mutmut run`` over the named mutants; returns its wall time in seconds."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(workers), *names],
                   check=True)
    return time.monotonic() - started


def run(per_area: int, seed: int, workers: int) -> RunRecord:
    """Generate, draw and run a sample; the record is saved for the report."""
    generate(workers)
    codes = exit_codes()
    by_area: dict[str, list[str]] = {area: [] for area in AREAS}
    for name, (path, _) in codes.items():
        by_area[area_of(path)].append(name)
    record = RunRecord(seed=seed, per_area=per_area,
                       generated={area: len(names) for area, names in by_area.items()},
                       sample=draw_sample(by_area, per_area, seed))
    record.save()
    record.run_seconds = run_mutants(record.sample, workers)
    record.save()
    return record


def rerun(workers: int, everything: bool, summary: Callable[[RunRecord], dict[str, dict[str, int]]]
          ) -> RunRecord:
    """Run the sample again after tests were added: the mutants that were not killed, or
    with ``everything`` the whole sample. ``summary`` keeps the figures it replaces."""
    record = RunRecord.load()
    codes = exit_codes()
    names = [name for name in record.sample
             if everything or name not in codes or codes[name][1] not in (1, 3)]
    if names:
        record.earlier.append(summary(record))
        record.rerun_seconds.append(run_mutants(names, workers))
        record.save()
    return record
