"""A campaign's record (scripts/fuzz.py --json/--md): the summary, the command, the machine (CPU
model, cores, last-level cache, the CPU-table overrides in force), the commit and versions, as JSON
and as a short markdown page."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess


def machine() -> dict:
    import numpy
    import tvm

    from ..runtime.roofline import last_level_cache_bytes

    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), []) \
        if os.path.exists("/proc/cpuinfo") else []
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    llc = last_level_cache_bytes()
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "isa": [f for f in ("avx2", "avx512f", "amx_tile") if f in flags],
            "llc_mib": llc / 2**20 if llc else None, "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"),
            "commit": commit + (" (with uncommitted changes)" if dirty else ""), "python": platform.python_version(),
            "tvm": tvm.__version__, "numpy": numpy.__version__,
            "env_overrides": {k: v for k, v in os.environ.items() if k.startswith("TVMFUSE_CPU_")}}


def document(summary, command: str, cpu_overrides: dict) -> dict:
    from dataclasses import asdict

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "machine": machine(), "campaign_cpu_overrides": cpu_overrides,
            "summary": asdict(summary)}


def markdown(doc: dict) -> str:
    s, m = doc["summary"], doc["machine"]
    rw = s["rewrites"]
    lines = [f"# Fuzz campaign, {s['shapes']} shapes ({doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {', '.join(m['isa'])}, last-level cache {m['llc_mib']:.0f} MiB; "
             f"TVM_NUM_THREADS={m['tvm_num_threads']}; commit {m['commit']}; Python {m['python']}, TVM {m['tvm']}, "
             f"numpy {m['numpy']}.", "",
             f"CPU-table overrides for every build of a large graph: {doc['campaign_cpu_overrides']}; the unfused "
             "reference is built with the three rewrites off (tvmfuse/fuzz/large.py).", "",
             "| | count |", "|---|---|",
             f"| wall time | {s['seconds'] / 60:.1f} min |",
             f"| graphs checked (shrink attempts included) | {s['graphs']} |",
             f"| distinct graphs | {s['distinct']} |"]
    for k, label in (("any", "at least one of the three rewrites"), ("winograd", "Winograd F(m x m, 3x3)"),
                     ("conv1x1_matmul", "1x1 conv as a matmul"), ("streaming_stores", "streaming stores (rewritten)"),
                     ("stream_marked", "streaming stores (kernel marked)")):
        lines.append(f"| graphs whose tvmfuse build took: {label} | {rw.get(k, 0)} |")
    lines += [f"| multi-output graphs | {s['multi_output']} |", f"| non-default knobs | {s['with_knobs']} |",
              f"| kernel launches summed (none / stock / tvmfuse) | {s['launches']['none']} / {s['launches']['tvm']}"
              f" / {s['launches']['tvmfuse']} |",
              f"| baseline failures (the unfused build fails too) | {len(s['baseline_failures'])} |",
              f"| graphs over the per-graph time limit | {len(s['timeouts'])} |",
              f"| fusion failures | {len(s['failures'])} |", "",
              "Ops covered: " + ", ".join(f"{k} {v}" for k, v in sorted(s["ops"].items())) + "."]
    if s["timeouts"]:
        lines += ["", "## Over the time limit", ""]
        lines += [f"- seed {t['seed']} ({t['spec_id']}): {t['what']} after {t['seconds']:.0f} s" for t in s["timeouts"]]
    if s["failures"]:
        lines += ["", "## Failures", ""]
        lines += [f"- seed {f['seed']} -> tests/regressions/{f['spec_id']}.json ({len(f['spec']['ops'])} ops): "
                  f"{f['kind']} [{f['variant']}] {f['detail'][:300]}" for f in s["failures"]]
    return "\n".join(lines) + "\n"
