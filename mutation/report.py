"""Write ``mutation/REPORT.md`` from mutmut's results for the sampled mutants.

Counts per module and per area; the kill rate is (killed + timed out) over the
sample less its equivalent mutants. Every other survivor is listed with its diff.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from mutation.driver import AREAS, RunRecord, area_of, exit_codes
from mutation.equivalents import EQUIVALENT

REPORT = Path("mutation/REPORT.md")
# measured once, on flux/shard/dedup.py and its tests, 2 cores (kept here so the report says it)
TOOL_NOTE = """\
## Why mutmut

Both maintained tools were tried on `flux/shard/dedup.py` with the tests that use it.
mutmut 3.8 made 242 mutants; with 2 workers it ran 206 of them in 13 minutes (3.8 s
a mutant, wall), forking each from a warm pytest process and running only the tests
that call the mutated function, as its stats run recorded them. cosmic-ray 8.7 made
498 mutants; its local distributor ran 13 in 90 s on one worker (6.9 s a mutant),
starting pytest afresh for each and running the whole test command, since it has no
per-mutant test selection (a module-to-tests map would be ours to keep); it mutates
the files of the work tree in place, and parallel runs need HTTP workers with a
clone each. Both ran under pytest-trio (`trio_mode`) and `pythonpath = ["."]`;
mutmut's copy of the tree needs README.md and PROTOCOL.md (`also_copy`), which
`test_config.py` reads. Over the whole sample mutmut's test selection is what keeps
a mutant at a few seconds: the full fast suite takes minutes.
"""
GOALS = {"flux/shard/": 0.90, "flux/client/": 0.85}
KILLED, TIMEOUT, SURVIVED, NO_TESTS, EQUIV, OTHER = (
    "killed", "timed out", "survived", "no tests", "equivalent", "other")
COLUMNS = (KILLED, TIMEOUT, SURVIVED, NO_TESTS, EQUIV, OTHER)


def verdict(name: str, code: int | None) -> str:
    """mutmut's exit code -> the report's column (equivalence judged here, not by mutmut)."""
    if code in (1, 3):
        return KILLED
    if code in (24, -24, 36, 152, 255):
        return TIMEOUT
    if name in EQUIVALENT:
        return EQUIV
    if code == 0:
        return SURVIVED
    if code in (5, 33):
        return NO_TESTS
    return OTHER


@dataclass
class Row:
    counts: Counter[str]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def rate(self) -> float:
        judged = self.total - self.counts[EQUIV]
        return (self.counts[KILLED] + self.counts[TIMEOUT]) / judged if judged else 1.0

    def cells(self) -> str:
        return " | ".join([str(self.total), *(str(self.counts[c]) for c in COLUMNS),
                           f"{100 * self.rate:.1f} %"])


def diff_of(name: str) -> str:
    from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant

    lines = get_diff_for_mutant(name, path=find_mutant(name).path).splitlines()
    return "\n".join(line for line in lines[2:] if line[:1] in "+-")


def summary(record: RunRecord) -> dict[str, dict[str, int]]:
    """The sample's verdicts per area, as they stand now."""
    codes = exit_codes()
    areas: dict[str, Counter[str]] = {area: Counter() for area in AREAS}
    for name in record.sample:
        if name in codes:
            path, code = codes[name]
            areas[area_of(path)][verdict(name, code)] += 1
    return {area: dict(c) for area, c in areas.items()}


def write(record: RunRecord) -> str:
    codes = exit_codes()
    modules: dict[str, Counter[str]] = {}
    areas: dict[str, Counter[str]] = {area: Counter() for area in AREAS}
    listed: list[tuple[str, str]] = []
    for name in record.sample:
        path, code = codes[name]
        v = verdict(name, code)
        modules.setdefault(path, Counter())[v] += 1
        areas[area_of(path)][v] += 1
        if v in (SURVIVED, NO_TESTS, OTHER):
            listed.append((name, v))
    head = "| module | mutants | " + " | ".join(COLUMNS) + " | kill rate |"
    rule = "|---" * (len(COLUMNS) + 3) + "|"
    out = [
        "# Mutation testing report",
        "",
        f"Written by `make mutate` on {dt.date.today().isoformat()} (mutmut; the tests are the",
        "unit and property tests of `tests/` that start no process or socket, plus one",
        "simulator seed per scenario, `mutation/test_sim_seeds.py`). Each mutant ran only the",
        "tests that call its function, fastest first, stopping at the first failure.",
        "",
        "Kill rate = (killed + timed out) / (mutants - equivalent). *No tests*: no selected",
        "test calls the function. *Other*: a crash mutmut could not classify.",
        "Tests written for survivors are `tests/test_*_mutants_*.py` and",
        "`tests/test_core_cleanup_slices.py`; equivalent mutants, each with its reason, are",
        "`mutation/equivalents.py`.",
        "",
        f"- generated: {', '.join(f'{a} {n}' for a, n in record.generated.items())} mutants",
        f"- sample: {'every mutant' if not record.per_area else f'{record.per_area} per area'}, "
        f"drawn by `random.Random(\"{record.seed}:<area>\").sample` over the sorted names",
        "  (kept in `mutants/flux-run.json`; a re-run runs the same names again, so a function"
        " changed since has its mutants renumbered under the same names)",
        f"- run time: {record.run_seconds / 60:.1f} min with 2 workers"
        + (f"; re-runs after the tests added since: "
           f"{', '.join(f'{s / 60:.1f} min' for s in record.rerun_seconds)}"
           if record.rerun_seconds else ""),
        "",
        "## Per area",
        "",
        head.replace("module", "area") + " goal |",
        rule + "---|",
    ]
    out += [f"| {a} | {Row(c).cells()} | {100 * GOALS[a]:.0f} % |" for a, c in areas.items()]
    for i, earlier in enumerate(record.earlier, 1):
        out += ["", f"Before re-run {i} (the same sample, before the tests added since):", "",
                head.replace("module", "area"), rule]
        out += [f"| {a} | {Row(Counter(c)).cells()} |" for a, c in earlier.items()]
    out += ["", "## Per module", "", head, rule]
    out += [f"| {p} | {Row(c).cells()} |" for p, c in sorted(modules.items())]
    out += ["", TOOL_NOTE.rstrip()]
    out += ["", f"## Survivors ({len(listed)})", ""]
    if not listed:
        out.append("None.")
    for name, v in listed:
        out += [f"- `{name}` ({v})", "", "  ```diff",
                *(f"  {line}" for line in diff_of(name).splitlines()), "  ```"]
    equivalent = [n for n in record.sample if verdict(n, codes[n][1]) == EQUIV]
    out += ["", f"## Equivalent mutants ({len(equivalent)})", ""]
    out += [f"- `{n}`: {EQUIVALENT[n]}" for n in equivalent] or ["None."]
    text = "\n".join(out) + "\n"
    REPORT.write_text(text)
    return text
