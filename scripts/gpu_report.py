"""The run half of the GPU check (scripts/gpu_device.py): gpu-run.md's tables from the rows, and
the gpu-run.json / gpu-run.md it writes."""
from __future__ import annotations

import json
import os


def _ms(row, n):
    return row["systems"].get(n, {}).get("ms")


def _fmt(x, spec=".3f"):
    return format(x, spec) if x is not None else "-"


def _ratio(row, a, b):
    x, y = _ms(row, a), _ms(row, b)
    return f"{y / x:.2f}x" if x and y else "-"


def tables(rows) -> str:
    zoo = [r for r in rows if not r["attention"]]
    att = [r for r in rows if r["attention"]]
    lines = []
    if zoo:
        lines += ["| workload | tvm ms | tvmfuse ms | torch ms | tvmfuse vs tvm | tvmfuse vs torch | "
                  "launches tvm/tvmfuse (static) | ran | numerics (max rel err) |", "|" + "---|" * 9]
        for r in zoo:
            sy = r["systems"]
            lc = lambda k: "/".join(str(sy.get(s, {}).get(k, "-")) for s in ("tvm", "tvmfuse"))
            lines.append(f"| {r['workload']} | {_fmt(_ms(r, 'tvm'))} | {_fmt(_ms(r, 'tvmfuse'))} | "
                         f"{_fmt(_ms(r, 'torch'))} | {_ratio(r, 'tvmfuse', 'tvm')} | {_ratio(r, 'tvmfuse', 'torch')} | "
                         f"{lc('launches')} | {lc('ran')} | {_numerics(r)} |")
    if att:
        names = ["tvmfuse", "tvmfuse-unfused", "tvm", "torch eager", "torch sdpa fp32", "torch sdpa fp16 flash"]
        names[1:1] = sorted({n for r in att for n in r["systems"] if n not in names})  # kernel variants
        lines += ["", "| seq | mask | " + " | ".join(f"{n} ms" for n in names) + " | tvmfuse GFLOP/s | "
                  "tvmfuse vs sdpa fp32 | vs unfused | vs tvm | launches fused/unfused/tvm | numerics (max rel err) |",
                  "|" + "---|" * (len(names) + 8)]
        for r in att:
            a, ms = r["attention"], _ms(r, "tvmfuse")
            gf = f"{r['flops'] / ms / 1e6:.0f}" if ms and r.get("flops") else "-"
            launches = "/".join(str(r["systems"].get(s, {}).get("ran", "-"))
                                for s in ("tvmfuse", "tvmfuse-unfused", "tvm"))
            lines.append(f"| {a['seq']} | {a['mask'] or '-'} | " + " | ".join(_fmt(_ms(r, n)) for n in names)
                         + f" | {gf} | {_ratio(r, 'tvmfuse', 'torch sdpa fp32')} | "
                         f"{_ratio(r, 'tvmfuse', 'tvmfuse-unfused')} | {_ratio(r, 'tvmfuse', 'tvm')} | {launches} | "
                         f"{_numerics(r)} |")
    clocked = [r for r in rows if any("device_ms" in sy for sy in r["systems"].values())]
    if clocked:
        names = sorted({n for r in clocked for n, sy in r["systems"].items() if "device_ms" in sy})
        lines += ["", "Device clock (CUDA events around each call, after the same flush): median ms, and in brackets "
                  "the launch overhead (host-clock median minus device-clock median)", "",
                  "| case | " + " | ".join(f"{n} device ms" for n in names) + " |", "|" + "---|" * (len(names) + 1)]
        for r in clocked:
            case = r["workload"] if not r["attention"] else f"attention {r['attention']['seq']} {r['attention']['mask'] or ''}"
            cells = [f"{sy['device_ms']:.4f} (+{sy['launch_overhead_ms']:.4f})" if "device_ms" in sy else "-"
                     for sy in (r["systems"].get(n, {}) for n in names)]
            lines.append(f"| {case.strip()} | " + " | ".join(cells) + " |")
    for r in rows:  # a model's profile: its costliest kernel functions per system
        for name, sy in r["systems"].items():
            prof = sy.get("profile_ms")
            if prof:
                total = sum(prof.values())
                lines += ["", f"{r['workload']}, {name}: {total:.3f} ms over {len(prof)} kernel functions "
                          "(each call synchronized; the costliest 8):", "",
                          "| function | ms per inference | share |", "|---|---|---|"]
                lines += [f"| {k} | {v:.4f} | {v / total:.1%} |" for k, v in list(prof.items())[:8]]
    return "\n".join(lines)


def _numerics(r):
    bad = [n for n, s in r["systems"].items() if not s.get("ok")] + [f"{n} (error)" for n in r["errors"]]
    worst = max((s["check"].get("max_rel", 0) for n, s in r["systems"].items()
                 if "check" in s and "fp16" not in n), default=None)
    tail = f" ({worst:.1e})" if worst is not None else ""
    unbuilt = [n for n, why in r["skipped"].items() if why.startswith("build failed")]
    tail += f"; not built: {', '.join(unbuilt)}" if unbuilt else ""
    return ("ok" if not bad else "FAIL " + ", ".join(bad)) + tail


def not_run(rows) -> str:
    """gpu-run.md's "Not run:" list: each skipped system with its reason and the groups ("" if none)."""
    by_reason = {}
    for r in rows:
        for n, why in r["skipped"].items():
            by_reason.setdefault((n, why), []).append(r["group"])
    skipped = [f"- {n} ({why}): " + ("every group" if len(gs) == len(rows) > 1 else ", ".join(gs))
               for (n, why), gs in by_reason.items()]
    return "\n".join(["", "Not run:"] + skipped) if skipped else ""


def write_run(out, result, header, tail="") -> None:
    """gpu-run.json (`result`) and gpu-run.md (the command, header, timing, tables, then `tail`)
    into `out`, and the same printed."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gpu-run.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    table = tables(result["rows"])
    command, timing = result["command"], result["timing"]
    with open(os.path.join(out, "gpu-run.md"), "w") as f:
        f.write(f"`{command}`\n\n(cases: `{result['prepared']['command']}`)\n\n{header}\n\n{timing}\n\n{table}\n{tail}")
    print(f"\n{header}\n{timing}\n\n{table}\n{tail}\nwrote {out}/gpu-run.json and gpu-run.md")
