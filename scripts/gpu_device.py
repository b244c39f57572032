"""The run half of the two-phase GPU check (`scripts/gpu_check.py run`): runtime-only TVM.

Runs on a machine that has a GPU, numpy and torch but no TVM compiler (and maybe no TVM at all: the
runtime-only package travels in .devbundle/site, see scripts/device_bundle.py). Imports nothing
from tvmfuse except baselines.py's torch forms of the zoo, loaded by file path (it imports only
numpy and torch), so `tvm.relax` / the compiler library are never needed.

For each case of manifest.json (written by `gpu_check.py prepare`, tvmfuse/gpu_cases.py):
  - load <case>.so with tvm.runtime.load_module and make tvm.runtime.vm.VirtualMachine on the device
  - regenerate the inputs (numpy default_rng(seed), as tvmfuse.workloads does) and check their sha256
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
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import importlib.util
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NO_GPU_EXIT = 3
FALLBACK_FLUSH_BYTES = 256 << 20
PEER_NAMES = ("torch", "torch eager", "torch sdpa fp32", "torch sdpa fp16 flash")  # do not fail the run


# ---------------------------------------------------------------- environment
def setup_runtime(bundle: str, device: str) -> dict:
    """Make `import tvm` the runtime-only TVM (the bundle's, unless one is importable already),
    import it, and on CUDA load TVM's CUDA runtime library (runtime-only TVM does not). Returns
    facts for the report. Call before anything imports tvm."""
    info = {}
    site, fallback = os.path.join(bundle, "site"), os.path.join(bundle, "fallback")
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")  # no JIT build of a torch addon
    if os.path.isdir(site) and os.path.abspath(site) not in [os.path.abspath(p) for p in sys.path]:
        sys.path.insert(0, os.path.abspath(site))
    if os.path.isdir(fallback):
        sys.path.append(os.path.abspath(fallback))  # last: the machine's own typing_extensions wins
    if device == "cuda":
        try:
            import torch  # noqa: F401  (first, so its CUDA libraries are the ones loaded)
        except ImportError:
            pass
    t0 = time.perf_counter()
    import tvm

    info["tvm"] = tvm.__version__
    info["tvm_file"] = os.path.dirname(tvm.__file__)
    info["runtime_only"] = bool(tvm.base._RUNTIME_ONLY)
    info["import_s"] = round(time.perf_counter() - t0, 2)
    if device == "cuda":
        info.update(load_cuda_runtime(tvm, bundle))
    info["compiler_modules"] = sorted(m for m in ("tvm.relax", "tvmfuse") if m in sys.modules)
    return info


def _cudart_candidates(bundle):
    pats = ["/usr/local/cuda*/lib64/libcudart.so.13*", "/usr/local/cuda*/targets/*/lib/libcudart.so.13*",
            "/usr/lib/x86_64-linux-gnu/libcudart.so.13*"]
    for p in sys.path:
        pats.append(os.path.join(p, "nvidia", "*", "lib", "libcudart.so.13*"))
        pats.append(os.path.join(p, "nvidia", "cu13", "lib", "libcudart.so.13*"))
    out = []
    for pat in pats:
        out += sorted(glob.glob(pat))
    out.append(os.path.join(bundle, "cudart", "libcudart.so.13"))
    return out


def load_cuda_runtime(tvm, bundle) -> dict:
    """Load libcudart.so.13 (the system's, else a pip-installed one, else the bundle's copy) and
    TVM's libtvm_runtime_cuda.so, which registers the cuda device API and the loader of CUDA
    modules ("ffi.Module.load_from_bytes.cuda")."""
    info = {}
    try:
        ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
        info["cudart"] = "libcudart.so.13 (loader path)"
    except OSError:
        errors = []
        for path in _cudart_candidates(bundle):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                info["cudart"] = path
                break
            except OSError as err:
                errors.append(f"{path}: {err}")
        else:
            info["cudart"] = None
            info["cudart_errors"] = errors[-3:]
    from tvm_ffi.libinfo import load_lib_ctypes

    from pathlib import Path

    lib_dir = Path(tvm.__file__).resolve().parent / "lib"
    for name in ("tvm_runtime_cuda", "tvm_runtime_extra"):
        if name in tvm.base._LOADED_LIBS:
            continue
        try:
            tvm.base._LOADED_LIBS[name] = load_lib_ctypes("tvm", name, "RTLD_LOCAL", extra_lib_paths=[lib_dir])
            info[name] = "loaded"
        except Exception as err:  # noqa: BLE001  OSError, RuntimeError; reported, the run goes on
            info[name] = f"failed: {str(err).splitlines()[0][:300]}"
    info["cuda_enabled"] = bool(tvm.runtime.enabled("cuda"))
    return info


def load_torch_forms():
    """tvmfuse/baselines.py's torch forms of the zoo, {name: f(workload) -> fn}, loaded by path
    (importing the tvmfuse package would import the compiler)."""
    path = os.path.join(ROOT, "tvmfuse", "baselines.py")
    spec = importlib.util.spec_from_file_location("tvmfuse_baselines_standalone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._torch_fns()


# ---------------------------------------------------------------- inputs and checks
def make_inputs(case, case_dir="."):
    """The case's inputs exactly as tvmfuse.workloads.Workload.inputs() makes them; a model's as
    its input_gen says (stored in inputs_file, or tvmfuse.gpu_cases.generated_weight)."""
    import numpy as np

    if "input_gen" in case:
        out = []
        with np.load(os.path.join(case_dir, case["inputs_file"])) as z:
            for g, (_name, shape, dtype) in zip(case["input_gen"], case["inputs"]):
                if g["rule"] == "stored":
                    out.append(z[g["key"]])
                else:  # "normal": the same expression as gpu_cases.generated_weight
                    out.append(np.random.default_rng(g["seed"]).standard_normal(tuple(shape), dtype=np.float32)
                               * np.float32(g["scale"]))
        return out
    rng = np.random.default_rng(case["seed"])
    out = []
    for name, shape, dtype in case["inputs"]:
        a = rng.standard_normal(tuple(shape)).astype(dtype)
        if name in case.get("positive", ()):
            a = np.abs(a) + 0.5
        out.append(a)
    return out


def inputs_digest(arrays) -> str:
    """The same digest as tvmfuse.gpu_cases.inputs_digest."""
    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def compare(out, ref, rtol, atol) -> dict:
    """ok (allclose at rtol/atol, no NaN), max abs error, max error relative to max |ref|."""
    import numpy as np

    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if len(out) != len(ref):
        return {"ok": False, "why": f"{len(out)} outputs, expected {len(ref)}"}
    ok, max_abs, max_rel, nan = True, 0.0, 0.0, False
    for o, r in zip(out, ref):
        o, r = np.asarray(o, dtype="float64"), np.asarray(r, dtype="float64")
        if o.shape != r.shape:
            return {"ok": False, "why": f"shape {o.shape}, expected {r.shape}"}
        nan |= bool(np.isnan(o).any())
        d = float(np.abs(o - r).max()) if o.size else 0.0
        max_abs = max(max_abs, d)
        max_rel = max(max_rel, d / max(float(np.abs(r).max()) if r.size else 0.0, 1e-30))
        ok &= bool(np.allclose(o, r, rtol=rtol, atol=atol))
    return {"ok": ok and not nan, "max_abs": max_abs, "max_rel": max_rel, "nan": nan}


def attention_reference(case, inputs, torch, device):
    """softmax(Q·Kᵀ/sqrt(d) [causal: where(tril, ., -1e9)])·V on [b, s, h*d] inputs, heads split
    and merged as tvmfuse.workloads.attention_workload does, in float64."""
    import numpy as np

    a = case["attention"]
    b, s, h, d = a["batch"], a["seq"], a["heads"], a["head_dim"]
    if torch is not None:
        q, k, v = (torch.from_numpy(x).to(device=device, dtype=torch.float64) for x in inputs)
        th = lambda t: t.reshape(b, s, h, d).permute(0, 2, 1, 3)
        sc = th(q) @ th(k).transpose(-1, -2) * (1.0 / math.sqrt(d))
        if a["mask"] == "causal":
            tril = torch.ones(s, s, dtype=torch.bool, device=device).tril()
            sc = torch.where(tril, sc, torch.tensor(-1e9, dtype=torch.float64, device=device))
        o = torch.softmax(sc, dim=-1) @ th(v)
        return (o.permute(0, 2, 1, 3).reshape(b, s, h * d).cpu().numpy(),), f"torch float64 on {device}"
    q, k, v = (x.astype("float64") for x in inputs)
    th = lambda t: t.reshape(b, s, h, d).transpose(0, 2, 1, 3)
    sc = th(q) @ th(k).transpose(0, 1, 3, 2) / math.sqrt(d)
    if a["mask"] == "causal":
        sc = np.where(np.tril(np.ones((s, s), dtype=bool)), sc, -1e9)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    o = (e / e.sum(-1, keepdims=True)) @ th(v)
    return (o.transpose(0, 2, 1, 3).reshape(b, s, h * d),), "numpy float64"


def zoo_reference(case, inputs, torch, device, forms):
    """The workload's torch form (tvmfuse.baselines) in float64 on the device; None without torch."""
    if torch is None or forms is None or case.get("torch_form") not in forms:
        return None, "no torch form here"
    fn = forms[case["torch_form"]](_workload_view(case))
    with torch.no_grad():
        out = fn(*[torch.from_numpy(x).to(device=device, dtype=torch.float64) for x in inputs])
    out = out if isinstance(out, tuple) else (out,)
    return tuple(o.cpu().numpy() for o in out), f"torch float64 on {device}"


def _workload_view(case):
    from types import SimpleNamespace

    specs = [(n, tuple(s), d) for n, s, d in case["inputs"]]
    return SimpleNamespace(name=case["workload"], input_specs=specs, meta=case.get("meta", {}))


# ---------------------------------------------------------------- timing
class Flush:
    """Evicts the caches before a timed call: writes a buffer of twice the device's L2 (CUDA:
    torch, then synchronizes) or FALLBACK_FLUSH_BYTES (CPU: numpy)."""

    def __init__(self, device, torch):
        self.torch, self.device = torch, device
        if device == "cuda" and torch is not None and torch.cuda.is_available():
            l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
            self.nbytes = 2 * int(l2) if l2 else FALLBACK_FLUSH_BYTES
            self.buf = torch.empty(self.nbytes // 4, dtype=torch.int32, device="cuda")
            self.how = f"torch zero_() of {self.nbytes / 2**20:.0f} MiB (2x L2 {l2 / 2**20:.0f} MiB) + synchronize"
        elif device == "cuda":
            self.nbytes, self.buf, self.how = 0, None, "none (torch with CUDA is missing)"
        else:
            import numpy as np

            self.nbytes = 64 << 20
            self.buf = np.empty(self.nbytes // 4, dtype="int32")
            self.how = f"numpy fill of {self.nbytes / 2**20:.0f} MiB"

    def __call__(self):
        if self.buf is None:
            return
        if self.device == "cuda":
            self.buf.zero_()
            self.torch.cuda.synchronize()
        else:
            self.buf.fill(1)


def time_flushed(call, sync, flush, budget_s):
    """Seconds of single calls, each after flush(): one warm-up, then calls until budget_s of wall
    time has passed (at least one). The same loop as tvmfuse.bench_gpu.time_flushed."""
    call()
    sync()
    samples, t_end = [], time.perf_counter() + budget_s
    while not samples or time.perf_counter() < t_end:
        flush()
        t0 = time.perf_counter()
        call()
        sync()
        samples.append(time.perf_counter() - t0)
    return samples


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
    if len(case["kernel_funcs"]) > 8:  # a model: where its time goes, function by function
        _step(f"{case['id']}: profiled call")
        prof = LaunchCounter(case["kernel_funcs"], sync=dev.sync)
        counter_vm.set_instrument(prof)
        for _ in range(3):
            counter_vm["main"](*args)
        dev.sync()
        facts["profile_ms"] = {k: round(v / 3, 4) for k, v in sorted(prof.ms.items(), key=lambda kv: -kv[1])}
    return (lambda: f(*args)), out, ran, facts


def torch_peers(case, inputs, torch, device, forms):
    """{name: (call, outputs as numpy, tolerance override or None)} or {name: why not}."""
    out = {}
    if torch is None:
        return {"torch": "torch is not installed"}
    if device == "cuda" and not torch.cuda.is_available():
        return {"torch": "torch.cuda.is_available() is False"}
    t = [torch.from_numpy(x).to(device) for x in inputs]

    def entry(fn, tol=None):
        def call():
            with torch.no_grad():
                return fn()
        res = call()
        res = res if isinstance(res, tuple) else (res,)
        return call, tuple(r.float().cpu().numpy() for r in res), tol

    if "model" in case:
        fn = model_peer(case, inputs, torch, device)
        if isinstance(fn, str):
            return {"torch": fn}
        ids = t[0]
        out["torch"] = entry(lambda: fn(ids))
        return out
    if "attention" not in case:
        if forms is None or case.get("torch_form") not in forms:
            return {"torch": "no torch form"}
        fn = forms[case["torch_form"]](_workload_view(case))
        out["torch"] = entry(lambda: fn(*t))
        return out
    a = case["attention"]
    b, s, h, d = a["batch"], a["seq"], a["heads"], a["head_dim"]
    causal = a["mask"] == "causal"
    heads = lambda x: x.view(b, s, h, d).transpose(1, 2)
    merge = lambda o: o.transpose(1, 2).reshape(b, s, h * d)
    F = torch.nn.functional
    if forms is not None and not causal:
        fn = forms["attention"](_workload_view(case))
        out["torch eager"] = entry(lambda: fn(*t))
    elif causal:
        tril = torch.ones(s, s, dtype=torch.bool, device=device).tril()

        def eager():
            sc = heads(t[0]) @ heads(t[1]).transpose(-1, -2) * (1.0 / math.sqrt(d))
            sc = torch.where(tril, sc, torch.tensor(-1e9, device=device))
            return merge(torch.softmax(sc, -1) @ heads(t[2]))
        out["torch eager"] = entry(eager)
    out["torch sdpa fp32"] = entry(lambda: merge(F.scaled_dot_product_attention(
        heads(t[0]), heads(t[1]), heads(t[2]), is_causal=causal)))
    if device == "cuda":
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            th = [x.half() for x in t]

            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return merge(F.scaled_dot_product_attention(heads(th[0]), heads(th[1]), heads(th[2]),
                                                                is_causal=causal))
            out["torch sdpa fp16 flash"] = entry(flash, (1e-2, 1e-2))
        except Exception as err:  # no flash kernel for this GPU / build
            out["torch sdpa fp16 flash"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return out


def model_peer(case, inputs, torch, device):
    """The BERT in transformers (if installed here) with the case's weights: f(ids) -> hidden
    states, or why not."""
    if "bert_config" not in case["model"]:
        return f"no torch form of {case['model']['name']}"
    try:
        from transformers import BertConfig, BertModel
    except ImportError:
        return "transformers is not installed here"
    bert = BertModel(BertConfig(**case["model"]["bert_config"])).eval()
    with torch.no_grad():
        for name, a in zip(case["module_names"], inputs[1:]):
            n = name[len("bert."):] if name.startswith("bert.") else name
            t = bert.get_parameter(n) if n in dict(bert.named_parameters()) else bert.get_buffer(n)
            t.copy_(torch.from_numpy(a))
    bert = bert.to(device)
    return lambda ids: bert(input_ids=ids).last_hidden_state


# ---------------------------------------------------------------- driver
def device_facts(device, torch, dev):
    facts = {"host": platform.node(), "python": platform.python_version(), "machine": platform.machine()}
    try:
        import numpy as np

        facts["numpy"] = np.__version__
    except ImportError:
        pass
    if torch is not None:
        facts["torch"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
    if device == "cuda":
        if torch is not None and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            facts["device"] = torch.cuda.get_device_name(0)
            facts["capability"] = f"sm_{p.major}{p.minor}"
            facts["memory_gib"] = round(p.total_memory / 2**30, 1)
            facts["l2_bytes"] = getattr(p, "L2_cache_size", None)
            facts["sms"] = p.multi_processor_count
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            facts["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        except (OSError, subprocess.SubprocessError) as err:
            facts["nvidia_smi"] = f"unavailable: {err}"
        try:
            facts["tvm_device"] = str(dev.device_name)
            facts["tvm_compute_version"] = str(dev.compute_version)
        except Exception as err:  # noqa: BLE001
            facts["tvm_device"] = f"error: {err}"
    else:
        try:
            with open("/proc/cpuinfo") as f:
                facts["device"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        except (OSError, StopIteration):
            facts["device"] = platform.processor()
    return facts


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
    samples = {n: [] for n in ready}
    order = list(ready)
    for i in range(args.rounds):
        for n in order[i % len(order):] + order[: i % len(order)]:
            call, sync = ready[n]
            try:
                samples[n] += time_flushed(call, sync, flush, args.budget)
            except Exception as err:  # noqa: BLE001
                row["errors"][n] = f"timing: {type(err).__name__}: {str(err)[:300]}"
                ready.pop(n)
                order.remove(n)
                break
    for n, v in samples.items():
        if v and n in row["systems"]:
            row["systems"][n]["ms"] = statistics.median(v) * 1e3
            row["systems"][n]["p10_ms"] = sorted(v)[len(v) // 10] * 1e3
            row["systems"][n]["samples"] = len(v)
    return row


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
    os.makedirs(args.out, exist_ok=True)
    timing = last["timing"].rsplit(";", 1)[0] + f"; each group in its own process; {wall:.0f}s in all"
    result = dict(last, command=command, timing=timing, rows=rows)
    with open(os.path.join(args.out, "gpu-run.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    table = tables(rows)
    facts, prep = last.get("facts", {}), manifest["prepared"]
    header = (f"{facts.get('device')} ({facts.get('nvidia_smi', '')}); cases built {prep['date']} for "
              f"{prep['target']} at git {prep['git'][:10]}; torch {facts.get('torch', '-')}")
    with open(os.path.join(args.out, "gpu-run.md"), "w") as f:
        f.write(f"`{command}`\n\n(cases: `{prep['command']}`)\n\n{header}\n\n{timing}\n\n{table}\n")
    print(f"\n{header}\n{timing}\n\n{table}\n\nwrote {args.out}/gpu-run.json and gpu-run.md")
    return rc_all


def main(argv=None) -> int:
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
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
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

    torch = None
    if not args.no_torch:
        try:
            import torch

            # float32 peers in full float32 (cuDNN convolutions default to TF32 on Ampere and later)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except ImportError:
            torch = None
    dev = tvm.cuda(0) if args.device == "cuda" else tvm.cpu(0)
    if args.device == "cuda" and not dev.exist:
        print(f"error: tvm.cuda(0) does not exist (no CUDA GPU, or TVM's CUDA runtime did not load: {env}); "
              "run this on a machine with a GPU", file=sys.stderr)
        return NO_GPU_EXIT
    forms = None
    if torch is not None:
        try:
            forms = load_torch_forms()
        except Exception as err:  # noqa: BLE001
            env["torch_forms"] = f"error: {err}"
    facts = device_facts(args.device, torch, dev)
    flush = Flush(args.device, torch)
    groups = {}
    for c in manifest["cases"]:
        groups.setdefault(c["group"], []).append(c)
    only = {g.strip() for g in args.only.split(",") if g.strip()}
    budget_left = lambda: args.max_seconds - (time.perf_counter() - t_start)
    rows = []
    print(f"{facts.get('device')} | tvm {env['tvm']} runtime-only={env['runtime_only']} | "
          f"{len(manifest['cases'])} cases, {len(groups)} groups | flush: {flush.how}", flush=True)
    not_built = {}
    for f in manifest.get("failed", []):
        groups.setdefault(f["group"], [])
        not_built.setdefault(f["group"], {})[f["system"]] = f"build failed at prepare: {f['error']}"
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
    wall = time.perf_counter() - t_start
    command = " ".join(["python3 scripts/gpu_check.py run", shlex.join(argv)]).strip()
    timing = (f"medians of single calls, each after a flush ({flush.how}), host clock from the call to device "
              f"synchronization; {args.rounds} interleaved rounds x {args.budget}s per system; {wall:.0f}s in all")
    header = (f"{facts.get('device')} ({facts.get('nvidia_smi', '')}); cases built {manifest['prepared']['date']} "
              f"for {manifest['prepared']['target']} at git {manifest['prepared']['git'][:10]}"
              + (f" (+ uncommitted {', '.join(manifest['prepared']['git_modified'])})"
                 if manifest["prepared"].get("git_modified") else "") + "; runtime-only TVM "
              f"{env['tvm']}; torch {facts.get('torch', '-')}")
    table = tables(rows)
    os.makedirs(args.out, exist_ok=True)
    result = {"command": command, "prepare_command": manifest["prepared"]["command"], "facts": facts, "env": env,
              "prepared": manifest["prepared"], "timing": timing, "rows": rows}
    with open(os.path.join(args.out, "gpu-run.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(args.out, "gpu-run.md"), "w") as f:
        f.write(f"`{command}`\n\n(cases: `{manifest['prepared']['command']}`)\n\n{header}\n\n{timing}\n\n{table}\n")
    by_reason = {}
    for r in rows:
        for n, why in r["skipped"].items():
            by_reason.setdefault((n, why), []).append(r["group"])
    skipped = [f"- {n} ({why}): " + ("every group" if len(gs) == len(rows) > 1 else ", ".join(gs))
               for (n, why), gs in by_reason.items()]
    notes = "\n".join(["", "Not run:"] + skipped) if skipped else ""
    with open(os.path.join(args.out, "gpu-run.md"), "a") as f:
        f.write(notes + "\n")
    print(f"\n{header}\n{timing}\n\n{table}\n{notes}\n\nwrote {args.out}/gpu-run.json and gpu-run.md")
    bad = [r["group"] for r in rows if set(r["errors"]) - set(PEER_NAMES)
           or not all(s.get("ok") for s in r["systems"].values() if not s.get("peer"))]
    if bad:
        print(f"FAILED: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
