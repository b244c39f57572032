"""Differential fuzzing campaign: random graphs built unfused / stock fusion / tvmfuse on llvm.

  ./dev python scripts/fuzz.py --minutes 10 [--seed S] [--max-ops N] [--engine random|hypothesis]
                               [--json out.json] [--save-regressions tests/regressions]

Prints graphs tried, ops covered (a count per op), baseline failures (the unfused build fails too)
and fusion failures, each with its seed and the shrunk graph's id. Exit status 1 when a fusion
failure was found.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="campaign length (wall clock)")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--max-ops", type=int, default=8, help="ops per graph, at most (composites count once)")
    ap.add_argument("--engine", choices=("random", "hypothesis"), default="random")
    ap.add_argument("--json", help="write the summary (failures with their specs) to this file")
    ap.add_argument("--save-regressions", metavar="DIR", help="write each shrunk failure as DIR/<id>.json")
    args = ap.parse_args(argv)
    if args.minutes <= 0 or args.max_ops < 1:
        ap.error("--minutes must be > 0 and --max-ops >= 1")

    logging.getLogger("tvmfuse.schedule").setLevel(logging.ERROR)  # "left unscheduled" notes
    from tvmfuse.fuzz import campaign

    s = campaign.run(args.minutes, args.seed, args.max_ops, args.engine,
                     progress=lambda m: print(m, file=sys.stderr, flush=True))
    print(s.text())
    if args.json:
        with open(args.json, "w") as f:
            f.write(s.to_json())
    if args.save_regressions:
        for fail in s.failures:
            print("saved", campaign.save_regression(fail, args.save_regressions))
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
