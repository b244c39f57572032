"""StreamingStores: a kernel whose working set is larger than the last-level cache writes its
outputs with non-temporal (streaming) stores, on x86 llvm targets.

Contract. Two passes.
  `MarkStreamingStores(table, llc_bytes)` (a module pass over the Relax module's PrimFuncs, codegen
  phase, every variant alike): a PrimFunc whose parameters are all of static shape and whose
  bytes (inputs and outputs, each counted once) are at least `stream_working_set_pct` of
  `llc_bytes` gets the attribute `tvmfuse.stream` = the names of the parameter buffers of at least
  `stream_output_pct` of it that it stores to (its large outputs; each renamed
  `tvmfuse_stream_out<i>`, as buffer names need not be unique) and does not
  load from (a kernel that reads its output back, as a row reduction that writes its input's sum
  and then normalizes it, would read it from memory). Others are left alone: symbolic shapes, a smaller working set, a table without `streaming_stores` (not
  x86), an unknown cache size, or no float32 output.
  `StreamStores` (a TIR module pass after TVM's lowering, in the "tvmfuse" TIR pipeline that
  `tvmfuse.build` compiles with): in a marked function, every store of one whole float32 vector
  register (`vector_bytes`) to contiguous elements of a marked buffer becomes a call of
  `tvmfuse_stream_f32x{8,16}`, LLVM IR linked into the module (`pragma_import_llvm`) and
  inlined: a `store !nontemporal` where the address is aligned to the vector, the same plain
  store where it is not (a row of a ragged width). Each parallel loop that holds such a store is
  cut into one chunk of iterations per core, each chunk ending in an `sfence`, and the function
  ends in one: streaming stores are weakly ordered, and the fence makes them visible before the
  worker reports its task done. Predicated stores, partial vectors, other dtypes and scalar
  stores are unchanged.

Why: a store to a line that is not in cache first reads it (read for ownership), so an output
costs its bytes twice; a streaming store writes the line without reading it, and does not evict
the inputs from the cache. When the kernel's own traffic is larger than the cache, its output
would not stay cached for the next kernel anyway (glibc's memcpy streams above 3/4 of the
shared cache for the same reason). znver4, 2 threads, relu(x + b) on [4096, 768] (25 MiB):
0.62 ms with plain stores, 0.48 ms streaming.

Numerics: the same values are stored; only the cache policy of the stores changes.
Must not fire: a working set under the cache size, a symbolic shape, a non-x86 target, a store
of another dtype or width, a predicated store, a store to a buffer that is not a parameter.
"""
from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import tirx

log = logging.getLogger("tvmfuse.fusion")

STREAM_ATTR = "tvmfuse.stream"
PIPELINE = "tvmfuse"  # the TIR pipeline name tvmfuse.build compiles with (register_pipeline)

_STORE = """
define internal void @tvmfuse_stream_f32x{n}(ptr %p, <{n} x float> %v) #0 {{
  %a = ptrtoint ptr %p to i64
  %m = and i64 %a, {mask}
  %ok = icmp eq i64 %m, 0
  br i1 %ok, label %nt, label %plain
nt:
  store <{n} x float> %v, ptr %p, align {align}, !nontemporal !0
  ret void
plain:
  store <{n} x float> %v, ptr %p, align 4
  ret void
}}
"""
_FENCE = """
define internal void @tvmfuse_sfence() #0 {
  call void @llvm.x86.sse.sfence()
  ret void
}
declare void @llvm.x86.sse.sfence()
attributes #0 = { alwaysinline nounwind }
!0 = !{i32 1}
"""


def helpers_ir(lanes: int) -> str:
    """The LLVM IR linked into a marked function: the streaming store of `lanes` floats and sfence."""
    return _STORE.format(n=lanes, mask=lanes * 4 - 1, align=lanes * 4) + _FENCE


def _static_bytes(buf) -> int | None:
    """Bytes of a buffer parameter of static shape; None for a symbolic shape or a scalar parameter."""
    try:
        n, shape = tvm.DataType(str(buf.dtype)).bits // 8, buf.shape
    except AttributeError:  # a scalar parameter (a size the kernel takes): not a buffer
        return None
    for d in shape:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        n *= int(d)
    return n


def _accessed_buffers(func) -> tuple[list, list]:
    """(the buffers `func` stores to, the buffers it loads from), as objects: names are not unique
    (a fused kernel's reshaped input and its reshaped output are both "T_reshape")."""
    stored, loaded = [], []

    def store(op):
        stored.append(op.buffer)
        return op

    def load(op):
        loaded.append(op.source)
        return op

    tvm_ffi.structural_map(func.body, [(tirx.BufferStore, store), (tvm.ir.expr.TensorLoad, load)], order="post")
    return stored, loaded


def _among(buf, bufs) -> bool:
    return any(buf.same_as(b) for b in bufs)


def stream_outputs(func, llc_bytes: int, table: dict) -> list | str:
    """The output buffers (parameter objects) of `func` to stream, or why none is."""
    sizes = [_static_bytes(b) for b in func.params]
    if None in sizes:
        return "a parameter of symbolic shape (or not a buffer)"
    if sum(sizes) * 100 < llc_bytes * table["stream_working_set_pct"]:
        return f"its working set, {sum(sizes) / 2**20:.1f} MiB, fits the {llc_bytes / 2**20:.0f} MiB cache"
    stored, loaded = _accessed_buffers(func)
    outs = [b for b, n in zip(func.params, sizes)
            if _among(b, stored) and not _among(b, loaded) and str(b.dtype) == "float32"
            and n * 100 >= llc_bytes * table["stream_output_pct"]]
    return outs or "no large float32 output that the kernel does not read back"


def _renamed(func, outs):
    """`func` with each buffer of `outs` renamed `tvmfuse_stream_out<i>` (what StreamStores looks
    for after lowering, where only names are left), and the new names."""
    names, pairs = [], []
    for i, b in enumerate(outs):
        names.append(f"tvmfuse_stream_out{i}")
        pairs.append((b, tirx.Var(names[-1], b.ty)))  # the same buffer type: shape, strides, offset, alignment

    def swap(v):
        return next((new for old, new in pairs if v.same_as(old)), v)

    return tvm_ffi.structural_map(func, [(tvm.ir.expr.Var, swap)]), names


def _with_updates(mod, updates):
    """`mod` with the functions of `updates` replaced (`mod` itself when there are none)."""
    if not updates:
        return mod
    return tvm.IRModule({**dict(mod.functions_items()), **updates}, attrs=mod.attrs, global_infos=mod.global_infos)


def MarkStreamingStores(table: dict, llc_bytes: int | None):
    """The marking pass for a CPU constants table and the host's last-level cache size."""

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.MarkStreamingStores")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not table.get("streaming_stores", 0) or not llc_bytes:
            return mod
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            outs = stream_outputs(func, llc_bytes, table)
            if isinstance(outs, str):
                continue
            log.info("%s writes %s with streaming stores", gv.name_hint, ", ".join(b.name for b in outs))
            func, names = _renamed(func, outs)
            updates[gv] = func.with_attr(STREAM_ATTR, names)
        return _with_updates(mod, updates)

    return _pass


def _contains(stmt, name) -> bool:
    found = []

    def call(op):
        if op.op.same_as(tvm.ir.Op.get("tirx.call_extern")) and str(op.args[0].value) == name:
            found.append(op)
        return op

    tvm_ffi.structural_map(stmt, [(tvm.ir.expr.Call, call)], order="post")
    return bool(found)


def _fence():
    return tirx.Evaluate(tirx.call_extern("void", "tvmfuse_sfence"))


def _chunked(loop, tasks: int):
    """`for i in parallel(n): body` as `for t in parallel(tasks): (for i in chunk t: body); sfence`."""
    n, dt = loop.extent, str(loop.extent.ty.dtype)
    chunk = tirx.floordiv(n + tasks - 1, tasks)
    t = tirx.Var("stream_task", dt)
    lo = loop.min + t * chunk
    extent = tirx.max(tirx.min(chunk, loop.min + n - lo), tirx.IntImm(dt, 0))
    inner = tirx.For(loop.loop_var, lo, extent, tirx.ForKind.SERIAL, loop.body, annotations=loop.annotations)
    return tirx.For(t, tirx.IntImm(dt, 0), tirx.IntImm(dt, tasks), tirx.ForKind.PARALLEL,
                    tirx.SeqStmt([inner, _fence()]))


def rewrite_function(func, lanes: int, tasks: int):
    """`func` with its marked outputs' whole-vector stores streaming (StreamStores), and the count."""
    names = set(str(n) for n in func.attrs[STREAM_ATTR])
    dtype, helper = f"float32x{lanes}", f"tvmfuse_stream_f32x{lanes}"
    hits = [0]

    def store(op):
        idx = op.indices
        # (a BufferStore here has no predicate: a masked store is a call, never matched)
        if (op.buffer.name not in names or str(op.value.ty.dtype) != dtype or len(idx) != 1
                or not isinstance(idx[0], tirx.Ramp) or not isinstance(idx[0].stride, tirx.IntImm)
                or int(idx[0].stride) != 1):
            return op
        hits[0] += 1
        addr = tirx.call_intrin("handle", "tirx.address_of", tirx.BufferLoad(op.buffer, [idx[0].base]))
        return tirx.Evaluate(tirx.call_extern("void", helper, addr, op.value))

    body = tvm_ffi.structural_map(func.body, [(tirx.BufferStore, store)], order="post")
    if not hits[0]:
        return func, 0

    def parallel(loop):
        if loop.kind == tirx.ForKind.PARALLEL and _contains(loop.body, helper):
            return _chunked(loop, tasks)
        return loop

    body = tvm_ffi.structural_map(body, [(tirx.For, parallel)], order="post")
    fenced = [0]

    def scope_end(attr):  # the packed function's compute scope ends before its `return 0`
        if attr.attr_key != "compute_scope":
            return attr
        fenced[0] += 1
        return tirx.AttrStmt(attr.node, attr.attr_key, attr.value, tirx.SeqStmt([attr.body, _fence()]))

    body = tvm_ffi.structural_map(body, [(tirx.AttrStmt, scope_end)], order="post")
    if not fenced[0]:
        body = tirx.SeqStmt([body, _fence()])
    body = tirx.AttrStmt(tvm.ir.StringImm("llvm"), "pragma_import_llvm", tvm.ir.StringImm(helpers_ir(lanes)), body)
    return func.with_body(body), hits[0]


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.StreamStores")
def StreamStores(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """The rewrite of every function MarkStreamingStores marked (after TVM's TIR lowering)."""
    from schedules.targets import cpu_table

    from ..target import num_cores

    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or not func.attrs or STREAM_ATTR not in func.attrs:
            continue
        target = func.attrs.get("target")
        table = cpu_table(target)
        lanes = int(table["vector_bytes"]) // 4
        if lanes not in (8, 16):
            continue
        cores = target.attrs.get("num-cores") if target is not None else None
        new, hits = rewrite_function(func, lanes, int(cores) if cores else num_cores())
        if hits:
            updates[gv] = new
    return _with_updates(mod, updates)


def _pipeline_factory():
    from tvm.tirx import compilation_pipeline as cp

    lower, host, device = cp.PIPELINE_MAP["s_tir"]()
    return tvm.transform.Sequential([lower, StreamStores], name="tvmfuse.tir"), host, device


def register_pipeline() -> str:
    """Register the "tvmfuse" TIR pipeline (TVM's s_tir pipeline, then StreamStores); its name.
    Idempotent: registered once per process, on first build (tvmfuse.install), never on import.
    TVM 0.27's tvm.compile takes a TIR pipeline by name only, hence the registration."""
    from tvm.tirx import compilation_pipeline as cp

    if cp.PIPELINE_MAP.get(PIPELINE) is not _pipeline_factory:
        cp.register_tir_pipeline(PIPELINE, _pipeline_factory)
    return PIPELINE
