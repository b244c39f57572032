"""The run half of the two-phase GPU check (`scripts/gpu_check.py run`): runtime-only TVM.

Runs on a machine that has a GPU, numpy and torch but no TVM compiler (and maybe no TVM at all: the
runtime-only package travels in .devbundle/site, see scripts/device_bundle.py). Imports nothing
from tvmfuse except bench/baselines.py's torch forms of the zoo, loaded by file path (it imports only
numpy and torch), so `tvm.relax` / the compiler library are never needed.

For each case of manifest.json (written by `gpu_check.py prepare`, tvmfuse/bench/gpu_cases.py):
  - load <case>.so with tvm.runtime.load_module and make tvm.runtime.vm.VirtualMachine on the device
  - regenerate the inputs (numpy default_rng(seed), as tvmfuse.zoo.workloads does) and check their sha256
  - poison: call once on NaN inputs first, so any output element the real call does not write
    still holds a NaN from the pooled allocator's previous buffer
  - check the outputs against a float64 reference computed here (the workload's torch form, or the
    attention math, with torch on the device; numpy float64 where torch is missing) and against the
    stored numpy reference where there is one
  - count kernel launches while running (vm.set_instrument: PrimFunc calls x __global__ kernels per
    PrimFunc from the manifest; the static count next to it)
  - time: per group (a workload, or attention at one seq), the systems interleaved round by round,
    each sample one call after an L2 flush (torch writes 2x the L2 size, then synchronizes), timed
    on the host clock from launch to device synchronization; the median is reported
  - peers on the same device: torch eager (the zoo's torch forms, float32), and for attention
    torch eager, scaled_dot_product_attention in float32 and in float16 with the flash backend
Writes gpu-run.json and gpu-run.md into --out and prints the table.

This file drives the run (main, run_isolated, run_group, tvm_system); its siblings hold the rest:
gpu_env.py (runtime-only TVM, torch, device facts, flush and timing), gpu_reference.py (inputs,
references, torch peers) and gpu_report.py (the tables, gpu-run.json and gpu-run.md).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)  # its siblings: gpu_reference.py (inputs, references, torch), gpu_report.py

from gpu_reference import (attention_reference, compare, inputs_digest, load_torch_forms,  # noqa: E402,F401
                           make_inputs, torch_peers, zoo_reference)
from gpu_report import _numerics, not_run, write_run  # noqa: E402
from gpu_env import Flush, device_facts, import_torch, setup_runtime, time_events, time_flushed  # noqa: E402,F401
NO_GPU_EXIT = 3
PEER_NAMES = ("torch", "torch eager", "torch sdpa fp32", "torch sdpa fp16 flash")  # do not fail the run


# ---------------------------------------------------------------- inputs and checks


class LaunchCounter:
    """vm.set_instrument hook: PrimFunc calls (names in `kernel_funcs`), as tvmfuse.runtime does.
    With `sync` (the device's synchronize), also each function's time: synchronize before and after
    every call, host clock between (launch overhead included; a profile, not the latency)."""

    def __init__(self, kernel_funcs, sync=None):
        self.only, self.counts, self.sync, self.ms, self._t = set(kernel_funcs), {}, sync, {}, 0.0

    def __call__(self, func, func_symbol, before_run, ret_value, *args):
        if func_symbol not in self.only:
            return 0
        if self.sync is not None:
            self.sync()
            if before_run:
                self._t = time.perf_counter()
            else:
                self.ms[func_symbol] = self.ms.get(func_symbol, 0.0) + (time.perf_counter() - self._t) * 1e3
        if not before_run:
            self.counts[func_symbol] = self.counts.get(func_symbol, 0) + 1
        return 0  # VMInstrumentReturnKind.NO_OP


def weighted(counts, per):
    if per is None:
        return sum(counts.values())
    return sum(n * per.get(f, 0) for f, n in counts.items())


# ---------------------------------------------------------------- systems
def _to_numpy(res):
    if hasattr(res, "numpy"):
        return res.numpy()
    return tuple(_to_numpy(r) for r in res)


def _flat(x):
    return x if isinstance(x, tuple) else (x,)


def _step(what):
    """One line on stderr before each step that can crash the process (the parent of an
    --isolate run keeps the tail of a crashed child's stderr, so the last line names the step)."""
    print(f"[step] {what}", file=sys.stderr, flush=True)


def tvm_system(case, case_dir, dev, inputs):
    """(call, outputs of a poisoned call, launches while running, facts) for a prepared case."""
    import numpy as np
    import tvm
    from tvm.runtime.vm import VirtualMachine

    t0 = time.perf_counter()
    _step(f"{case['id']}: load")
    lib = tvm.runtime.load_module(os.path.join(case_dir, case["file"]))
    vm = VirtualMachine(lib, dev)
    f = vm["main"]
    load_s = time.perf_counter() - t0
    _step(f"{case['id']}: poisoned call")
    poison = [tvm.runtime.tensor(np.full(a.shape, np.nan, a.dtype) if a.dtype.kind == "f" else np.zeros_like(a), dev)
              for a in inputs]
    r = f(*poison)
    dev.sync()
    del r
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    _step(f"{case['id']}: call")
    out = _flat(_to_numpy(f(*args)))
    _step(f"{case['id']}: counted call")
    counter_vm = VirtualMachine(lib, dev)
    kc = LaunchCounter(case["kernel_funcs"])
    counter_vm.set_instrument(kc)
    counter_vm["main"](*args)
    dev.sync()
    ran = weighted(kc.counts, case.get("kernels_per_func"))
    facts = {"load_s": round(load_s, 3), "calls": kc.counts}
    if case.get("input_gen"):  # a model (tvmfuse.bench.gpu_cases.bert_case): where its time goes, function by function
        _step(f"{case['id']}: profiled call")
        prof = LaunchCounter(case["kernel_funcs"], sync=dev.sync)
        counter_vm.set_instrument(prof)
        for _ in range(3):
            counter_vm["main"](*args)
        dev.sync()
        facts["profile_ms"] = {k: round(v / 3, 4) for k, v in sorted(prof.ms.items(), key=lambda kv: -kv[1])}
    return (lambda: f(*args)), out, ran, facts


# ---------------------------------------------------------------- driver
def run_group(gname, cases, args, dev, torch, forms, flush, budget_left):
    """Check and time one group; returns its row."""
    import numpy as np

    first = cases[0]
    row = {"group": gname, "workload": first["workload"], "attention": first.get("attention"), "systems": {},
           "skipped": {}, "errors": {}, "flops": first.get("flops"), "min_bytes": first.get("min_bytes")}
    inputs = make_inputs(first, args.dir)
    row["inputs_match_prepare"] = inputs_digest(inputs) == first.get("input_sha256")
    tdev = "cuda" if args.device == "cuda" else "cpu"
    if "attention" in first:
        ref, ref_src = attention_reference(first, inputs, torch, tdev)
    else:
        ref, ref_src = zoo_reference(first, inputs, torch, tdev, forms)
    stored = None
    if first.get("ref") and row["inputs_match_prepare"]:
        with np.load(os.path.join(args.dir, first["ref"])) as z:
            stored = tuple(z[f"out{i}"] for i in range(len(z.files)))
    if ref is None and stored is not None:
        ref, ref_src = stored, "stored numpy reference (float32)"
    row["reference"] = ref_src if ref is not None else "none"
    rtol, atol = first["rtol"], first["atol"]
    ready, outs = {}, {}
    sync_dev = (lambda: dev.sync())
    for c in cases:
        try:
            call, outs[c["system"]], ran, facts = tvm_system(c, args.dir, dev, inputs)
            row["systems"][c["system"]] = {"launches": c["launches"], "ran": ran,
                                           "kernels": len(c.get("kernels") or []),
                                           "host_fallbacks": c.get("host_fallbacks", []), **facts}
            ready[c["system"]] = (call, sync_dev)
        except Exception as err:  # noqa: BLE001  a case that fails must not stop the others
            row["errors"][c["system"]] = f"{type(err).__name__}: {str(err).strip()[:600]}"
            traceback.print_exc()
    if ref is None and len(outs) > 1:  # no independent reference here: the systems against each other
        base = "tvm" if "tvm" in outs else next(iter(outs))
        ref, ref_src = outs[base], f"cross-check against {base} only (no independent reference here)"
        row["reference"] = ref_src
    for name, out in outs.items():
        s = row["systems"][name]
        s["check"] = compare(out, ref, rtol, atol) if ref is not None else {"ok": False, "why": "no reference"}
        if stored is not None and ref_src != "stored numpy reference (float32)":
            s["check_stored"] = compare(out, stored, rtol, atol)
        s["ok"] = bool(s["check"]["ok"] and s.get("check_stored", {"ok": True})["ok"])
    if not args.no_peers:
        _step(f"{gname}: torch peers")
        try:
            peers = torch_peers(first, inputs, torch, tdev, forms)
        except Exception as err:  # noqa: BLE001
            peers = {"torch": f"{type(err).__name__}: {str(err)[:300]}"}
        for name, p in peers.items():
            if isinstance(p, str):
                row["skipped"][name] = p
                continue
            call, out, tol = p
            pr, pa = tol or (rtol, atol)
            check = compare(out, ref, pr, pa) if ref is not None else {"ok": False, "why": "no reference"}
            row["systems"][name] = {"check": check, "ok": check["ok"], "tolerance": [pr, pa], "peer": True}
            ready[name] = (call, torch.cuda.synchronize if tdev == "cuda" else (lambda: None))
    if budget_left() <= 0:
        row["skipped"]["timing"] = "the run's --max-seconds was spent"
        return row
    _time_rounds(row, ready, args, flush, torch if tdev == "cuda" else None)
    return row


def _time_rounds(row, ready, args, flush, torch):
    """`ready` ({name: (call, sync)}) timed in args.rounds interleaved rounds, on the host clock and
    (torch on CUDA) the device clock; medians into row["systems"], failures into row["errors"]."""
    samples, on_device, order = {n: [] for n in ready}, {n: [] for n in ready}, list(ready)
    events = torch is not None and torch.cuda.is_available()  # the device clock too
    for i in range(args.rounds):
        for n in order[i % len(order):] + order[: i % len(order)]:
            call, sync = ready[n]
            try:
                got = time_flushed(call, sync, flush, args.budget)
                samples[n] += got
                on_device[n] += time_events(call, flush, torch, len(got)) if events else []
            except Exception as err:  # noqa: BLE001
                row["errors"][n] = f"timing: {type(err).__name__}: {str(err)[:300]}"
                ready.pop(n)
                order.remove(n)
                break
    for n, v in samples.items():
        if v and n in row["systems"]:
            row["systems"][n]["ms"] = statistics.median(v) * 1e3
            row["systems"][n].update(p10_ms=sorted(v)[len(v) // 10] * 1e3, samples=len(v))
            if on_device.get(n):  # and the host's share: launch overhead
                dev_ms = row["systems"][n]["device_ms"] = statistics.median(on_device[n]) * 1e3
                row["systems"][n]["launch_overhead_ms"] = row["systems"][n]["ms"] - dev_ms


def run_isolated(args, argv) -> int:
    """--isolate: run every group as a child `gpu_check.py run --only GROUP` and merge their rows
    into one gpu-run.json / gpu-run.md; a child that dies (a signal) becomes a row whose error is
    the signal and the last lines of its stderr (the [step] it was in)."""
    import subprocess
    import tempfile

    t_start = time.perf_counter()
    with open(os.path.join(args.dir, "manifest.json")) as f:
        manifest = json.load(f)
    order = []
    for c in manifest["cases"] + manifest.get("failed", []):
        if c["group"] not in order:
            order.append(c["group"])
    only = {g.strip() for g in args.only.split(",") if g.strip()}
    base, skip = [], False
    for a in argv:  # the child's arguments: ours without --isolate, --only and --out
        if skip:
            skip = False
            continue
        if a in ("--only", "--out", "--max-seconds"):
            skip = True
            continue
        if a == "--isolate" or a.startswith(("--only=", "--out=", "--max-seconds=")):
            continue
        base.append(a)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check.py")
    rows, last, rc_all = [], None, 0
    for g in order:
        if only and g not in only:
            continue
        left = max(1.0, args.max_seconds - (time.perf_counter() - t_start))
        tmp = tempfile.mkdtemp(prefix=f"gpu-{g}-")
        cmd = [sys.executable, "-X", "faulthandler", script, "run", *base, "--only", g, "--out", tmp,
               "--max-seconds", f"{left:.0f}"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(p.stdout.split("\n\n")[0].split("\n", 1)[-1] + "\n" if p.stdout else "")
        path = os.path.join(tmp, "gpu-run.json")
        if p.returncode in (0, 1) and os.path.exists(path):
            with open(path) as f:
                last = json.load(f)
            rows += last["rows"]
            rc_all = max(rc_all, p.returncode)
        else:
            why = (f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}")
            tail = "\n".join(p.stderr.strip().splitlines()[-12:])
            print(f"{g}: CRASHED ({why})\n{tail}", flush=True)
            rows.append({"group": g, "workload": g, "attention": None, "systems": {}, "skipped": {},
                         "errors": {"run": f"the process died ({why}); stderr tail: {tail[-1500:]}"}})
            rc_all = 1
    if last is None:
        print("error: no group ran to the end", file=sys.stderr)
        return rc_all or 1
    wall = time.perf_counter() - t_start
    command = " ".join(["python3 scripts/gpu_check.py run", shlex.join(argv)]).strip()
    timing = last["timing"].rsplit(";", 1)[0] + f"; each group in its own process; {wall:.0f}s in all"
    facts, prep = last.get("facts", {}), manifest["prepared"]
    header = (f"{facts.get('device')} ({facts.get('nvidia_smi', '')}); cases built {prep['date']} for "
              f"{prep['target']} at git {prep['git'][:10]}; torch {facts.get('torch', '-')}")
    write_run(args.out, dict(last, command=command, timing=timing, rows=rows), header)
    return rc_all


def _parser():
    ap = argparse.ArgumentParser(prog="gpu_check.py run", description="Run prepared cases with runtime-only TVM.")
    ap.add_argument("--dir", default=os.path.join(".devbundle", "cases"))
    ap.add_argument("--bundle", default=".devbundle", help="holds site/ (runtime-only tvm) and cudart/")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join("results", "gpu"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--budget", type=float, default=0.05, help="seconds of flushed calls per system per round")
    ap.add_argument("--max-seconds", type=float, default=200, help="stop timing (still check) after this")
    ap.add_argument("--only", default="", help="comma-separated groups (default: all)")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-torch", action="store_true", help="do not import torch (CPU self-test)")
    ap.add_argument("--isolate", action="store_true",
                    help="each group in its own process: a crash (a segfault) costs that group only")
    return ap


def _run_groups(manifest, args, dev, torch, forms, flush, budget_left) -> list:
    """One row per group of the manifest's cases (those in --only), a group whose cases all failed
    to build included (its systems skipped with the build error)."""
    groups = {}
    for c in manifest["cases"]:
        groups.setdefault(c["group"], []).append(c)
    not_built = {}
    for f in manifest.get("failed", []):
        groups.setdefault(f["group"], [])
        not_built.setdefault(f["group"], {})[f["system"]] = f"build failed at prepare: {f['error']}"
    only = {g.strip() for g in args.only.split(",") if g.strip()}
    rows = []
    for g, cases in groups.items():
        if only and g not in only:
            continue
        t0 = time.perf_counter()
        if cases:
            row = run_group(g, cases, args, dev, torch, forms, flush, budget_left)
        else:
            row = {"group": g, "workload": g, "attention": None, "systems": {}, "skipped": {}, "errors": {}}
        row["skipped"].update(not_built.get(g, {}))
        rows.append(row)
        brief = ", ".join(f"{n} {s['ms']:.3f}" for n, s in row["systems"].items() if s.get("ms") is not None)
        print(f"{g}: {brief} ms | {_numerics(row)} | {time.perf_counter() - t0:.1f}s", flush=True)
    return rows


def _write_results(rows, manifest, args, argv, env, facts, flush, wall) -> None:
    """gpu-run.json and gpu-run.md into --out, and the table printed."""
    prep = manifest["prepared"]
    command = " ".join(["python3 scripts/gpu_check.py run", shlex.join(argv)]).strip()
    timing = (f"medians of single calls, each after a flush ({flush.how}), host clock from the call to device "
              f"synchronization; {args.rounds} interleaved rounds x {args.budget}s per system; {wall:.0f}s in all")
    header = (f"{facts.get('device')} ({facts.get('nvidia_smi', '')}); cases built {prep['date']} "
              f"for {prep['target']} at git {prep['git'][:10]}"
              + (f" (+ uncommitted {', '.join(prep['git_modified'])})" if prep.get("git_modified") else "")
              + f"; runtime-only TVM {env['tvm']}; torch {facts.get('torch', '-')}")
    result = {"command": command, "prepare_command": prep["command"], "facts": facts, "env": env,
              "prepared": prep, "timing": timing, "rows": rows}
    write_run(args.out, result, header, not_run(rows) + "\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.isolate:
        return run_isolated(args, argv)
    t_start = time.perf_counter()
    with open(os.path.join(args.dir, "manifest.json")) as f:
        manifest = json.load(f)
    want = "cuda" if args.device == "cuda" else "llvm"
    if manifest["prepared"]["target_kind"] != want:
        print(f"error: the cases in {args.dir} were built for {manifest['prepared']['target_kind']}, "
              f"not for --device {args.device}", file=sys.stderr)
        return 2
    env = setup_runtime(args.bundle, args.device)
    import tvm

    torch = import_torch(args.no_torch)
    dev = tvm.cuda(0) if args.device == "cuda" else tvm.cpu(0)
    if args.device == "cuda" and not dev.exist:
        print(f"error: tvm.cuda(0) does not exist (no CUDA GPU, or TVM's CUDA runtime did not load: {env}); "
              "run this on a machine with a GPU", file=sys.stderr)
        return NO_GPU_EXIT
    forms = None
    if torch is not None:
        try:
            forms = load_torch_forms()
        except Exception as err:  # noqa: BLE001  the zoo's torch forms missing: the peers are skipped, the check runs
            env["torch_forms"] = f"error: {err}"
    facts = device_facts(args.device, torch, dev)
    flush = Flush(args.device, torch)
    print(f"{facts.get('device')} | tvm {env['tvm']} runtime-only={env['runtime_only']} | "
          f"{len(manifest['cases'])} cases, {len({c['group'] for c in manifest['cases']})} groups | "
          f"flush: {flush.how}", flush=True)
    budget_left = lambda: args.max_seconds - (time.perf_counter() - t_start)  # noqa: E731
    rows = _run_groups(manifest, args, dev, torch, forms, flush, budget_left)
    _write_results(rows, manifest, args, argv, env, facts, flush, time.perf_counter() - t_start)
    bad = [r["group"] for r in rows if set(r["errors"]) - set(PEER_NAMES)
           or not all(s.get("ok") for s in r["systems"].values() if not s.get("peer"))]
    if bad:
        print(f"FAILED: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
