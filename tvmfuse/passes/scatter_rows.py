"""scatter_nd on CPU: parallel over the slice, serial over the indices (the tvmfuse variant).

Contract. `legalize(bb, call)` is LegalizeOps' lowering of `relax.scatter_nd` (data, indices of
shape [..., M], updates, mode) in the tvmfuse variant. On an llvm target it emits one PrimFunc
that copies data to the output (parallel chunks of rows) and then, for each slice column chunk
in parallel, walks the index rows in order and applies update / add / mul / min / max to the
chunk of the addressed slice. Any other target keeps TVM's own lowering (LegalizeOps' FLegalize).
The PrimFunc carries `tirx.is_scheduled` (the default rules keep it as written) and
`tvmfuse.rule` = "cpu.ScatterRows".

Why: TOPI's scatter_nd (topi/scatter.py) copies the data in one serial loop and runs a parallel
loop over the slice inside the serial loop over index rows: one fork and join per row. An
embedding's gradient (512 token rows of 256 floats into a [vocab, 256] table) took 0.6 ms, most
of it thread wake-ups. Here each thread owns columns of the slice, so rows repeated in the
indices accumulate without atomics or races, in the same order as TOPI's serial loop.

Numerics: the same operations in the same order per output element (index row order), so the
result equals TOPI's bit for bit. Indices are not wrapped or checked, as in TOPI.
Must not fire: a non-llvm target (TOPI's lowering, unchanged).
"""
from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

RULE = "cpu.ScatterRows"
COPY_CHUNK = 4096  # elements per parallel task of the copy: 16 KiB of float32, far above a wake-up's cost
_MODES = {"update": lambda old, new: new, "add": lambda old, new: old + new, "mul": lambda old, new: old * new,
          "min": tirx.min, "max": tirx.max}


def _prod(dims):
    out = tirx.const(1, "int64")
    for d in dims:
        out = out * tirx.Cast("int64", d) if not isinstance(d, int) else out * d
    return out


def _slice_chunk(dtype) -> int:
    """Columns of the slice one task owns: four vectors of the target's width."""
    from schedules.common import lanes

    return 4 * lanes(tvm.DataType(dtype).bits)


def scatter_rows(data, indices, updates, mode: str):
    """TE extern: out = data; out[indices[i, :], ...] = f(out[...], updates[i, ...]) for each index
    row i in order. indices: [rows..., M] (relax.scatter_nd's layout: index depth last)."""
    if mode not in _MODES:
        raise ValueError(f"scatter_nd mode {mode!r} is not one of {sorted(_MODES)}")
    apply = _MODES[mode]
    depth = int(indices.shape[-1])
    rows = _prod(indices.shape[:-1])
    width = _prod(data.shape[depth:])  # elements in one addressed slice
    size = _prod(data.shape)
    chunk = _slice_chunk(data.dtype)

    def gen_ir(data_p, idx_p, upd_p, out_p):
        d, idx, upd, out = (T.buffer_proxy(p) for p in (data_p, idx_p, upd_p, out_p))
        with IRBuilder() as ib:
            with T.seq_scope():
                with T.parallel(0, tirx.indexdiv(size + COPY_CHUNK - 1, COPY_CHUNK)) as c:
                    base = c * COPY_CHUNK
                    with T.serial(0, tirx.min(COPY_CHUNK, size - base)) as j:
                        out[base + j] = d[base + j]
                with T.parallel(0, tirx.indexdiv(width + chunk - 1, chunk)) as c:
                    col = c * chunk
                    with T.serial(0, rows) as i:
                        offset = tirx.const(0, "int64")
                        for level in range(depth):
                            offset = offset * tirx.Cast("int64", data_p.shape[level]) + \
                                tirx.Cast("int64", idx[i * depth + level])
                        dst = offset * width + col
                        src = i * width + col
                        with T.serial(0, tirx.min(chunk, width - col)) as j:
                            out[dst + j] = apply(out[dst + j], upd[src + j])
        return ib.get()

    out_buf = tirx.decl_buffer(data.shape, data.dtype, "out_buf")
    return te.extern([data.shape], [data, indices, updates], lambda ins, outs: gen_ir(ins[0], ins[1], ins[2], outs[0]),
                     dtype=data.dtype, out_buffers=[out_buf], name="scatter_rows", tag="scatter_rows")


def legalize(bb, call):
    """LegalizeOps' lowering of relax.scatter_nd: scatter_rows on llvm, TVM's own elsewhere."""
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "llvm":
        return tvm.ir.Op.get("relax.scatter_nd").get_attr("FLegalize")(bb, call)
    return bb.call_te(scatter_rows, *call.args[:3], call.attrs.reduction, primfunc_name_hint="scatter_nd",
                      primfunc_attrs={"tirx.is_scheduled": True, "tvmfuse.rule": RULE})
