"""scatter_rows (passes/scatter_rows.py): relax.scatter_nd on llvm in the tvmfuse variant is one
kernel, parallel over the slice and serial over the index rows, equal to numpy's in-order loop and
to TOPI's lowering (the "none" variant) bit for bit; on cuda TOPI's lowering is kept."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import tvmfuse
from tvmfuse import pipeline
from tvmfuse.passes.scatter_rows import RULE, legalize
from schedules.tir_walk import children


def _module(data_shape, idx_shape, upd_shape, mode, rows=None):
    """main(data, indices, updates) = scatter_nd(...); rows: a symbolic name for the index rows."""
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var(rows, "int64") if rows else None
    idx_shape = [n if d is None else d for d in idx_shape]
    upd_shape = [n if d is None else d for d in upd_shape]
    d = relax.Var("d", relax.TensorType(data_shape, "float32"))
    i = relax.Var("i", relax.TensorType(idx_shape, "int64"))
    u = relax.Var("u", relax.TensorType(upd_shape, "float32"))
    with bb.function("main", [d, i, u]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.scatter_nd(d, i, u, mode))
        bb.emit_func_output(out)
    return bb.get()


def _reference(data, idx, upd, mode):
    out = data.copy()
    depth = idx.shape[-1]
    for row, val in zip(idx.reshape(-1, depth), upd.reshape(-1, *data.shape[depth:])):
        at = tuple(row)
        out[at] = {"add": out[at] + val, "update": val, "mul": out[at] * val,
                   "max": np.maximum(out[at], val), "min": np.minimum(out[at], val)}[mode]
    return out


CASES = [  # (data shape, index shape, mode): repeated rows in every case (an embedding's gradient)
    ((50, 256), (512, 1), "add"),
    ((7, 50), (33, 1), "add"),         # a ragged slice: 50 columns is a chunk's tail
    ((6, 5, 40), (4, 9, 2), "update"),  # two-level indices, rows [4, 9]
    ((30, 17), (64, 1), "max"),
    ((9, 3), (20, 1), "mul"),
    ((4, 4), (10, 2), "min"),          # the slice is one element: one task, serial over rows
]


@pytest.mark.parametrize("data_shape,idx_shape,mode", CASES)
def test_matches_numpy_and_topi(data_shape, idx_shape, mode):
    rng = np.random.default_rng(0)
    depth = idx_shape[-1]
    upd_shape = idx_shape[:-1] + data_shape[depth:]
    mod = _module(data_shape, idx_shape, upd_shape, mode)
    data = rng.standard_normal(data_shape).astype("float32")
    idx = np.stack([rng.integers(0, data_shape[k], idx_shape[:-1]) for k in range(depth)], -1).astype("int64")
    upd = rng.standard_normal(upd_shape).astype("float32")
    ours = tvmfuse.build(mod, "llvm", fusion="tvmfuse")
    assert ours.rules() == [RULE]
    got = ours(data, idx, upd)
    np.testing.assert_allclose(got, _reference(data, idx, upd, mode), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, tvmfuse.build(mod, "llvm", fusion="none")(data, idx, upd))


def test_symbolic_row_count():
    mod = _module((20, 48), (None, 1), (None, 48), "add", rows="n")
    c = tvmfuse.build(mod, "llvm", fusion="tvmfuse")
    rng = np.random.default_rng(1)
    for n in (1, 37):
        data, upd = rng.standard_normal((20, 48)).astype("float32"), rng.standard_normal((n, 48)).astype("float32")
        idx = rng.integers(0, 20, (n, 1)).astype("int64")
        np.testing.assert_allclose(c(data, idx, upd), _reference(data, idx, upd, "add"), rtol=1e-6, atol=1e-6)


def _loops(stmt):
    if isinstance(stmt, tvm.tirx.For):
        yield stmt
    for child in children(stmt):
        yield from _loops(child)


def test_llvm_kernel_is_parallel_over_the_slice_not_per_row():
    mod = _module((50, 256), (512, 1), (512, 256), "add")
    with tvm.target.Target("llvm"):
        func = relax.transform.LegalizeOps(customize_legalize_map={"relax.scatter_nd": legalize})(mod)["scatter_nd"]
    assert func.attrs["tvmfuse.rule"] == RULE and func.attrs["tirx.is_scheduled"]
    rows = [f for f in _loops(func.body) if isinstance(f.extent, tvm.tirx.IntImm) and int(f.extent) == 512]
    assert len(rows) == 1 and rows[0].kind == tvm.tirx.ForKind.SERIAL
    assert all(f.kind == tvm.tirx.ForKind.SERIAL for f in _loops(rows[0].body))  # no fork per row
    assert any(f.kind == tvm.tirx.ForKind.PARALLEL for f in _loops(func.body))


def test_cuda_keeps_topi():
    """Must not fire: on cuda the lowering is TVM's own (no tvmfuse rule on the kernel)."""
    mod = _module((50, 256), (512, 1), (512, 256), "add")
    opts = pipeline.Options.for_target("cuda", "tvmfuse")
    with opts.target, tvm.transform.PassContext(opt_level=3):
        out = pipeline.run(mod, opts, until="fuse").mod
    funcs = [f for _, f in out.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1 and "tvmfuse.rule" not in (funcs[0].attrs or {})


def test_unknown_mode_is_a_clear_error():
    from tvm import te
    from tvmfuse.passes.scatter_rows import scatter_rows

    d, i, u = te.placeholder((4, 8)), te.placeholder((2, 1), "int64"), te.placeholder((2, 8))
    with pytest.raises(ValueError, match="mode 'xor'"):
        scatter_rows(d, i, u, "xor")
