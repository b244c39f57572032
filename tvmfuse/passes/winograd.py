"""Winograd3x3: a 3x3, stride-1 conv2d becomes Winograd's F(m x m, 3x3),
m = 4 or 2: an input transform, n² = (m+2)² matmuls over the tiles (one batched matmul) and an
output transform.

Contract. In every Relax function, a binding `y = conv2d(x, W)` is rewritten when it is legal
(`_legal`: NCHW / OIHW / NCHW, a 3x3 kernel, stride 1, dilation 1, groups 1, padding 1 on every
side, batch 1, a float32 W, static C, H, W and O) and profitable on the target (`_tile`
picks m), into

  V  = call_tir(input_transform, x)         # [n², th*tw, C]: Bᵀ d B of every n x n input tile d
  M  = matmul(V, U)                         # U = G W Gᵀ: a constant [n², C, O], made here; for
                                            # a W that is not a constant (an input), U =
                                            # call_tir(weight_transform, W) on every call
  Y  = call_tir(output_transform, M)        # [th, m, tw, m, O]: Aᵀ M A of every tile
  y  = permute_dims(reshape(Y), NCHW)       # (sliced to H x W when m does not divide them)

The transforms are TE computes scheduled here (channel-last, so every load and store is a whole
vector; the NCHW input is transposed once, in the input transform; Bᵀ d B and Aᵀ M A each in two
passes, rows then columns, in registers) and marked opaque to stock fusion; the matmul takes `cpu.Matmul` with
U packed at build time. The layout change back to NCHW is an ordinary op that stock fusion fuses
with whatever follows the conv (bias, activation, residual); the tvmfuse variant fuses it, and
that chain, into the output transform (passes/fuse_winograd_epilogue.py).

Numerics: in exact arithmetic this is the conv's sum regrouped. F(2x2): Bᵀ and Aᵀ hold only 0 and
±1, G only 0, ±1 and ±1/2 (exact in binary); max relative error about 1e-6 at ResNet's sizes.
F(4x4) (points 0, ±1, ±2): Bᵀ and Aᵀ hold integers up to 8, G is applied in float64 at build time;
max error relative to the output's largest value 5e-6 to 2e-5 at 64 to 512 channels.
`TVMFUSE_CPU_WINOGRAD=0` turns the pass off.

Why: an m x m output tile costs n² multiply-adds per (in, out) channel pair instead of 9 m²: a
2.25x cut for F(2x2), 4x for F(4x4); the transforms move O(C·H·W) bytes. `_tile` takes the m of
`winograd_tiles` whose matmul does the fewest multiply-adds (the tiles of a ragged map padded),
refusing maps narrower than `winograd_min_map` and transformed weights (n²/9 of W) over
`winograd_max_weight_mib` (read from memory each call). znver4, one conv in-process, ms:
64ch 56x56 direct 1.06 / F(2x2) 0.69 / F(4x4) 0.46; 128ch 28x28 1.05 / 0.61 / 0.42; 512ch 7x7
1.07 / 0.63 / 0.52 (F(4x4)'s 36 MiB weight is refused: on the whole of ResNet-50 it bought 0.6%
over F(2x2) for 72 MiB more constants).

Must not fire: a strided, dilated, grouped or non-NCHW conv, padding other than 1, a kernel other
than 3x3, a weight of symbolic shape, batch other than 1, a symbolic dim, a non-float32 dtype, and a
conv the profitability check refuses (for a weight that is not a constant, also when the FLOPs it
saves do not pay for transforming the weight on every call: `runtime_intensity`). Each rewrite and each refusal of a legal conv is logged on
`tvmfuse.fusion`. llvm targets only (pipeline.py).
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax, s_tir, te, tirx

from ..relax_utils import dense_nchw_conv_reason, rewrite_op_calls, static_ints

log = logging.getLogger("tvmfuse.fusion")

# F(m x m, 3x3) (Lavin & Gray 2016): Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A, over (m+2) x (m+2) input tiles.
# F(2x2): interpolation points 0, ±1, ∞; F(4x4): 0, ±1, ±2, ∞.
_MATRICES = {
    2: (((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64),
        ((1, 1, 1, 0), (0, 1, -1, -1))),
    4: (((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
         (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64),
        ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))),
}
OPAQUE = 8  # op_pattern kOpaque: FuseOps leaves the transforms alone
WINOGRAD_ATTR = "tvmfuse.winograd"  # on the output transform: its sizes


def _legal(call):
    """(C, H, W, O, weight array) when `call` is a conv this pass can rewrite, else a reason."""
    a = call.attrs
    why = dense_nchw_conv_reason(call)
    if why:
        return why
    if static_ints(a.strides) != [1, 1] or static_ints(a.dilation) != [1, 1]:
        return f"strides {static_ints(a.strides)}, dilation {static_ints(a.dilation)}"
    if static_ints(a.padding) != [1, 1, 1, 1]:
        return f"padding {static_ints(a.padding)}"
    x, w = call.args
    if not isinstance(x.ty, relax.TensorType) or x.ty.ndim != 4 or not isinstance(x.ty.shape, relax.ShapeExpr):
        return "an input of unknown rank or shape"
    if isinstance(w, tvm.ir.expr.Constant):
        wv = w.value.numpy()
        wshape, wdtype = wv.shape, str(wv.dtype)
    elif isinstance(w.ty, relax.TensorType) and isinstance(w.ty.shape, relax.ShapeExpr):
        wv, wshape, wdtype = None, static_ints(w.ty.shape.values), str(w.ty.dtype)
        if wshape is None:
            return "a weight of symbolic shape"
        wshape = tuple(wshape)
    else:
        return "a weight of unknown shape"
    if len(wshape) != 4 or wshape[2:] != (3, 3):
        return f"a weight of shape {wshape}"
    dims = static_ints(x.ty.shape.values)
    if dims is None:
        return "a symbolic dim"
    if dims[0] != 1:
        return f"batch {dims[0]}"
    if str(x.ty.dtype) != "float32" or wdtype != "float32" or \
            str(a.out_dtype) not in ("", "void", "None", "float32"):
        return f"dtypes {x.ty.dtype} x {wdtype} -> {a.out_dtype}"
    return dims[1], dims[2], dims[3], wshape[0], wv


def _tile(c, h, w, o, table, runtime_weight=False):
    """The output tile m (of `winograd_tiles`) whose batched matmul does the fewest multiply-adds,
    among those profitability allows; or the reason none is. A `runtime_weight` (an input, not a
    constant) is transformed on every call: the tile must also save at least
    `winograd_runtime_flops_per_byte` FLOPs per byte that transform and the matmul's packing of U
    move (`runtime_intensity`)."""
    if min(h, w) < table["winograd_min_map"]:
        return f"a {h}x{w} map is under winograd_min_map={table['winograd_min_map']}"
    best, why = None, None
    for m in table["winograd_tiles"]:
        mib = (m + 2) ** 2 * c * o * 4 / 2**20
        if mib > table["winograd_max_weight_mib"]:
            why = (f"its transformed weight for F({m}x{m}, 3x3), {mib:.1f} MiB, is over "
                   f"winograd_max_weight_mib={table['winograd_max_weight_mib']}")
            continue
        if runtime_weight:
            need = table["winograd_runtime_flops_per_byte"]
            got = runtime_intensity(c, h, w, o, m)
            if got < need:
                why = (f"F({m}x{m}, 3x3) of a weight that is an input saves {got:.1f} FLOPs per byte of its "
                       f"per-call weight transform, under winograd_runtime_flops_per_byte={need}")
                continue
        work = (m + 2) ** 2 * -(-h // m) * -(-w // m)
        if best is None or work < best[0]:
            best = (work, m)
    return best[1] if best else why


def runtime_intensity(c, h, w, o, m):
    """FLOPs F(m x m, 3x3) saves over the direct conv, per byte that transforming a weight at run
    time moves: W read (9·C·O floats), U written and read back by the matmul's packing, and the
    packed copy written (3 · (m+2)²·C·O floats)."""
    n2, tiles = (m + 2) ** 2, -(-h // m) * -(-w // m)
    saved = 2 * c * o * (9 * h * w - n2 * tiles)
    moved = 4 * c * o * (9 + 3 * n2)
    return saved / moved


def weight_transform(c, o, lanes, m=2):
    """W [O, C, 3, 3] -> U [n², C, O] at run time, for a weight that is an input: U[n*a+b, k, q] =
    (G W[q, k] Gᵀ)[a, b], each entry Σ G[a,i]·G[b,j]·W[q, k, i, j] with the products G[a,i]·G[b,j]
    made in float64 at build time. Per input channel and vector of output channels, the 9 taps are
    gathered into registers once (stage Wt), then the n² outputs (unrolled; the selects fold)."""
    g, n = _MATRICES[m][1], m + 2
    wt_in = te.placeholder((o, c, 3, 3), "float32", name="W")
    wt = te.compute((c, 9, o), lambda k, t, q: wt_in[q, k, t // 3, t % 3], name="Wt")

    def value(ab, k, q):
        exprs = []
        for a in range(n):
            for b in range(n):
                terms = [(g[a, i] * g[b, j], wt[k, 3 * i + j, q]) for i in range(3) for j in range(3)
                         if g[a, i] * g[b, j] != 0]
                exprs.append(_combine(terms))
        return _select(ab, exprs)

    u = te.compute((n * n, c, o), value, name="U")
    sch = s_tir.Schedule(te.create_prim_func([wt_in, u]))
    ab, k, q = sch.get_loops(sch.get_sblock("U"))
    q0, q1 = sch.split(q, [None, _vector(o, lanes)])
    sch.reorder(k, q0, ab, q1)
    sch.parallel(k)
    sch.unroll(ab)
    sch.vectorize(q1)
    block = sch.get_sblock("Wt")
    sch.compute_at(block, q0)
    sch.set_scope(block, 0, "local")
    _, t, qv = sch.get_loops(block)[-3:]
    sch.unroll(t)
    sch.vectorize(qv)
    return _mark(sch.mod["main"], "winograd.WeightTransform")


def transformed_weight(w: np.ndarray, m: int = 2) -> np.ndarray:
    """U[a*(m+2)+b, c, o] = (G W[o, c] Gᵀ)[a, b], computed in float64, as float32."""
    g = _MATRICES[m][1]
    u = np.einsum("ai,ocij,bj->abco", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape((m + 2) ** 2, w.shape[1], w.shape[0])).astype(np.float32)


def _combine(terms):
    """Σ k·t over (k, t): units as adds and subtracts, other coefficients as multiplies."""
    out = None
    for k, t in terms:
        t = t if abs(k) == 1 else t * tirx.const(float(abs(k)), "float32")
        out = (t if k > 0 else -t) if out is None else (out + t if k > 0 else out - t)
    return out


def _select(index, exprs):
    """exprs[index] for a loop variable `index` that the schedule unrolls (the selects fold)."""
    out = exprs[-1]
    for i in range(len(exprs) - 2, -1, -1):
        out = tirx.Select(index == i, exprs[i], out)
    return out


def _vector(c, lanes):
    v = lanes
    while v > 1 and c % v:
        v //= 2
    return v


def input_transform(c, h, w, lanes, m=2):
    """x [1, C, H, W] -> V [n², th*tw, C] (n = m+2), V[n*a+b, p, k] = (Bᵀ d B)[a, b] of tile p's
    n x n input d (tiles m apart)."""
    bt, n = _MATRICES[m][0], m + 2
    th, tw = -(-h // m), -(-w // m)
    x = te.placeholder((1, c, h, w), "float32", name="x")
    xt = te.compute((m * th + 2, m * tw + 2, c), lambda i, j, k: tirx.if_then_else(
        tirx.all(i >= 1, i <= h, j >= 1, j <= w), x[0, k, i - 1, j - 1], tirx.const(0.0, "float32")), name="xt")

    def rows(a, j, p, k):  # (Bᵀ d)[a, j]: the tile's columns transformed
        ty, tx = p // tw, p % tw
        return _select(a, [_combine([(bt[aa][i], xt[m * ty + i, m * tx + j, k]) for i in range(n) if bt[aa][i]])
                           for aa in range(n)])

    t = te.compute((n, n, th * tw, c), rows, name="T")

    def value(ab, p, k):  # (Bᵀ d B)[a, b]
        return _select(ab % n, [_combine([(bt[b][j], t[ab // n, j, p, k]) for j in range(n) if bt[b][j]])
                                for b in range(n)])

    v = te.compute((n * n, th * tw, c), value, name="V")
    sch = s_tir.Schedule(te.create_prim_func([x, v]))
    vec = _vector(c, lanes)
    i, j, k = sch.get_loops(sch.get_sblock("xt"))
    k0, k1 = sch.split(k, [None, vec])
    sch.reorder(i, k0, j, k1)
    sch.parallel(i)
    sch.vectorize(k1)
    ab, p, k = sch.get_loops(sch.get_sblock("V"))
    k0, k1 = sch.split(k, [None, vec])
    sch.reorder(p, k0, ab, k1)
    sch.parallel(p)
    sch.unroll(ab)
    sch.vectorize(k1)
    _in_registers(sch, "T", k0)
    return _mark(sch.mod["main"], "winograd.InputTransform")


def output_compute(mm, o, h, w, m, index="int32"):
    """The TE of Y [th, m, tw, m, O] from M [n², th*tw, O]: Y[ty, u, tx, v, k] = (Aᵀ M A)[u, v] of
    tile (ty, tx), as two stages: S = Aᵀ M (stage "S", [m, n, tiles, O], rows) then S A (columns),
    so each expression has at most n terms (the selects over u and v fold where the schedule
    unrolls them; one expression of n² terms per output compiled 4x slower at F(4x4)). `index`: the
    dtype of the loop variables (int64 beside Relax ops' own TE)."""
    at, n = _MATRICES[m][2], m + 2
    th, tw = -(-h // m), -(-w // m)

    def shape(*dims):
        return tuple(tirx.IntImm(index, d) for d in dims)

    s = te.compute(shape(m, n, th * tw, o), lambda u, b, p, k: _select(u, [
        _combine([(at[uu][a], mm[n * a + b, p, k]) for a in range(n) if at[uu][a]]) for uu in range(m)]), name="S")
    return te.compute(shape(th, m, tw, m, o), lambda ty, u, tx, v, k: _select(v, [
        _combine([(at[vv][b], s[u, b, ty * tw + tx, k]) for b in range(n) if at[vv][b]]) for vv in range(m)]),
        name="Y")


def _in_registers(sch, stage, loop):
    """A transform's first pass (stage T or S: [n or m, n, tiles, C]) computed per tile and channel
    vector under `loop`, in registers: its two small dims unrolled, the channels vectorized."""
    block = sch.get_sblock(stage)
    sch.compute_at(block, loop)
    sch.set_scope(block, 0, "local")
    r, c, _, k = sch.get_loops(block)[-4:]
    sch.unroll(r)
    sch.unroll(c)
    sch.vectorize(k)


def schedule_tiles(sch, ty, u, tx, v, k, channels, lanes):
    """The output transform's loops (tile row, row in tile, tile, column in tile, channel): tile rows
    in parallel, then tiles, channel vectors, the tile's m x m outputs unrolled (the selects fold),
    stage S in registers under them."""
    k0, k1 = sch.split(k, [None, _vector(channels, lanes)])
    sch.reorder(ty, tx, k0, u, v, k1)
    sch.parallel(ty)
    sch.unroll(u)
    sch.unroll(v)
    sch.vectorize(k1)
    _in_registers(sch, "S", k0)


def output_transform(o, h, w, lanes, m=2):
    """M [n², th*tw, O] -> Y [th, m, tw, m, O], Y[ty, u, tx, v, k] = (Aᵀ M A)[u, v] of tile (ty, tx).
    Carries `tvmfuse.winograd` (o, h, w, m, lanes): what passes/fuse_winograd_epilogue.py rebuilds it from."""
    n, th, tw = m + 2, -(-h // m), -(-w // m)
    mm = te.placeholder((n * n, th * tw, o), "float32", name="M")
    y = output_compute(mm, o, h, w, m)
    sch = s_tir.Schedule(te.create_prim_func([mm, y]))
    schedule_tiles(sch, *sch.get_loops(sch.get_sblock("Y")), o, lanes)
    return _mark(sch.mod["main"], "winograd.OutputTransform").with_attr(
        WINOGRAD_ATTR, {"o": o, "h": h, "w": w, "m": m, "lanes": lanes})


def _mark(func, rule):
    return func.with_attrs({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": OPAQUE,
                            "tvmfuse.rule": rule})


def _rewrite(table):
    """rewrite(call, builder) for relax_utils.rewrite_op_calls: the Winograd form, or None."""

    def rewrite(call, builder):
        legal = _legal(call)
        if isinstance(legal, str):
            return None
        c, h, w, o, wv = legal
        m = _tile(c, h, w, o, table, runtime_weight=wv is None)
        if isinstance(m, str):
            log.info("conv2d %dx%dx%d -> %d (3x3/1) stays direct: %s", c, h, w, o, m)
            return None
        log.info("conv2d %dx%dx%d -> %d (3x3/1) as Winograd F(%dx%d, 3x3)%s", c, h, w, o, m, m,
                 "" if wv is not None else ", its weight (an input) transformed on every call")
        lanes = max(1, int(table["vector_bytes"]) // 4)
        if wv is not None:
            u = relax.const(transformed_weight(wv, m))
        else:
            fw = builder.add_func(weight_transform(c, o, lanes, m), "winograd_weight")
            u = builder.emit(relax.call_tir(fw, [call.args[1]], relax.TensorType(((m + 2) ** 2, c, o), "float32")))
        return _winograd(builder, call.args[0], c, h, w, o, u, lanes, m)

    return rewrite


def _winograd(bb, x, c, h, w, o, u, lanes, m):
    emit = bb.emit
    th, tw, n = -(-h // m), -(-w // m), m + 2
    fin = bb.add_func(input_transform(c, h, w, lanes, m), "winograd_input")
    fout = bb.add_func(output_transform(o, h, w, lanes, m), "winograd_output")
    v = emit(relax.call_tir(fin, [x], relax.TensorType((n * n, th * tw, c), "float32")))
    mt = emit(relax.op.matmul(v, u))
    y = emit(relax.call_tir(fout, [mt], relax.TensorType((th, m, tw, m, o), "float32")))
    y = emit(relax.op.reshape(y, relax.ShapeExpr([1, m * th, m * tw, o])))
    y = relax.op.permute_dims(y, [0, 3, 1, 2])
    if (m * th, m * tw) != (h, w):
        y = relax.op.strided_slice(emit(y), axes=[2, 3], begin=[0, 0], end=[h, w])
    return y


def winograd_3x3(table):
    """The pass for a CPU constants table (schedules/targets.cpu_table of the build's target)."""

    @tvm.transform.module_pass(opt_level=0, name="tvmfuse.Winograd3x3")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not table.get("winograd", 0):
            return mod
        return rewrite_op_calls(mod, "relax.nn.conv2d", _rewrite(table))

    return _pass
