"""The run half of the GPU check (scripts/gpu_device.py): gpu-run.md's tables from the rows."""
from __future__ import annotations


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
