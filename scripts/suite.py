"""The model suite: the transformers architectures of tvmfuse.suite.archs, one process per model.

  python scripts/suite.py --tiny                      # the CI-sized configs, import/build/numerics/backend
  python scripts/suite.py --batch 1 --timeout 1800    # full size: every stage, latency included
  python scripts/suite.py --merge A.json B.json --json C.json   # one result from an interrupted run and its rest

Rows and summary: --json PATH (default results/suite/suite-<size>-b<batch>.json) and --markdown PATH
(.md beside it). Stages: import,onnx,build,numerics,latency,backend (latency only at full size).
See tvmfuse/suite/ for what each stage does.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvmfuse.suite import archs, summary  # noqa: E402
from tvmfuse.suite.process import run_isolated  # noqa: E402
from tvmfuse.suite.runner import STAGES  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="the tiny configs (default: full size)")
    p.add_argument("--models", default="", help=f"comma-separated subset of: {','.join(archs.names())}")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--timeout", type=float, default=None, help="seconds per model (default 600 tiny, 1800 full)")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="merge these result files (a later row replaces an earlier one of the same model) into --json")
    a = p.parse_args(argv)
    unknown = [m for m in a.models.split(",") if m and m not in archs.BY_NAME]
    bad = [s for s in a.stages.split(",") if s not in STAGES]
    if unknown or bad:
        p.error(f"unknown models {unknown} or stages {bad}; stages: {','.join(STAGES)}")
    return a


def merge(a, argv):
    import json

    if not a.json:
        raise SystemExit("--merge needs --json PATH for the merged result")
    results = []
    for path in a.merge:
        with open(path) as f:
            results.append(json.load(f))
    command = "python scripts/suite.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = summary.merge(results, command)
    summary.write(result, a.json, a.markdown or os.path.splitext(a.json)[0] + ".md")
    print(f"merged {len(result['rows'])} rows into {a.json}")
    return result


def main(argv=None):
    a = parse(argv)
    if a.merge:
        return merge(a, argv)
    size = "tiny" if a.tiny else "full"
    models = [m for m in a.models.split(",") if m] or archs.names()
    stages = tuple(a.stages.split(","))
    timeout = a.timeout or (600 if a.tiny else 1800)
    json_path = a.json or f"results/suite/suite-{size}-b{a.batch}.json"
    md_path = a.markdown or os.path.splitext(json_path)[0] + ".md"
    result = {"size": size, "batch": a.batch, "stages": stages, "timeout_s": timeout,
              "command": "python scripts/suite.py " + shlex.join(sys.argv[1:] if argv is None else argv),
              "machine": summary.machine(), "rows": []}
    for i, name in enumerate(models):
        t0 = time.perf_counter()
        row = run_isolated(name, size, a.batch, stages, timeout)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        result["rows"].append(row)
        failed = [f"{s}: {v.get('error', '')}" for s, v in row["stages"].items() if not v["ok"]]
        print(f"[{i + 1}/{len(models)}] {name}: {'ok' if not failed else failed[0][:160]} ({row['wall_s']} s)",
              flush=True)
        result["summary"] = summary.summarize(result["rows"])
        summary.write(result, json_path, md_path)  # after every model: an interrupted run keeps its rows
    print(f"wrote {json_path} and {md_path}")
    return result


if __name__ == "__main__":
    main()
