"""What the memory system and the FPUs allow, measured in the same run as the benchmark.

Contract:
- `bandwidth_gbs()` measures memory bandwidth two ways on arrays far larger than the last-level
  cache: numpy's `add(b, c, out=a)` and a TVM triad `a = b + s * c` (parallel, vectorized), each
  counted as 3 x N x 4 bytes per call; returns {"numpy_add": GB/s, "tvm_triad": GB/s}.
- `matmul_peak_gflops()` measures numpy (BLAS) float32 matmul throughput on 2048^3.
- `minimal_bytes(workload)`: every input read once and every output written once.
- `flops(workload)`: the multiply-adds of the compute-heavy workloads (None for the others).
- `last_level_cache_bytes()`: from sysfs (None when unknown). A workload whose minimal bytes fit in
  it is cache-resident: its "bound" is no bound, and the report says so.
"""
from __future__ import annotations

import glob
import time

import numpy as np

from ..install import install_once
from ..relax_utils import tensor_bytes


def _best_seconds(fn, repeats=5):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def last_level_cache_bytes():
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = open(path).read().strip()
        mult = {"K": 1024, "M": 1024 ** 2}.get(text[-1], 1)
        sizes.append(int(text.rstrip("KM")) * mult)
    return max(sizes) if sizes else None


def bandwidth_gbs(n: int = 1 << 25) -> dict:
    """n float32 per array (default 128 MiB each, 4x a 32 MiB LLC)."""
    install_once()  # the triad runs on TVM's pool, sized as for every build
    import tvm
    from tvm import te

    from ..target import resolve

    rng = np.random.default_rng(0)
    b, c = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
    a = np.empty_like(b)
    out = {"numpy_add": 3 * n * 4 / _best_seconds(lambda: np.add(b, c, out=a)) / 1e9}

    B, C = te.placeholder((n,), name="b"), te.placeholder((n,), name="c")
    A = te.compute((n,), lambda i: B[i] + np.float32(3.0) * C[i], name="a")
    sch = tvm.s_tir.Schedule(te.create_prim_func([B, C, A]))
    blk = sch.get_sblock("a")
    (i,) = sch.get_loops(blk)
    io, ii = sch.split(i, [None, 16])
    sch.parallel(io)
    sch.vectorize(ii)
    target = resolve("llvm")
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=target)
    dev = tvm.cpu(0)
    tb, tc, ta = (tvm.runtime.tensor(x, dev) for x in (b, c, a))
    sec = lib.mod.time_evaluator("main", dev, number=3, repeat=5)(tb, tc, ta).min
    out["tvm_triad"] = 3 * n * 4 / sec / 1e9
    return out


def matmul_peak_gflops(n: int = 2048) -> float:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, n)).astype("float32"), rng.standard_normal((n, n)).astype("float32")
    return 2 * n ** 3 / _best_seconds(lambda: x @ y, repeats=3) / 1e9


def minimal_bytes(workload) -> int:
    ins = sum(int(np.prod(s)) * np.dtype(d).itemsize for _, s, d in workload.input_specs)
    return ins + tensor_bytes(workload.mod["main"].ret_ty)


def graph_flops(mod) -> int:
    """Multiply-adds x 2 of the matmuls and convs of a high-level Relax module's main (a real
    model's FLOPs; elementwise work is not counted). Static shapes only."""
    import tvm
    from tvm import relax

    from ..relax_utils import static_shape

    total = 0
    for block in mod["main"].body.blocks:
        for bd in block.bindings:
            call = bd.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            out = static_shape(bd.var.ty)
            if out is None:
                continue
            if call.op.name == "relax.matmul":
                k = static_shape(call.args[0].ty)[-1]
                total += 2 * int(np.prod(out)) * k
            elif call.op.name == "relax.nn.conv2d":
                _, cin, kh, kw = static_shape(call.args[1].ty)  # OIHW: I is already per group
                total += 2 * int(np.prod(out)) * cin * kh * kw
    return total


def kernel_flops(func) -> int:
    """FLOPs of one (scheduled or not) PrimFunc: 2 x the iteration domain of every reduction block
    that multiplies and adds (a matmul or conv update; its padded domain when pad_einsum padded it).
    0 for a kernel without one (elementwise, softmax, layer norm: bound by bytes, not FLOPs)."""
    import tvm

    sch = tvm.s_tir.Schedule(func)
    root = getattr(func.body, "block", None)
    if not isinstance(root, tvm.s_tir.SBlock):
        return 0
    total, stack = 0, [sch.get_sblock(root.name_hint)]
    while stack:
        for child in sch.get_child_blocks(stack.pop()):
            stack.append(child)
            block = sch.get(child)
            reduces = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 2}
            written = {w.source.name for w in block.writes}
            # two operands moving with the reduction (input and weight), as in a matmul or conv;
            # a row sum of squares or a pooling window reads one
            operands = [r for r in block.reads if r.source.name not in written
                        and any(_vars_in(rg.min) & reduces for rg in r.region)]
            extents = [iv.dom.extent for iv in block.iter_vars]
            if not all(isinstance(e, tvm.tirx.IntImm) for e in extents):
                continue  # a symbolic extent: no count (the roofline shows bytes only)
            if reduces and len(operands) >= 2 and _is_multiply_add(block.body):
                total += 2 * int(np.prod([int(e) for e in extents]))
    return total


def _is_multiply_add(stmt) -> bool:
    """C[..] = C[..] + X * Y with X and Y loading different buffers: the update of a matmul or
    conv (a sum of squares (x - m) * (x - m) is not)."""
    import re

    import tvm

    value = stmt.value if isinstance(stmt, tvm.tirx.BufferStore) else None
    if not isinstance(value, tvm.tirx.Add):
        return False
    for side in (value.a, value.b):
        side = side.value if isinstance(side, tvm.tirx.Cast) else side
        if isinstance(side, tvm.tirx.Mul):
            x, y = (set(re.findall(r"(\w+)\[", str(f))) for f in (side.a, side.b))
            if x and y and not x & y:
                return True
    return False


def _vars_in(expr) -> set:
    from schedules.row_chain import vars_in

    return vars_in(expr)


def roofline_ms(flops_: int, nbytes: int, peak_gflops: float, gbs: float) -> float:
    """The least time a kernel can take: its FLOPs at the matmul peak or its bytes at the bandwidth."""
    return max(flops_ / peak_gflops / 1e6, nbytes / gbs / 1e6)


def flops(workload):
    """A workload's matmul/conv FLOPs: its `flops` (a zoo workload's own fact; a model's counted
    from its graph when it was imported, Workload.imported)."""
    return workload.flops


def stamp_flops(mod):
    """Each PrimFunc gets `tvmfuse.flops` (kernel_flops), read by the per-kernel roofline.
    Counted before lower_math, whose Let-bound math a Schedule no longer accepts."""
    import tvm

    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and "tvmfuse.flops" in f.attrs):
            out[gv] = f.with_attr("tvmfuse.flops", kernel_flops(f))  # a rule that wrote its kernel set it
    return out
