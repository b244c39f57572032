"""One generator per op kind: draw an operand and attributes, emit the op (or raise _Reject).

Each takes the `Graph` being built (gen.py) and appends one or more spec ops. Composite kinds
(sqrt_abs, layer_norm_decomposed) emit their primitive ops one by one, so fusion sees them apart.
"""
from __future__ import annotations

import math

from .graph import BINARY, UNARY, Graph, Val, _Reject, broadcast_shape, exp_bound

GENERATORS = {}


def _gen(*names):
    def deco(fn):
        for n in names:
            GENERATORS[n] = (lambda f, n: (lambda g: f(g, n)))(fn, n)
        return fn
    return deco


def _ranked(g: Graph, lo=1) -> Val:
    return g.operand(lambda v: len(v.shape) >= lo)


# ---------------------------------------------------------------------------- elementwise
@_gen(*UNARY)
def unary(g: Graph, op):
    if op == "exp":
        a = g.operand(lambda v: v.bound <= 4.0)
        return g.emit("exp", [a], a.shape, exp_bound(a.bound), lo=math.exp(-a.bound))
    a = g.operand()
    if op == "sqrt_abs":  # sqrt(|x| + 1e-3): defined everywhere
        b = g.emit("abs", [a], a.shape, a.bound)
        c = g.emit("add", [b, 1e-3], a.shape, a.bound + 1e-3, lo=1e-3)
        return g.emit("sqrt", [c], a.shape, math.sqrt(c.bound), lo=math.sqrt(1e-3))
    if op in ("tanh", "sigmoid"):
        lo = 1.0 / (1.0 + math.exp(min(a.bound, 700.0))) if op == "sigmoid" else 0.0
        return g.emit(op, [a], a.shape, 1.0, lo=lo)
    return g.emit(op, [a], a.shape, a.bound, lo=a.lo if op in ("relu", "abs") else 0.0)


def _partner(g: Graph, a: Val, positive: bool):
    """The second operand: an existing value of the same shape, a new input of the same or a
    broadcast shape (size-1 dims, a bias vector), or a scalar constant."""
    mode = g.src.int(0, 3)
    ok = (lambda v: v.lo >= 0.25) if positive else (lambda v: True)
    if mode == 0:
        same = [v for v in g.vals if v.shape == a.shape and v.dtype == a.dtype and ok(v)]
        if same:
            return g.pick(same)
        mode = 1
    if mode == 1:
        return g.new_input(a.shape, a.dtype, positive)
    if mode == 2:
        if g.flag() and a.shape:  # a trailing suffix: bias vector / row
            shape = a.shape[g.src.int(0, len(a.shape) - 1):]
        else:
            shape = tuple(1 if g.flag() else d for d in a.shape)
        return g.new_input(shape, a.dtype, positive)
    return [0.5, 1.5, 2.0, 0.75][g.src.int(0, 3)] * (1 if positive else (1 if g.flag() else -1))


@_gen(*BINARY)
def binary(g: Graph, op):
    a = g.operand()
    b = _partner(g, a, positive=(op == "divide"))
    bb, blo, bshape = (b.bound, b.lo, b.shape) if isinstance(b, Val) else (abs(b), max(b, 0.0), ())
    shape = broadcast_shape(a.shape, bshape)
    bound = {"add": a.bound + bb, "subtract": a.bound + bb, "multiply": a.bound * bb,
             "divide": a.bound / max(blo, 1e-9), "maximum": max(a.bound, bb), "minimum": max(a.bound, bb)}[op]
    lo = {"add": a.lo + blo, "multiply": a.lo * blo, "maximum": max(a.lo, blo), "minimum": min(a.lo, blo),
          "divide": a.lo / bb if bb else 0.0}.get(op, 0.0)
    args = [a, b] if not (isinstance(b, Val) and op != "divide" and g.flag()) else [b, a]
    return g.emit(op, args, shape, bound, lo=lo)


@_gen("astype")
def astype(g: Graph, op):
    a = g.operand()
    to = "float16" if a.dtype == "float32" else "float32"
    return g.emit("astype", [a], a.shape, a.bound, lo=a.lo, out_dtype=to, dtype=to)


# ---------------------------------------------------------------------------- layout
def _reshape_targets(shape):
    n = int(math.prod(shape))
    outs = [(n,), shape + (1,), (1,) + shape]
    for i in range(len(shape) - 1):  # merge two neighbours
        outs.append(shape[:i] + (shape[i] * shape[i + 1],) + shape[i + 2:])
    for i, d in enumerate(shape):  # split a dim
        for f in range(2, d):
            if d % f == 0:
                outs.append(shape[:i] + (f, d // f) + shape[i + 1:])
    return [o for o in outs if 1 <= len(o) <= 4 and o != shape]


@_gen("reshape")
def reshape(g: Graph, op):
    a = _ranked(g)
    shape = g.pick(_reshape_targets(a.shape))
    return g.emit("reshape", [a], shape, a.bound, lo=a.lo, shape=list(shape))


@_gen("permute_dims")
def permute_dims(g: Graph, op):
    a = _ranked(g, 2)
    rest, axes = list(range(len(a.shape))), []
    while rest:
        axes.append(rest.pop(g.src.int(0, len(rest) - 1)))
    if axes == sorted(axes):
        axes = axes[::-1]
    return g.emit("permute_dims", [a], tuple(a.shape[i] for i in axes), a.bound, lo=a.lo, axes=axes)


@_gen("expand_dims")
def expand_dims(g: Graph, op):
    a = g.operand(lambda v: len(v.shape) <= 3)
    ax = g.src.int(0, len(a.shape))
    return g.emit("expand_dims", [a], a.shape[:ax] + (1,) + a.shape[ax:], a.bound, lo=a.lo, axis=[ax])


@_gen("squeeze")
def squeeze(g: Graph, op):
    a = g.operand(lambda v: 1 in v.shape and len(v.shape) >= 2)
    ax = g.pick([i for i, d in enumerate(a.shape) if d == 1])
    return g.emit("squeeze", [a], a.shape[:ax] + a.shape[ax + 1:], a.bound, lo=a.lo, axis=[ax])


@_gen("strided_slice")
def strided_slice(g: Graph, op):
    a = _ranked(g)
    ax = g.src.int(0, len(a.shape) - 1)
    d = a.shape[ax]
    begin = g.src.int(0, d - 1)
    end = g.src.int(begin + 1, d)
    stride = g.src.int(1, 2)
    shape = a.shape[:ax] + (-(-(end - begin) // stride),) + a.shape[ax + 1:]
    return g.emit("strided_slice", [a], shape, a.bound, lo=a.lo, axes=[ax], begin=[begin], end=[end],
                  strides=[stride])


@_gen("concat")
def concat(g: Graph, op):
    a = _ranked(g)
    ax = g.src.int(0, len(a.shape) - 1)
    fits = [v for v in g.vals if v.dtype == a.dtype and len(v.shape) == len(a.shape)
            and all(x == y for i, (x, y) in enumerate(zip(v.shape, a.shape)) if i != ax)]
    b = g.pick(fits) if g.flag() else g.new_input(a.shape[:ax] + (g.pick((1, 2, 3)),) + a.shape[ax + 1:], a.dtype)
    shape = a.shape[:ax] + (a.shape[ax] + b.shape[ax],) + a.shape[ax + 1:]
    return g.emit("concat", [a, b], shape, max(a.bound, b.bound), lo=min(a.lo, b.lo), axis=ax)


# ---------------------------------------------------------------------------- reductions
def _axes(g: Graph, rank):
    axes = [i for i in range(rank) if g.flag()]
    return axes or [g.src.int(0, rank - 1)]


def _reduced(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@_gen("sum", "mean", "max", "min")
def reduce(g: Graph, op):
    a = _ranked(g)
    axes, keep = _axes(g, len(a.shape)), g.flag()
    count = math.prod(a.shape[i] for i in axes)
    bound = a.bound * count if op == "sum" else a.bound
    return g.emit(op, [a], _reduced(a.shape, axes, keep), bound, lo=a.lo * (count if op == "sum" else 1),
                  axis=axes, keepdims=keep)


@_gen("softmax")
def softmax(g: Graph, op):
    a = _ranked(g)
    return g.emit("softmax", [a], a.shape, 1.0, axis=g.src.int(-len(a.shape), len(a.shape) - 1))


EPS = 0.1  # large on purpose: normalising a near-constant row must not amplify rounding noise


@_gen("layer_norm_decomposed")
def layer_norm_decomposed(g: Graph, op):
    """mean, x - mean, square, mean, + eps, rsqrt, multiply: over random axes (not only trailing)."""
    a = _ranked(g)
    axes = _axes(g, len(a.shape))
    kept = _reduced(a.shape, axes, True)
    mu = g.emit("mean", [a], kept, a.bound, axis=axes, keepdims=True)
    d = g.emit("subtract", [a, mu], a.shape, 2 * a.bound)
    sq = g.emit("multiply", [d, d], a.shape, 4 * a.bound ** 2)
    var = g.emit("mean", [sq], kept, sq.bound, axis=axes, keepdims=True)
    ve = g.emit("add", [var, EPS], kept, var.bound + EPS, lo=EPS)
    r = g.emit("rsqrt", [ve], kept, 1 / math.sqrt(EPS))
    return g.emit("multiply", [d, r], a.shape, d.bound / math.sqrt(EPS))


@_gen("layer_norm")
def layer_norm(g: Graph, op):
    a = _ranked(g)
    k = g.src.int(1, len(a.shape))
    axes = list(range(len(a.shape) - k, len(a.shape)))
    gamma = g.new_input(a.shape[-k:], a.dtype)
    beta = g.new_input(a.shape[-k:], a.dtype)
    return g.emit("layer_norm", [a, gamma, beta], a.shape, 2 * 2 * a.bound / math.sqrt(EPS) + 2, axes=axes,
                  epsilon=EPS)


# ---------------------------------------------------------------------------- compute-heavy
@_gen("matmul")
def matmul(g: Graph, op):
    a = _ranked(g, 2)
    k = a.shape[-1]
    fits = [v for v in g.vals if v.dtype == a.dtype and len(v.shape) == 2 and v.shape[0] == k]
    if fits and g.flag():
        b = g.pick(fits)
    else:
        batch = a.shape[:-2] if g.flag() else ()
        b = g.new_input(batch + (k, g.pick((1, 3, 5, 8, 32, 49))), a.dtype)  # 49: tiles cut its 7 x 7 reshape
    shape = broadcast_shape(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    return g.emit("matmul", [a, b], shape, k * a.bound * b.bound)


@_gen("attention")
def attention(g: Graph, op):
    """softmax(Q·Kᵀ·scale (+ mask), -1)·V, the spelling match_attention fuses into one flash kernel:
    Q an existing value [.., S, D], K and V new inputs with its leading dims (so a symbolic leading
    dim, batch or sequence, flows through), Kᵀ a permute_dims, the mask an input broadcast over rows."""
    q = _ranked(g, 2)
    lead, s, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    sk = s if not lead or g.flag() else g.pick((1, 7, 13))
    k = g.new_input(lead + (sk, d), q.dtype)
    v = g.new_input(lead + (sk, g.pick((1, 4, 8, 16))), q.dtype)
    kt = g.emit("permute_dims", [k], lead + (d, sk), k.bound, axes=list(range(len(lead))) + [len(lead) + 1, len(lead)])
    sc = g.emit("matmul", [q, kt], lead + (s, sk), d * q.bound * k.bound)
    scale = g.pick((0.125, 0.5, 1.0))
    sc = g.emit("multiply", [sc, scale], sc.shape, sc.bound * scale)
    if g.flag():
        mask = g.new_input(lead[:-1] + (1,) * min(len(lead), 1) + (1, sk), q.dtype)
        sc = g.emit("add", [sc, mask], sc.shape, sc.bound + mask.bound)
    p = g.emit("softmax", [sc], sc.shape, 1.0, axis=-1)
    return g.emit("matmul", [p, v], lead + (s, v.shape[-1]), sk * v.bound)


@_gen("conv2d")
def conv2d(g: Graph, op):
    four = [v for v in g.vals if len(v.shape) == 4]
    if four and g.flag():
        a = g.pick(four)
    else:  # view a value as one (1, 1, H, W) image
        v = _ranked(g)
        hw = (int(math.prod(v.shape[:-1])), v.shape[-1])
        a = g.emit("reshape", [v], (1, 1) + hw, v.bound, lo=v.lo, shape=[1, 1, *hw])
    n, c, h, w = a.shape
    pad, kern, stride = g.src.int(0, 1), g.pick((1, 3)), g.src.int(1, 2)
    if kern > h + 2 * pad or kern > w + 2 * pad:
        raise _Reject("kernel larger than the padded input")
    groups = g.pick([d for d in (1, 2, c) if c % d == 0])  # grouped and depthwise (c) convs too
    wt = g.new_input((groups * g.pick((1, 2, 4, 8, 16)), c // groups, kern, kern), a.dtype)
    shape = (n, wt.shape[0], (h + 2 * pad - kern) // stride + 1, (w + 2 * pad - kern) // stride + 1)
    return g.emit("conv2d", [a, wt], shape, c // groups * kern * kern * a.bound * 2.0, strides=[stride, stride],
                  padding=[pad, pad], groups=groups)


@_gen("anchor_slices")
def anchor_slices(g: Graph, op):
    """A matmul whose output is sliced twice and the slices combined: along the last axis,
    sigmoid(first half) * second half (SwiGLU with one merged weight), or, batched, two batches
    added (Winograd's output transform). The combining op reads the anchor at two positions."""
    a = _ranked(g, 2)
    k = a.shape[-1]
    batched = len(a.shape) == 3 and a.shape[0] >= 2 and g.flag()
    n = g.pick((2, 6, 10, 32)) if not batched else g.pick((1, 5, 8))
    b = g.new_input(a.shape[:-2] + (k, n) if batched else (k, n), a.dtype)
    shape = a.shape[:-1] + (n,)
    m = g.emit("matmul", [a, b], shape, k * a.bound * b.bound)
    if batched:
        i, j = 0, a.shape[0] - 1
        s0 = g.emit("strided_slice", [m], (1,) + shape[1:], m.bound, axes=[0], begin=[i], end=[i + 1], strides=[1])
        s1 = g.emit("strided_slice", [m], (1,) + shape[1:], m.bound, axes=[0], begin=[j], end=[j + 1], strides=[1])
        q0 = g.emit("squeeze", [s0], shape[1:], m.bound, axis=[0])
        q1 = g.emit("squeeze", [s1], shape[1:], m.bound, axis=[0])
        return g.emit("add", [q0, q1], shape[1:], 2 * m.bound)
    half = n // 2
    last = len(shape) - 1
    s0 = g.emit("strided_slice", [m], shape[:-1] + (half,), m.bound, axes=[last], begin=[0], end=[half],
                strides=[1])
    s1 = g.emit("strided_slice", [m], shape[:-1] + (n - half,), m.bound, axes=[last], begin=[half], end=[n],
                strides=[1])
    gate = g.emit("sigmoid", [s0], s0.shape, 1.0)
    return g.emit("multiply", [gate, s1], s1.shape, m.bound)


@_gen("pad")
def pad(g: Graph, op):
    """A zero pad of the last two axes (TF "same" padding, FoldExplicitPadding's input)."""
    a = _ranked(g, 2)
    widths = [0] * (2 * len(a.shape))
    for ax in (len(a.shape) - 2, len(a.shape) - 1):
        widths[2 * ax], widths[2 * ax + 1] = g.src.int(0, 2), g.src.int(0, 2)
    shape = tuple(d + widths[2 * i] + widths[2 * i + 1] for i, d in enumerate(a.shape))
    if math.prod(shape) > g.max_elems:
        raise _Reject("padded tensor too large")
    return g.emit("pad", [a], shape, a.bound, lo=min(a.lo, 0.0), pad_width=widths)
