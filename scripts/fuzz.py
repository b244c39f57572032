"""Differential fuzzing campaign: random graphs built unfused / stock fusion / tvmfuse on llvm.

  ./dev python scripts/fuzz.py --minutes 10 [--seed S] [--max-ops N] [--engine random|hypothesis]
                               [--shapes small|large] [--graph-timeout SECONDS]
                               [--json out.json] [--md out.md] [--save-regressions tests/regressions]

Prints graphs tried, ops covered (a count per op), the graphs whose tvmfuse build took each CPU
rewrite (Winograd, 1x1 conv as matmul, streaming stores), baseline failures (the unfused build
fails too) and fusion failures, each with its seed and the shrunk graph's id. Exit status 1 when a
fusion failure was found.

--shapes large: graphs with the anchors of the CPU rewrites (tvmfuse/fuzz/large.py), built with
the streaming-store thresholds at 1% of the last-level cache (large.CAMPAIGN_CPU, the CPU-table
overrides that TVMFUSE_CPU_STREAM_WORKING_SET_PCT=1 TVMFUSE_CPU_STREAM_OUTPUT_PCT=1 would set).
--graph-timeout: run the campaign in child processes and stop a graph that takes longer
(tvmfuse/fuzz/supervise.py); it is reported with its seed.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=1.0, help="campaign length (wall clock)")
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--max-ops", type=int, default=None,
                    help="vocabulary draws per graph, at most (a composite is one draw); default 8, 2 with --shapes large")
    ap.add_argument("--engine", choices=("random", "hypothesis"), default="random")
    ap.add_argument("--shapes", choices=("small", "large"), default="small",
                    help="large: graphs that Winograd, 1x1-as-matmul and streaming stores take")
    ap.add_argument("--graph-timeout", type=float, default=0, help="seconds per graph, in child processes (0: off)")
    ap.add_argument("--json", help="write the record (summary with the failures' specs, machine, command) here")
    ap.add_argument("--md", help="write the record as a markdown page here")
    ap.add_argument("--log", help="with --graph-timeout: the per-graph JSON-lines log (default: next to --json)")
    ap.add_argument("--save-regressions", metavar="DIR", help="write each shrunk failure as DIR/<id>.json")
    ap.add_argument("--child-log", help=argparse.SUPPRESS)
    ap.add_argument("--child-summary", help=argparse.SUPPRESS)
    return ap


def _campaign(args):
    from tvmfuse.fuzz import campaign, supervise

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.child_log:
        hooks = supervise.child_hooks(args.child_log, args.child_summary)
        return campaign.run(args.minutes, args.seed, args.max_ops, "random", shapes=args.shapes, on_graph=hooks)
    if args.graph_timeout > 0:
        if args.engine != "random":
            raise SystemExit("--graph-timeout runs the random engine only")
        log = args.log or (args.json or "fuzz") + ".log.jsonl"
        child = ["--max-ops", str(args.max_ops), "--shapes", args.shapes]
        return supervise.supervise(child, args.minutes, args.seed, args.max_ops, args.shapes, args.graph_timeout,
                                   log, progress=say)
    return campaign.run(args.minutes, args.seed, args.max_ops, args.engine, progress=say, shapes=args.shapes)


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.max_ops is None:
        args.max_ops = 2 if args.shapes == "large" else 8
    if args.minutes <= 0 or args.max_ops < 0 or (args.max_ops < 1 and args.shapes == "small"):
        ap.error("--minutes must be > 0 and --max-ops >= 1 (>= 0 with --shapes large)")

    logging.getLogger("tvmfuse.schedule").setLevel(logging.ERROR)  # "left unscheduled" notes
    from tvmfuse.fuzz import campaign, record
    from tvmfuse.fuzz.large import CAMPAIGN_CPU

    s = _campaign(args)
    if args.child_log:
        return 0
    print(s.text())
    command = "scripts/fuzz.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    doc = record.document(s, command, CAMPAIGN_CPU if args.shapes == "large" else {})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(record.markdown(doc))
    if args.save_regressions:
        for fail in s.failures:
            print("saved", campaign.save_regression(fail, args.save_regressions))
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
