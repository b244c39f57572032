"""The workload zoo: Relax graphs in three shape sets (small for tests, bench, large; see SIZES),
deterministic inputs and a numpy reference each. Graphs are written op by op with BlockBuilder, so fusion has work to do.
Each is a `Workload` (tvmfuse/zoo/workload.py, the type the real models share) marked `zoo`."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ..errors import UnknownWorkloadError
from ..relax_utils import GRAPH_LOCK
from .workload import Workload

# small: tests (tiny, fast); bench: the benchmark's shapes (partly cache-resident on a 32 MiB LLC);
# large: the memory-bound workloads with working sets over 4x a 32 MiB LLC (each full-size tensor
# 128 MiB), so that a bandwidth bound is a bound; compute-heavy workloads keep their bench shapes
SIZES = ("small", "bench", "large")


_REGISTRY: dict[str, Callable] = {}


def register(fn):
    _REGISTRY[fn.__name__] = fn
    return fn


def names() -> list[str]:
    return list(_REGISTRY)


def memory_bound_names() -> list[str]:
    """The zoo workloads bound by memory traffic (a fact of each workload: `memory_bound`)."""
    return [n for n in names() if get(n).memory_bound]


def get(name: str, size: str = "small") -> Workload:
    if name not in _REGISTRY:
        raise UnknownWorkloadError(f"unknown workload {name!r}; known workloads: {', '.join(names())}")
    if size not in SIZES:
        raise UnknownWorkloadError(f"unknown size {size!r} for workload {name!r}; use one of {SIZES}")
    return _REGISTRY[name](size)


def _build(name, specs, body):
    """specs: [(name, shape, dtype)]; body(bb, *vars) -> output expr(s) emitted in a dataflow block."""
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, d)) for n, s, d in specs]
    with GRAPH_LOCK, bb.function("main", params):
        with bb.dataflow():
            outs = body(bb, *params)
            if isinstance(outs, (list, tuple)):
                outs = [bb.emit_output(o) for o in outs]
                ret = bb.emit_output(relax.Tuple(outs))
            else:
                ret = bb.emit_output(outs)
        bb.emit_func_output(ret)
    return bb.get()


def _wl(name, size, specs, body, ref, **kw):
    return Workload(name, _build(name, specs, body), specs, ref, size=size, zoo=True, **kw)


def _pick(size, small, bench, large=None):
    """The shape set's value: `large` falls back to `bench` (compute-heavy workloads: their bench
    shapes already run long; "large" exists for the memory-bound ones, see SIZES)."""
    return small if size == "small" else large if size == "large" and large is not None else bench


# ---------------------------------------------------------------- elementwise / conv
@register
def bias_relu_dropout(size):
    n, m = _pick(size, (64, 128), (4096, 1024), (32768, 1024))
    specs = [("x", (n, m), "float32"), ("bias", (m,), "float32")]

    def body(bb, x, b):
        y = bb.emit(R.add(x, b))  # bias_add: broadcast over rows
        y = bb.emit(R.nn.relu(y))
        d = bb.emit(R.nn.dropout(y, rate=0.1))  # inference: identity
        return bb.emit(relax.TupleGetItem(d, 0))

    return _wl("bias_relu_dropout", size, specs, body, lambda x, b: np.maximum(x + b, 0))


@register
def conv_relu_bn_add(size):
    c, hw = _pick(size, (8, 10), (64, 56))
    specs = [
        ("x", (1, c, hw, hw), "float32"),
        ("w", (c, c, 3, 3), "float32"),
        ("gamma", (c,), "float32"),
        ("beta", (c,), "float32"),
        ("mean", (c,), "float32"),
        ("var", (c,), "float32"),
    ]

    def body(bb, x, w, g, be, mu, var):
        y = bb.emit(R.nn.conv2d(x, w, padding=(1, 1)))
        y = bb.emit(R.nn.relu(y))
        bn = bb.emit(R.nn.batch_norm(y, g, be, mu, var, axis=1, epsilon=1e-5, training=False))
        y = bb.emit(relax.TupleGetItem(bn, 0))
        return bb.emit(R.add(y, x))

    def ref(x, w, g, be, mu, var):
        y = np.maximum(_conv2d_nchw(x, w, pad=1), 0)
        sh = (1, -1, 1, 1)
        y = (y - mu.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-5) * g.reshape(sh) + be.reshape(sh)
        return y + x

    return _wl("conv_relu_bn_add", size, specs, body, ref, rtol=1e-3, atol=1e-3, positive=("var",),
               flops=2 * c * c * 3 * 3 * hw * hw)


def _conv2d_nchw(x, w, pad):
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))  # n,c,h,w,k,k
    return np.einsum("nchwij,ocij->nohw", cols, w, optimize=True).astype(x.dtype)


# ---------------------------------------------------------------- reductions
def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@register
def softmax_chain(size):
    n, m = _pick(size, (64, 128), (1024, 1024), (16384, 2048))
    specs = [("x", (n, m), "float32"), ("y", (n, m), "float32")]

    def body(bb, x, y):
        a = bb.emit(R.add(x, y))
        a = bb.emit(R.nn.relu(a))
        a = bb.emit(R.nn.softmax(a, axis=-1))
        return bb.emit(R.multiply(a, y))

    return _wl("softmax_chain", size, specs, body, lambda x, y: _np_softmax(np.maximum(x + y, 0)) * y, reduction_heavy=True)


@register
def softmax_decomposed(size):
    n, m = _pick(size, (64, 128), (1024, 1024), (16384, 2048))
    specs = [("x", (n, m), "float32")]

    def body(bb, x):
        mx = bb.emit(R.max(x, axis=-1, keepdims=True))
        e = bb.emit(R.exp(bb.emit(R.subtract(x, mx))))
        s = bb.emit(R.sum(e, axis=-1, keepdims=True))
        return bb.emit(R.divide(e, s))

    return _wl("softmax_decomposed", size, specs, body, _np_softmax, reduction_heavy=True)


@register
def layernorm_decomposed(size):
    n, m = _pick(size, (64, 96), (4096, 768), (32768, 1024))
    specs = [("x", (n, m), "float32"), ("gamma", (m,), "float32"), ("beta", (m,), "float32")]

    def body(bb, x, g, b):
        mu = bb.emit(R.mean(x, axis=-1, keepdims=True))
        d = bb.emit(R.subtract(x, mu))
        var = bb.emit(R.mean(bb.emit(R.square(d)), axis=-1, keepdims=True))
        r = bb.emit(R.rsqrt(bb.emit(R.add(var, relax.const(1e-5, "float32")))))
        y = bb.emit(R.multiply(d, r))
        return bb.emit(R.add(bb.emit(R.multiply(y, g)), b))

    def ref(x, g, b):
        mu = x.mean(-1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * g + b

    return _wl("layernorm_decomposed", size, specs, body, ref, reduction_heavy=True,
               meta={"trainable": 2})  # gamma, beta: scripts/tune.py --train


@register
def rmsnorm_residual(size):
    n, m = _pick(size, (64, 96), (4096, 768), (32768, 1024))
    specs = [("x", (n, m), "float32"), ("residual", (n, m), "float32"), ("weight", (m,), "float32")]

    def body(bb, x, r, w):
        s = bb.emit(R.add(x, r))
        ms = bb.emit(R.mean(bb.emit(R.square(s)), axis=-1, keepdims=True))
        inv = bb.emit(R.rsqrt(bb.emit(R.add(ms, relax.const(1e-6, "float32")))))
        y = bb.emit(R.multiply(bb.emit(R.multiply(s, inv)), w))
        return [s, y]

    def ref(x, r, w):
        s = x + r
        return s, s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6) * w

    return _wl("rmsnorm_residual", size, specs, body, ref, reduction_heavy=True)


@register
def multi_reduce(size):
    n, m = _pick(size, (64, 128), (2048, 1024), (32768, 1024))
    specs = [("x", (n, m), "float32")]

    def body(bb, x):
        amax = bb.emit(R.max(bb.emit(R.abs(x))))
        mean = bb.emit(R.mean(x))
        msq = bb.emit(R.mean(bb.emit(R.square(x))))
        return [amax, mean, msq]

    def ref(x):
        x64 = x.astype("float64")
        return (np.abs(x).max(), x64.mean().astype("float32"), (x64 * x64).mean().astype("float32"))

    # float32 accumulation over 2M elements (bench) drifts ~1e-3 from the float64 reference in every
    # variant, fused or not: the tolerance says so instead of hiding it
    return _wl("multi_reduce", size, specs, body, ref, rtol=5e-3, atol=1e-5, reduction_heavy=True)


# ---------------------------------------------------------------- compute-heavy
def _np_gelu(x):
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


@register
def mlp_block(size):
    t, d, h = _pick(size, (32, 64, 256), (512, 768, 3072))
    specs = [("x", (t, d), "float32"), ("w1", (d, h), "float32"), ("b1", (h,), "float32"),
             ("w2", (h, d), "float32"), ("b2", (d,), "float32")]

    def body(bb, x, w1, b1, w2, b2):
        y = bb.emit(R.add(bb.emit(R.matmul(x, w1)), b1))
        y = bb.emit(R.nn.gelu(y))
        y = bb.emit(R.add(bb.emit(R.matmul(y, w2)), b2))
        return bb.emit(R.add(y, x))

    def ref(x, w1, b1, w2, b2):
        return _np_gelu(x @ w1 + b1) @ w2 + b2 + x

    # sums of 3072 products reach ~5e3 at bench size: float32 rounding gives ~1e-2 absolute error
    # next to outputs that cancel to ~0, in every system (ONNX Runtime too), so atol follows the scale
    return _wl("mlp_block", size, specs, body, ref, rtol=1e-3, atol=_pick(size, 1e-3, 5e-2),
               flops=2 * t * d * h * 2, meta={"trainable": 4})  # w1, b1, w2, b2: scripts/tune.py --train


@register
def attention(size):
    b, s, h, dh = _pick(size, (1, 16, 2, 8), (1, 128, 8, 64))
    return attention_workload(b, s, h, dh)


def attention_workload(b, s, h, dh, mask: str | None = None, name: str | None = None) -> Workload:
    """Multi-head attention on [b, s, h*dh] inputs, as transformers write it: split heads, scores
    scaled, softmax, times V, heads merged. `mask`: None; "causal" (where(tril, scores, -1e9), the
    GPT-2 spelling, a constant condition); "additive" (a [b, 1, 1, s] input added to the scores,
    the BERT spelling: 0 where attended, -1e4 for padding)."""
    dm = h * dh
    specs = [("q", (b, s, dm), "float32"), ("k", (b, s, dm), "float32"), ("v", (b, s, dm), "float32")]
    if mask == "additive":
        specs.append(("mask", (b, 1, 1, s), "float32"))
    tril = np.tril(np.ones((s, s), dtype=bool)).reshape(1, 1, s, s)

    def heads(bb, t):
        return bb.emit(R.permute_dims(bb.emit(R.reshape(t, (b, s, h, dh))), [0, 2, 1, 3]))

    def body(bb, q, k, v, *m):
        qh, kh, vh = heads(bb, q), heads(bb, k), heads(bb, v)
        kt = bb.emit(R.permute_dims(kh, [0, 1, 3, 2]))
        sc = bb.emit(R.multiply(bb.emit(R.matmul(qh, kt)), relax.const(1.0 / math.sqrt(dh), "float32")))
        if mask == "causal":
            sc = bb.emit(R.where(relax.const(tril), sc, relax.const(-1e9, "float32")))
        elif mask == "additive":
            sc = bb.emit(R.add(sc, m[0]))
        p = bb.emit(R.nn.softmax(sc, axis=-1))
        o = bb.emit(R.matmul(p, vh))
        return bb.emit(R.reshape(bb.emit(R.permute_dims(o, [0, 2, 1, 3])), (b, s, dm)))

    def ref(q, k, v, *m):
        th = lambda t: t.reshape(b, s, h, dh).transpose(0, 2, 1, 3)
        sc = th(q) @ th(k).transpose(0, 1, 3, 2) * np.float32(1.0 / math.sqrt(dh))
        if mask == "causal":
            sc = np.where(tril, sc, np.float32(-1e9))
        elif mask == "additive":
            sc = sc + m[0]
        return (_np_softmax(sc) @ th(v)).transpose(0, 2, 1, 3).reshape(b, s, dm)

    name = name or ("attention" if mask is None else f"attention_{mask}")  # baselines look up by name
    w = _wl(name, f"{b}x{s}x{h}x{dh}", specs, body, ref, rtol=1e-3, atol=1e-4, meta={"heads": h},
            flops=2 * b * s * s * dm * 2)
    if mask == "additive":  # the padding mask: the last quarter of the keys masked out
        base = w.inputs

        def inputs():
            arrays = base()
            keep = np.where(np.arange(s) < max(1, s - s // 4), 0.0, -1e4).astype("float32")
            arrays[-1] = np.broadcast_to(keep.reshape(1, 1, 1, s), (b, 1, 1, s)).copy()
            return arrays

        w.inputs = inputs
    return w


@register
def linear_regression_step(size):
    """A whole SGD step: forward, MSE loss, gradients written out, and the updates of w and b."""
    n, d = _pick(size, (64, 16), (8192, 256), (131072, 256))
    lr = 0.01
    specs = [("x", (n, d), "float32"), ("y", (n, 1), "float32"), ("w", (d, 1), "float32"),
             ("b", (1,), "float32")]

    def body(bb, x, y, w, b):
        c = lambda v: relax.const(v, "float32")
        diff = bb.emit(R.subtract(bb.emit(R.add(bb.emit(R.matmul(x, w)), b)), y))
        loss = bb.emit(R.mean(bb.emit(R.square(diff))))
        g = bb.emit(R.multiply(diff, c(2.0 / n)))  # dloss/dpred
        gw = bb.emit(R.matmul(bb.emit(R.permute_dims(x, [1, 0])), g))
        gb = bb.emit(R.sum(g, axis=[0]))
        w2 = bb.emit(R.subtract(w, bb.emit(R.multiply(gw, c(lr)))))
        b2 = bb.emit(R.subtract(b, bb.emit(R.multiply(gb, c(lr)))))
        return [loss, w2, b2]

    def ref(x, y, w, b):
        diff = x @ w + b - y
        g = diff * (2.0 / n)
        return (np.float32((diff.astype("float64") ** 2).mean()), w - lr * (x.T @ g), b - lr * g.sum(0))

    return _wl("linear_regression_step", size, specs, body, ref, rtol=1e-3, atol=1e-4)
