"""``python -m mutation run|rerun|report``: the commands behind ``make mutate``."""

from __future__ import annotations

import argparse

from mutation import driver, report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m mutation", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate, draw a sample, run it, write the report")
    run.add_argument("--per-area", type=int, default=200,
                     help="mutants drawn from flux/shard/ and from flux/client/ each (0: all)")
    run.add_argument("--seed", type=int, default=20)
    again = sub.add_parser("rerun", help="run the sample's survivors again, then report")
    again.add_argument("--all", action="store_true", help="run the whole sample again")
    for p in (run, again):
        p.add_argument("--workers", type=int, default=2)
    sub.add_parser("report", help="write mutation/REPORT.md from the last run")
    args = parser.parse_args()
    if args.command == "run":
        record = driver.run(args.per_area, args.seed, args.workers)
    elif args.command == "rerun":
        record = driver.rerun(args.workers, args.all, report.summary)
    else:
        record = driver.RunRecord.load()
    print(report.write(record).split("## Per module")[0])


if __name__ == "__main__":
    main()
