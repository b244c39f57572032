"""cpu.ColumnReduction (schedules/cpu/column_reduction.py): sums over the outer axes (a bias or norm
gradient) run as parallel column stripes when wide, parallel row chunks of partial rows when
narrow; sibling sums and several reduced axes are taken; numerics against numpy; a row sum and
ragged columns are left to the other rules."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse
from schedules.tir_walk import children


def _build(shape, axes, sibling=False, reshape_to=None):
    """sum(x, axes) [and sum(x * y, axes), a norm's dgamma beside its dbeta]; `reshape_to`: x is
    reshaped first (the reshape, an output too, as a layer's gradient is for its matmuls)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    y = relax.Var("y", relax.TensorType(shape, "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            src = bb.emit(relax.op.reshape(x, reshape_to)) if reshape_to else x
            outs = [bb.emit(relax.op.sum(src, axis=axes))]
            if sibling:
                outs.append(bb.emit(relax.op.sum(relax.op.multiply(x, y), axis=axes)))
            if reshape_to:
                outs.append(src)
            out = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
        bb.emit_func_output(out)
    return tvmfuse.build(bb.get(), "llvm", fusion="tvmfuse")


def _kernel(c):
    funcs = [f for _, f in c.mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    return funcs[0]


def _loops(stmt):
    if isinstance(stmt, tvm.tirx.For):
        yield stmt
    for child in children(stmt):
        yield from _loops(child)


def _top_loops(stmt):
    """The outermost loop of every nest of the kernel."""
    if isinstance(stmt, tvm.tirx.For):
        yield stmt
        return
    for child in children(stmt):
        yield from _top_loops(child)


def _run(c, shape, axes, sibling=False, reshape_to=None):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(shape).astype("float32"), rng.standard_normal(shape).astype("float32")
    got = c(x, y)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    src = x.reshape(reshape_to) if reshape_to else x
    want = [src.sum(tuple(axes))] + ([(x * y).sum(tuple(axes))] if sibling else []) + ([src] if reshape_to else [])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-3)


def test_wide_columns_are_parallel_stripes_without_partials():
    shape, axes = (128, 1024), [0]  # 512 KiB: held by the cores' L2
    c = _build(shape, axes)
    assert c.rules() == ["cpu.ColumnReduction"]
    func = _kernel(c)
    assert "_rf" not in func.script()  # no partial rows, no second pass
    assert [t.kind for t in _top_loops(func.body)][-1] == tvm.tirx.ForKind.PARALLEL
    assert any(lp.kind == tvm.tirx.ForKind.VECTORIZED for lp in _loops(func.body))
    _run(c, shape, axes)


@pytest.mark.parametrize("rows", [4096, 100, 197])
def test_narrow_columns_are_row_chunks(rows):
    """One vector of columns: the rows are what to split (ragged rows leave the last chunk short)."""
    from schedules.common import lanes

    shape = (rows, lanes(32))
    c = _build(shape, [0])
    assert c.rules() == ["cpu.ColumnReduction"]
    assert "_rf" in _kernel(c).script()
    _run(c, shape, [0])


@pytest.mark.parametrize("shape", [(197, 768), (64, 48)])
def test_ragged_rows_and_stripes(shape):
    c = _build(shape, [0])
    assert c.rules() == ["cpu.ColumnReduction"]
    _run(c, shape, [0])


def test_sibling_sums_over_batch_and_sequence():
    """A layer norm's dbeta and dgamma: two sums over (batch, sequence) of [4, 128, 256], one kernel."""
    shape, axes = (4, 128, 256), [0, 1]
    c = _build(shape, axes, sibling=True)
    assert c.rules() == ["cpu.ColumnReduction"]
    _run(c, shape, axes, sibling=True)


def test_an_output_reshape_beside_the_sum_is_scheduled():
    shape, to = (4, 128, 256), (512, 256)
    c = _build(shape, [0], reshape_to=to)
    assert c.rules() == ["cpu.ColumnReduction"]
    assert all(t.kind == tvm.tirx.ForKind.PARALLEL for t in _top_loops(_kernel(c).body))
    _run(c, shape, [0], reshape_to=to)


@pytest.mark.parametrize("shape,axes", [((512, 256), [1]), ((64, 50), [0])])
def test_row_sums_and_ragged_columns_are_not_column_reductions(shape, axes):
    """Must not fire: a sum over the last axis (a row reduction), columns that are no whole vectors."""
    c = _build(shape, axes)
    assert c.rules() != ["cpu.ColumnReduction"]
    _run(c, shape, axes)


def test_a_tall_operand_beyond_l2_is_summed_in_row_chunks():
    """Wide, but 16 MiB (more than any two cores' L2): whole rows streamed by row chunks."""
    shape = (32768, 128)
    c = _build(shape, [0])
    assert c.rules() == ["cpu.ColumnReduction"]
    assert "_rf" in _kernel(c).script()
    _run(c, shape, [0])


def test_no_row_chunk_is_empty():
    """A max over 5 rows cut for 4 chunks: chunks of 2 rows would leave the fourth all predicated
    away, its init too, and the final max would read an uninitialized partial (a fuzz seed saw
    garbage there). The rows go in 3 chunks of 2, each with a row to initialise it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 1, 5, 2), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.max(x, axis=[1, 2]))
        bb.emit_func_output(out)
    c = tvmfuse.build(bb.get(), "llvm", "tvmfuse")
    assert c.rules() == ["cpu.ColumnReduction"]
    text = c.mod[c.call_sites()[0]].script()
    assert "T.grid(T.int64(4), T.int64(2)" not in text
    xs = np.random.default_rng(0).standard_normal((8, 1, 5, 2)).astype("float32")
    np.testing.assert_array_equal(c(xs).numpy() if hasattr(c(xs), "numpy") else c(xs), xs.max(axis=(1, 2)))
