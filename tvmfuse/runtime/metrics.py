"""The measuring runtime: what a compiled module costs per inference.

- launches: static (call_tir sites in main; for CUDA, __global__ kernels per site) and dynamic
  (PrimFunc invocations counted while running, through vm.set_instrument)
- bytes moved: global-memory bytes each kernel reads (its tensor arguments) and writes (its outputs),
  summed over call sites, plus the number of global tensor reads and writes
- peak memory of intermediates: with TVM's StaticPlanBlockMemory (sum of planned storages) and
  without it (liveness peak: each intermediate freed after its last use)
- latency: time_evaluator with warm-up and repeats; median, p10, p90
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..install import install_once
from ..relax_utils import call_tir_sites, tensor_bytes
from ..target import is_gpu


@dataclass
class Measurement:
    variant: str
    launches: int
    dynamic_launches: int | None
    bytes_moved: int
    global_reads: int
    global_writes: int
    peak_memory_bytes: int  # planned (StaticPlanBlockMemory)
    peak_memory_unplanned_bytes: int
    latency_ms: dict = field(default_factory=dict)  # median / p10 / p90 / repeats

    def as_dict(self):
        return asdict(self)


def bytes_moved(mod: tvm.IRModule, func: str = "main") -> tuple[int, int, int]:
    """(bytes, tensor reads, tensor writes) of all kernels of `func` (main), per inference."""
    total = reads = writes = 0
    for var, _, args, out_ty in call_tir_sites(mod[func]):
        for a in args:
            if isinstance(a.ty, relax.TensorType):
                total += tensor_bytes(a.ty)
                reads += 1
        total += tensor_bytes(out_ty)
        writes += len(out_ty.fields) if isinstance(out_ty, relax.TupleType) else 1
    return total, reads, writes


def unplanned_peak(mod: tvm.IRModule, func: str = "main") -> int:
    """Liveness peak of intermediates of `func` (main): a tensor lives from its binding to its last use."""
    func = mod[func]
    bindings = [bd for b in func.body.blocks for bd in b.bindings]
    outputs = set(relax.analysis.free_vars(func.body.body))
    for bd in reversed(bindings):  # a var bound to an output by alias/tuple is an output too
        if bd.var in outputs and isinstance(bd.value, (relax.Var, relax.Tuple, relax.TupleGetItem)):
            outputs |= set(relax.analysis.free_vars(bd.value))
    last_use = {}
    for i, bd in enumerate(bindings):
        for v in relax.analysis.free_vars(bd.value):
            last_use[v] = i
    alive, cur, peak = {}, 0, 0
    for i, bd in enumerate(bindings):
        v = bd.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.call_tir":
            if bd.var not in outputs:
                alive[bd.var] = tensor_bytes(bd.var.ty)
                cur += alive[bd.var]
        peak = max(peak, cur)
        for var in [k for k in alive if last_use.get(k, -1) <= i]:
            cur -= alive.pop(var)
    return peak


@relax.expr_functor.visitor
class _StorageCollector(relax.PyExprVisitor):
    def __init__(self):
        self.sizes = []

    def visit_call_(self, call):
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.memory.alloc_storage":
            self.sizes.append(int(call.args[0].values[0]))
        super().visit_call_(call)


def planned_peak(mod: tvm.IRModule, func: str = "main") -> int:
    T = relax.transform
    lowered = tvm.transform.Sequential(
        [T.ToNonDataflow(), T.RemovePurityChecking(), T.CallTIRRewrite(), T.StaticPlanBlockMemory()]
    )(mod)
    c = _StorageCollector()
    c.visit_expr(lowered[func])
    return sum(c.sizes)


class KernelCounter:
    """vm.set_instrument hook: counts PrimFunc invocations and their host-side time."""

    def __init__(self, dev, only=None):
        self.dev, self.counts, self.times, self._t0 = dev, {}, {}, {}
        self.only = only  # the names that are kernels (kernel_names), None: every non-builtin call

    def __call__(self, func, func_symbol, before_run, ret_value, *args):
        if before_run:
            self._t0[func_symbol] = time.perf_counter()
        else:
            self.dev.sync()
            self.counts[func_symbol] = self.counts.get(func_symbol, 0) + 1
            dt = time.perf_counter() - self._t0[func_symbol]
            self.times[func_symbol] = self.times.get(func_symbol, 0.0) + dt
        return 0  # VMInstrumentReturnKind.NO_OP

    def kernels(self):
        return {k: v for k, v in self.counts.items()
                if not k.startswith("vm.builtin") and (self.only is None or k in self.only)}


def kernel_names(compiled) -> frozenset:
    """The PrimFuncs of the built module: what the VM instrument reports that is a kernel. Not the
    Relax functions a bucketed build calls (its versions of main), nor the host helpers codegen
    adds for symbolic shapes (shape_func, compute_symbolic_expr*)."""
    return frozenset(gv.name_hint for gv, f in compiled.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def weighted_launches(calls: dict[str, int], kernels_per_func: dict[str, int] | None) -> int:
    """Kernel launches from PrimFunc call counts: each call of PrimFunc f launches
    kernels_per_func[f] kernels (0 where f has none: it ran on the host); with None (CPU), each
    call is one launch."""
    if kernels_per_func is None:
        return sum(calls.values())
    return sum(n * kernels_per_func.get(f, 0) for f, n in calls.items())


def dynamic_launches(compiled, args, kernels_per_func: dict[str, int] | None = None) -> tuple[int, dict]:
    """Run main once with a KernelCounter: (kernel launches counted while running, per PrimFunc
    {"calls", "launches", "ms"}). Each PrimFunc call is weighted by the kernels it holds:
    `kernels_per_func`, by default the compiled module's own (its __global__ kernels on CUDA, one
    per PrimFunc on CPU). Unlike the static count (call sites of main), it counts what ran."""
    if kernels_per_func is None and is_gpu(compiled.target):
        kernels_per_func = compiled.kernels_per_func()
    vm = compiled.vm()
    kc = KernelCounter(compiled.device, kernel_names(compiled))
    vm.set_instrument(kc)
    vm["main"](*args)
    k = kc.kernels()
    per = {n: {"calls": k[n], "launches": weighted_launches({n: k[n]}, kernels_per_func),
               "ms": kc.times[n] * 1e3} for n in k}
    return weighted_launches(k, kernels_per_func), per


def kernel_profile(compiled, inputs, runs: int = 5, budget_s: float = 2.0) -> list[dict]:
    """Per-kernel profile, one row per PrimFunc called from main, in first-call order: name, calls
    and ms (per inference, the median over up to `runs` instrumented runs within `budget_s`; host-side
    time from vm.set_instrument, a few µs of hook overhead included), bytes (tensor args + outputs per
    inference), share (of the kernels' summed time) and outputs (the Relax vars it writes)."""
    args = compiled.convert_inputs(inputs)
    sites, tuple_items = {}, {}
    for block in compiled.mod[compiled.function_for(inputs)].body.blocks:
        for bd in block.bindings:
            if isinstance(bd.value, relax.TupleGetItem) and isinstance(bd.value.tuple_value, relax.Var):
                tuple_items.setdefault(bd.value.tuple_value.name, []).append(bd.var.name)
    for var, gv, targs, out_ty in call_tir_sites(compiled.mod[compiled.function_for(inputs)]):
        s = sites.setdefault(gv.name_hint, {"bytes": 0, "outputs": []})
        s["bytes"] += sum(tensor_bytes(a.ty) for a in targs if isinstance(a.ty, relax.TensorType))
        s["bytes"] += tensor_bytes(out_ty)
        s["outputs"] += [var.name] + tuple_items.get(var.name, [])
    vm = compiled.vm()
    t0 = time.perf_counter()
    vm["main"](*args)  # warm-up
    runs = max(1, min(runs, int(budget_s / max(time.perf_counter() - t0, 1e-6))))
    kc = KernelCounter(compiled.device, kernel_names(compiled))
    vm.set_instrument(kc)
    per_run = []  # each kernel's time in each run: the median drops a run a noisy host stalled
    for _ in range(runs):
        before = dict(kc.times)
        vm["main"](*args)
        per_run.append({n: t - before.get(n, 0.0) for n, t in kc.times.items()})
    names = list(kc.kernels())
    median = {n: statistics.median(r.get(n, 0.0) for r in per_run) for n in names}
    total = sum(median.values()) or 1.0
    funcs = {gv.name_hint: f for gv, f in compiled.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    flops = {n: int(funcs[n].attrs.get("tvmfuse.flops", 0)) if n in funcs and funcs[n].attrs else 0 for n in names}
    return [{"name": n, "calls": kc.counts[n] // runs, "ms": median[n] * 1e3,
             "bytes": sites.get(n, {}).get("bytes", 0), "share": median[n] / total,
             "flops": flops[n] * (kc.counts[n] // runs), "outputs": sites.get(n, {}).get("outputs", []),
             "rule": str(funcs[n].attrs.get("tvmfuse.rule", "")) if n in funcs and funcs[n].attrs else ""}
            for n in names]


def roofline_view(rows, peak_gflops: float, gbs: float, min_share: float = 0.02, floor: float = 0.25):
    """kernel_profile rows with `attained`: the kernel's roofline time (FLOPs at `peak_gflops`, or
    bytes at `gbs`, whichever is longer) over its measured time, 1.0 meaning at the roofline; and
    `cliff`: True for a kernel taking at least `min_share` of the time at under `floor` of it."""
    from .roofline import roofline_ms

    out = []
    for r in rows:
        bound = roofline_ms(r.get("flops", 0), r["bytes"], peak_gflops, gbs)
        attained = bound / r["ms"] if r["ms"] > 0 else 0.0
        out.append({**r, "bound_ms": bound, "attained": attained,
                    "cliff": r["share"] >= min_share and attained < floor})
    return out


def format_roofline(rows) -> str:
    """A markdown table of roofline_view rows, slowest first; a cliff is marked."""
    lines = ["| kernel | rule | calls | ms | share | GFLOP/s | GB/s | roofline ms | attained |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["ms"]):
        gf = r["flops"] / r["ms"] / 1e6 if r["ms"] else 0
        gb = r["bytes"] / r["ms"] / 1e6 if r["ms"] else 0
        flag = " **cliff**" if r["cliff"] else ""
        lines.append(f"| {r['name']} | {r['rule']} | {r['calls']} | {r['ms']:.3f} | {r['share']:.1%} | {gf:.0f} | "
                     f"{gb:.1f} | {r['bound_ms']:.3f} | {r['attained']:.0%}{flag} |")
    return "\n".join(lines)


def latency(compiled, args, number=None, repeat=15, min_repeat_ms=50, budget_s=3.0) -> dict:
    """Median of `repeat` timings (each the mean of `number` runs). Slow modules (a naive matmul
    takes seconds) get fewer repeats, at least 3, so one measurement stays near `budget_s`."""
    vm = compiled.vm()
    vm["main"](*args)  # warm-up
    t0 = time.perf_counter()
    vm["main"](*args)
    one = time.perf_counter() - t0
    number = number or max(1, min(100, int(0.01 / max(one, 1e-6))))
    repeat = max(3, min(repeat, int(budget_s / max(one * number, min_repeat_ms / 1e3, 1e-6))))
    res = vm.time_evaluator("main", compiled.device, number=number, repeat=repeat,
                            min_repeat_ms=min_repeat_ms)(*args)
    r = np.array(res.results) * 1e3
    return {"median": float(np.median(r)), "p10": float(np.percentile(r, 10)),
            "p90": float(np.percentile(r, 90)), "repeats": len(r), "number": number}


def measure(compiled, inputs, run: bool = True, repeat: int = 15) -> Measurement:
    """Static figures always; dynamic launches and latency when `run` and the device exists."""
    install_once()
    fn = compiled.function_for(inputs)  # main, or the version of a bucketed build these inputs run
    nbytes, reads, writes = bytes_moved(compiled.launched, fn)
    m = Measurement(compiled.fusion, compiled.launches_of(fn), None, nbytes, reads, writes,
                    planned_peak(compiled.mod, fn), unplanned_peak(compiled.mod, fn))
    if run:
        args = compiled.convert_inputs(inputs)
        m.dynamic_launches, _ = dynamic_launches(compiled, args)
        m.latency_ms = latency(compiled, args, repeat=repeat)
    return m
