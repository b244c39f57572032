"""cpu.Matmul (schedules/cpu/matmul.py) on the kernels of the model suite that made it raise a TVM
InternalError under strict mode: a fused conv1d that TOPI indexes in int32 beside int64 buffers
(ConvBERT: pad_einsum's padded copy mixed the two, transform_layout raised), and a matmul whose
epilogue writes an output of width 0 (Phi-3's rotary slice: fuse divided by the zero extent). Each
kernel, as the fusion made it, is scheduled by the CPU rules and checked against numpy; then the
helper that unifies the index dtype, and the empty spatial block, on their own."""
import logging

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.script import tirx as T

from schedules.common import uniform_index_dtype
from schedules.cpu import rules as cpu
from schedules.rule import apply_rules
from schedules.targets import for_target
from tvmfuse import config

LLVM = tvm.target.Target("llvm")


@T.prim_func(s_tir=True)
def convbert_conv1d(lv54: T.Buffer((T.int64(1), T.int64(32), T.int64(8)), "float32"),
                    const1: T.Buffer((T.int64(16), T.int64(32), T.int64(1)), "float32"),
                    const2: T.Buffer((T.int64(16), T.int64(1)), "float32"),
                    lv61: T.Buffer((T.int64(1), T.int64(8), T.int64(16)), "float32"),
                    T_broadcast_to: T.Buffer((T.int64(1), T.int64(8), T.int64(16)), "float32")):
    """fused_conv1d_add_permute_dims_multiply_broadcast_to of ConvBERT's tiny config: the conv1d
    stage's loops, iteration variables and output buffer are int32, every other stage's int64."""
    T.func_attr({"op_pattern": 4, "tirx.noalias": True, "tvmfuse.constant_params": [1, 2]})
    pad_temp = T.sblock_alloc_buffer((T.int64(1), T.int64(32), T.int64(8)))
    conv1d_ncw = T.sblock_alloc_buffer((1, 16, 8))
    T_add = T.sblock_alloc_buffer((1, T.int64(16), T.int64(8)))
    T_transpose = T.sblock_alloc_buffer((1, T.int64(8), T.int64(16)))
    T_multiply = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(16)))
    for i0, i1, i2 in T.grid(T.int64(1), T.int64(32), T.int64(8)):
        with T.sblock("pad_temp"):
            v_i0, v_i1, v_i2 = T.axis.remap("SSS", [i0, i1, i2])
            pad_temp[v_i0, v_i1, v_i2] = lv54[v_i0, v_i1, v_i2]
    for nn, ff, yy, rc, ry in T.grid(1, 16, 8, 32, 1):
        with T.sblock("conv1d_ncw"):
            v_nn, v_ff, v_yy, v_rc, v_ry = T.axis.remap("SSSRR", [nn, ff, yy, rc, ry])
            with T.init():
                conv1d_ncw[v_nn, v_ff, v_yy] = T.float32(0.0)
            conv1d_ncw[v_nn, v_ff, v_yy] = (conv1d_ncw[v_nn, v_ff, v_yy]
                                            + pad_temp[v_nn, v_rc, v_yy + v_ry] * const1[v_ff, v_rc, v_ry])
    for ax0, ax1, ax2 in T.grid(1, T.int64(16), T.int64(8)):
        with T.sblock("T_add"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_add[v_ax0, v_ax1, v_ax2] = conv1d_ncw[v_ax0, v_ax1, v_ax2] + const2[v_ax1, T.int64(0)]
    for ax0, ax1, ax2 in T.grid(1, T.int64(8), T.int64(16)):
        with T.sblock("T_transpose"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_transpose[v_ax0, v_ax1, v_ax2] = T_add[v_ax0, v_ax2, v_ax1]
    for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(8), T.int64(16)):
        with T.sblock("T_multiply"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_multiply[v_ax0, v_ax1, v_ax2] = T_transpose[v_ax0, v_ax1, v_ax2] * lv61[v_ax0, v_ax1, v_ax2]
    for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(8), T.int64(16)):
        with T.sblock("T_broadcast_to"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_broadcast_to[v_ax0, v_ax1, v_ax2] = T_multiply[v_ax0, v_ax1, v_ax2]


@T.prim_func(s_tir=True)
def phi3_qkv_rotary_slices(lv58: T.Buffer((T.int64(8), T.int64(32)), "float32"),
                           const1: T.Buffer((T.int64(32), T.int64(64)), "float32"),
                           v_out: T.Buffer((T.int64(1), T.int64(8), T.int64(16)), "float32"),
                           q_pass: T.Buffer((T.int64(1), T.int64(2), T.int64(8), T.int64(0)), "float32"),
                           q_rot: T.Buffer((T.int64(1), T.int64(2), T.int64(8), T.int64(8)), "float32")):
    """fused_matmul_reshape_strided_slice_permute_dims_negative of Phi-3's tiny config, cut to one
    output of each kind: the value slice, the pass-through part of the rotary dimensions (none:
    the slice [16:] of 16 has width 0) and the negated rotated half."""
    T.func_attr({"op_pattern": 4, "tirx.noalias": True, "tvmfuse.constant_params": [1]})
    matmul = T.sblock_alloc_buffer((T.int64(8), T.int64(64)))
    T_reshape = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(64)))
    T_slice_q = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(32)))
    T_reshape_q = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(2), T.int64(16)))
    T_transpose = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(8), T.int64(16)))
    T_half = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(8), T.int64(8)))
    for i0, i1, k in T.grid(T.int64(8), T.int64(64), T.int64(32)):
        with T.sblock("matmul"):
            v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
            with T.init():
                matmul[v_i0, v_i1] = T.float32(0.0)
            matmul[v_i0, v_i1] = matmul[v_i0, v_i1] + lv58[v_i0, v_k] * const1[v_k, v_i1]
    for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(8), T.int64(64)):
        with T.sblock("T_reshape"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_reshape[v_ax0, v_ax1, v_ax2] = matmul[(v_ax2 // T.int64(64) + v_ax1) % T.int64(8),
                                                    v_ax2 % T.int64(64)]
    for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(8), T.int64(16)):
        with T.sblock("T_slice_v"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            v_out[v_ax0, v_ax1, v_ax2] = T_reshape[v_ax0, v_ax1, v_ax2 + T.int64(48)]
    for ax0, ax1, ax2 in T.grid(T.int64(1), T.int64(8), T.int64(32)):
        with T.sblock("T_slice_q"):
            v_ax0, v_ax1, v_ax2 = T.axis.remap("SSS", [ax0, ax1, ax2])
            T_slice_q[v_ax0, v_ax1, v_ax2] = T_reshape[v_ax0, v_ax1, v_ax2]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(8), T.int64(2), T.int64(16)):
        with T.sblock("T_reshape_q"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T_reshape_q[v_ax0, v_ax1, v_ax2, v_ax3] = T_slice_q[
                T.int64(0), ((v_ax2 * T.int64(16) + v_ax3) // T.int64(32) + v_ax1) % T.int64(8),
                (v_ax2 * T.int64(16) + v_ax3) % T.int64(32)]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(2), T.int64(8), T.int64(16)):
        with T.sblock("T_transpose"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T_transpose[v_ax0, v_ax1, v_ax2, v_ax3] = T_reshape_q[v_ax0, v_ax2, v_ax1, v_ax3]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(2), T.int64(8), T.int64(0)):
        with T.sblock("T_slice_pass"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            q_pass[v_ax0, v_ax1, v_ax2, v_ax3] = T_transpose[v_ax0, v_ax1, v_ax2, v_ax3 + T.int64(16)]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(2), T.int64(8), T.int64(8)):
        with T.sblock("T_slice_half"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T_half[v_ax0, v_ax1, v_ax2, v_ax3] = T_transpose[v_ax0, v_ax1, v_ax2, v_ax3 + T.int64(8)]
    for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(2), T.int64(8), T.int64(8)):
        with T.sblock("compute"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            q_rot[v_i0, v_i1, v_i2, v_i3] = T_half[v_i0, v_i1, v_i2, v_i3] * T.float32(-1.0)


def _scheduled_and_run(func, inputs, out_shapes):
    """`func` through the CPU rules under strict mode (the winning rule's name), compiled and run
    on `inputs`, its outputs filled with NaN first (an unwritten point cannot pass by luck)."""
    with config.override(strict=True):
        sched, rule = apply_rules(func, LLVM, cpu.RULES, "kernel")
    lib = tvm.compile(tvm.IRModule({"main": sched.with_attr("global_symbol", "main")}), target="llvm")
    outs = [tvm.runtime.tensor(np.full(s, np.nan, "float32")) for s in out_shapes]
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], *outs)
    return rule, [o.numpy() for o in outs]


def test_convbert_conv1d_with_int32_and_int64_indices_takes_the_matmul_rule():
    rng = np.random.default_rng(0)
    x, w, b, g = (rng.standard_normal(s).astype("float32") for s in [(1, 32, 8), (16, 32, 1), (16, 1), (1, 8, 16)])
    rule, (out,) = _scheduled_and_run(convbert_conv1d, [x, w, b, g], [(1, 8, 16)])
    assert rule == "cpu.Matmul"
    conv = np.einsum("oc,nct->not", w[:, :, 0].astype("float64"), x) + b[None]
    np.testing.assert_allclose(out, conv.transpose(0, 2, 1) * g, rtol=1e-5, atol=1e-5)


def test_phi3_matmul_with_an_output_of_width_zero_takes_the_matmul_rule():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 32)).astype("float32"), rng.standard_normal((32, 64)).astype("float32")
    rule, (v, q_pass, q_rot) = _scheduled_and_run(phi3_qkv_rotary_slices, [x, w],
                                                  [(1, 8, 16), (1, 2, 8, 0), (1, 2, 8, 8)])
    assert rule == "cpu.Matmul"
    m = (x.astype("float64") @ w)[None]
    q = m[..., :32].reshape(1, 8, 2, 16).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(v, m[..., 48:], rtol=1e-5, atol=1e-5)
    assert q_pass.shape == (1, 2, 8, 0)
    np.testing.assert_allclose(q_rot, -q[..., 8:], rtol=1e-5, atol=1e-5)


def test_an_empty_spatial_output_is_left_as_it_is_by_the_injective_rule():
    """A slice of width 0 beside a real output: the Injective rule schedules the real one and
    leaves the empty one alone (fusing its loops divided by its zero extent)."""
    a = te.placeholder((64, 16), "float32", name="a")
    empty = te.compute((64, 0), lambda i, j: a[i, j + 16], name="empty")
    neg = te.compute((64, 16), lambda i, j: -a[i, j], name="neg")
    func = te.create_prim_func([a, empty, neg])
    av = np.random.default_rng(2).standard_normal((64, 16)).astype("float32")
    rule, (e, n) = _scheduled_and_run(func, [av], [(64, 0), (64, 16)])
    assert rule == "cpu.Injective" and e.shape == (64, 0)
    np.testing.assert_array_equal(n, -av)


def _buffers_and_iters(func):
    """The dtypes of every buffer shape and iteration variable of `func`."""
    import tvm_ffi

    seen = {str(d.ty) for p in func.params for d in getattr(p, "shape", [])}

    def block(b):
        seen.update(str(iv.var.ty) for iv in b.iter_vars)
        seen.update(str(d.ty) for buf in b.alloc_buffers for d in buf.shape)
        return b

    tvm_ffi.structural_map(func.body, [(tvm.s_tir.SBlock, block)], order="post")
    return seen


def test_uniform_index_dtype_narrows_a_mix_to_int32_and_keeps_a_uniform_function():
    assert _buffers_and_iters(convbert_conv1d) == {"int32", "int64"}
    narrowed = uniform_index_dtype(convbert_conv1d)
    assert _buffers_and_iters(narrowed) == {"int32"}
    assert uniform_index_dtype(phi3_qkv_rotary_slices).same_as(phi3_qkv_rotary_slices)  # all int64


def _mixed_matmul(dtype="float32", rows=8):
    """a @ w, w's shape int64 and a's and the loops int32 (the mix convbert_conv1d has), N = 30 no
    whole tile: pad_einsum pads w to a copy shaped [int64 K, int32 N], which the packing raised on."""
    a = te.placeholder((rows, 16), dtype, name="a")
    w = te.placeholder((tvm.tirx.IntImm("int64", 16), tvm.tirx.IntImm("int64", 30)), dtype, name="w")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((rows, 30), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="c")
    return te.create_prim_func([a, w, c])


def test_a_mixed_float_matmul_with_a_ragged_n_is_narrowed_and_scheduled():
    func = _mixed_matmul()
    assert _buffers_and_iters(func) == {"int32", "int64"}
    rng = np.random.default_rng(3)
    a, w = rng.standard_normal((8, 16)).astype("float32"), rng.standard_normal((16, 30)).astype("float32")
    rule, (c,) = _scheduled_and_run(func, [a, w], [(8, 30)])
    assert rule == "cpu.Matmul"
    np.testing.assert_allclose(c, a.astype("float64") @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["integers", "symbolic"])
def test_the_matmul_rule_declines_a_mix_it_cannot_narrow(case, caplog):
    """Narrowing could change the math of integer data, and cannot bound a symbolic shape: the rule
    declines before scheduling anything, and the next rule gets the function."""
    func = _mixed_matmul("int64") if case == "integers" else _mixed_matmul(rows=tvm.tirx.Var("n", "int32"))
    assert _buffers_and_iters(func) == {"int32", "int64"}
    assert uniform_index_dtype(func) is None
    with for_target(LLVM), config.override(strict=True), caplog.at_level(logging.DEBUG, "tvmfuse.schedule"):
        assert cpu.Matmul().apply(func, LLVM) is None
    assert "cpu.Matmul declines: int32 and int64 indices" in caplog.text
    with config.override(strict=True):
        _sched, rule = apply_rules(func, LLVM, cpu.RULES, "kernel")
    assert rule not in (None, "cpu.Matmul")


def _reshaped_matmul(transpose: bool):
    """A projection whose A comes through a copy: [1, 16, 32] -> [16, 32] (a view: same flat
    offsets), or a transposing copy of [1, 32, 16] (moves every element)."""
    from tvm import topi

    if transpose:
        x = te.placeholder((1, 32, 16), name="x")
        a = topi.transpose(topi.reshape(x, (32, 16)), (1, 0))
    else:
        x = te.placeholder((1, 16, 32), name="x")
        a = topi.reshape(x, (16, 32))
    w = te.placeholder((32, 64), name="w")
    k = te.reduce_axis((0, 32), name="k")
    m = te.compute((16, 64), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="matmul")
    return te.create_prim_func([x, w, m])


@pytest.mark.parametrize("transpose", [False, True])
def test_a_view_reshape_is_read_in_place_and_a_transposing_copy_stays_a_stage(transpose):
    """The reshape that drops a unit axis moves nothing: the matmul reads x directly (no copy of A
    per call); a transposing copy would be read with strides, so it stays a packed stage."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 32, 16) if transpose else (1, 16, 32)).astype("float32")
    w = rng.standard_normal((32, 64)).astype("float32")
    func = _reshaped_matmul(transpose)
    with config.override(strict=True):
        sched, rule = apply_rules(func, LLVM, cpu.RULES, "kernel")
    assert rule == "cpu.Matmul"
    copies = [b for b in ("T_reshape", "T_transpose") if f'T.sblock("{b}")' in sched.script()]
    assert copies == (["T_transpose"] if transpose else []), copies
    _rule, (out,) = _scheduled_and_run(func, [x, w], [(16, 64)])
    a = x[0].T if transpose else x[0]
    np.testing.assert_allclose(out, a.astype("float64") @ w, rtol=1e-5, atol=1e-5)


def test_a_ragged_matmul_read_through_a_reshape_is_padded_from_a_copy():
    """Swin's window projection: A is [4, 49, 32] viewed as [196, 32]; 196 rows are padded to whole
    micro-kernel tiles (pad_einsum), which needs A read at plain indices, so the view is kept as
    a copy stage there rather than the kernel going to cpu.Fallback's naive loops."""
    from tvm import topi

    x = te.placeholder((4, 49, 32), name="x")
    a = topi.reshape(x, (196, 32))
    w = te.placeholder((32, 48), name="w")
    k = te.reduce_axis((0, 32), name="k")
    m = te.compute((196, 48), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="matmul")
    out = topi.reshape(m, (4, 49, 48))
    func = te.create_prim_func([x, w, out])
    rng = np.random.default_rng(3)
    xs, ws = rng.standard_normal((4, 49, 32)).astype("float32"), rng.standard_normal((32, 48)).astype("float32")
    rule, (got,) = _scheduled_and_run(func, [xs, ws], [(4, 49, 48)])
    assert rule == "cpu.Matmul"
    np.testing.assert_allclose(got, (xs.reshape(196, 32).astype("float64") @ ws).reshape(4, 49, 48),
                               rtol=1e-5, atol=1e-5)


def _linear(n_out: int):
    """x @ W^T with W [n_out, 64] a run-time input (a linear layer in training: no build-time pack)."""
    from tvm import topi

    x = te.placeholder((32, 64), name="x")
    w = te.placeholder((n_out, 64), name="w")
    wt = topi.transpose(w, (1, 0))
    k = te.reduce_axis((0, 64), name="k")
    m = te.compute((32, n_out), lambda i, j: te.sum(x[i, k] * wt[k, j], axis=k), name="matmul")
    return te.create_prim_func([x, w, m])


def _pack_loops(sched):
    """The extents and kinds of the loops around the panel copy of W^T, outermost first."""
    from schedules.tir_walk import children

    found = []

    def walk(stmt, loops):
        if isinstance(stmt, tvm.tirx.For):
            loops = loops + [stmt]
        if isinstance(stmt, tvm.s_tir.SBlock) and stmt.name_hint == "T_transpose_global":
            found.append([(int(lp.extent), lp.kind) for lp in loops])
        for child in children(stmt):
            walk(child, loops)

    walk(sched.body, [])
    return found


@pytest.mark.parametrize("n_out", [128, 96])
def test_a_transposed_weight_is_packed_in_square_tiles(n_out):
    """The panel copy of W^T reads W in 16 x 16 tiles (a tile's rows stay in L1), the tile's
    columns a vector of the panel; row by row each vector gathered 16 rows of W. 96 columns: the
    panels are whole (3 of 32), the tiles too."""
    func = _linear(n_out)
    with config.override(strict=True):
        sched, rule = apply_rules(func, LLVM, cpu.RULES, "kernel")
    assert rule == "cpu.Matmul"
    (loops,) = _pack_loops(sched)
    assert [e for e, _ in loops[-2:]] == [16, 16] and loops[-1][1] == tvm.tirx.ForKind.VECTORIZED
    assert loops[0][1] == tvm.tirx.ForKind.PARALLEL
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((32, 64)).astype("float32"), rng.standard_normal((n_out, 64)).astype("float32")
    _rule, (out,) = _scheduled_and_run(func, [x, w], [(32, n_out)])
    np.testing.assert_allclose(out, x.astype("float64") @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [64, 197])
def test_a_transposed_row_operand_is_read_in_place(rows):
    """A = G^T (a weight gradient dY^T @ X, an attention backward's P^T @ dO): the transpose is
    inlined, so the micro-kernel reads the rows of one k as adjacent floats of G, and no transposed
    copy of A runs per call (197 rows, a ragged M: the zero-padded copy pad_einsum makes reads G
    transposed itself)."""
    from tvm import topi

    g = te.placeholder((32, rows), name="g")
    x = te.placeholder((32, 48), name="x")
    a = topi.transpose(g, (1, 0))
    k = te.reduce_axis((0, 32), name="k")
    m = te.compute((rows, 48), lambda i, j: te.sum(a[i, k] * x[k, j], axis=k), name="matmul")
    func = te.create_prim_func([g, x, m])
    with config.override(strict=True):
        sched, rule = apply_rules(func, LLVM, cpu.RULES, "kernel")
    assert rule == "cpu.Matmul"
    assert 'T.sblock("T_transpose")' not in sched.script()
    rng = np.random.default_rng(6)
    gv, xv = rng.standard_normal((32, rows)).astype("float32"), rng.standard_normal((32, 48)).astype("float32")
    _rule, (out,) = _scheduled_and_run(func, [gv, xv], [(rows, 48)])
    np.testing.assert_allclose(out, gv.T.astype("float64") @ xv, rtol=1e-5, atol=1e-5)
