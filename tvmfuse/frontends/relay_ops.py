"""Relay op -> Relax op table used by relay_text.py.

`OPS[name](bb, args, attrs) -> relax.Expr`: args are Relax leaves (vars, constants) already emitted,
attrs the Relay call attributes as Python values (ints, floats, bools, strings, lists, None).
Intermediate steps (a transposed weight, a reshaped bias) are emitted with `bb.emit`; the returned
expression is emitted by the caller. Relay defaults are applied where Relay and Relax differ
(nn.batch_matmul transposes its second operand by default; nn.dense's weight is [units, in]).
An attribute value this table cannot honour raises UnsupportedAttr (reported with line:col).
"""
from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from ..relax_utils import static_shape


class UnsupportedAttr(Exception):
    pass


def _shape(x):
    s = static_shape(x.ty)
    if s is None:
        raise UnsupportedAttr(f"operand {x} has no static shape")
    return s


def _dtype(v):
    return v or None  # Relay prints out_dtype="" for "same as input"


def _axes(axis, ndim):
    if axis is None:
        return None
    axis = axis if isinstance(axis, list) else [axis]
    return [int(a) % ndim for a in axis]


# ---------------------------------------------------------------- linear algebra
def _dense(bb, a, k):
    x, w = a
    wt = bb.emit(R.permute_dims(w))  # Relay's dense weight is [units, in]
    return R.matmul(x, wt, out_dtype=_dtype(k.get("out_dtype")))


def _transpose_last2(bb, x):
    n = len(_shape(x))
    return bb.emit(R.permute_dims(x, list(range(n - 2)) + [n - 1, n - 2]))


def _matmul(bb, a, k):
    x, y = a
    if k.get("transpose_a", False):
        x = _transpose_last2(bb, x)
    if k.get("transpose_b", False):
        y = _transpose_last2(bb, y)
    return R.matmul(x, y, out_dtype=_dtype(k.get("out_dtype")))


def _batch_matmul(bb, a, k):
    # Relay: nn.batch_matmul(x [B, M, K], y [B, N, K]) with transpose_b=True by default
    return _matmul(bb, a, {"transpose_a": k.get("transpose_a", False), "transpose_b": k.get("transpose_b", True),
                           "out_dtype": k.get("out_dtype")})


def _conv2d(bb, a, k):
    x, w = a
    return R.nn.conv2d(x, w, strides=k.get("strides", [1, 1]), padding=k.get("padding", [0, 0, 0, 0]),
                       dilation=k.get("dilation", [1, 1]), groups=k.get("groups", 1),
                       data_layout=k.get("data_layout", "NCHW"), kernel_layout=k.get("kernel_layout", "OIHW"),
                       out_layout=k.get("out_layout") or None, out_dtype=_dtype(k.get("out_dtype")))


def _pool(fn):
    def conv(bb, a, k):
        (x,) = a
        kw = dict(pool_size=k.get("pool_size", [1, 1]), strides=k.get("strides", [1, 1]),
                  padding=k.get("padding", [0, 0]), dilation=k.get("dilation", [1, 1]),
                  ceil_mode=k.get("ceil_mode", False), layout=k.get("layout", "NCHW"))
        if fn is R.nn.avg_pool2d:
            kw["count_include_pad"] = k.get("count_include_pad", False)
        return fn(x, **kw)

    return conv


def _global_avg_pool2d(bb, a, k):
    (x,) = a
    layout = k.get("layout", "NCHW")
    return R.mean(x, axis=[layout.index("H"), layout.index("W")], keepdims=True)


# ---------------------------------------------------------------- normalization / activations
def _bias_add(bb, a, k):
    x, b = a
    n = len(_shape(x))
    axis = int(k.get("axis", 1)) % n
    if axis != n - 1:
        b = bb.emit(R.reshape(b, [_shape(b)[0]] + [1] * (n - axis - 1)))
    return R.add(x, b)


def _batch_norm(bb, a, k):
    x, g, b, mean, var = a
    return R.nn.batch_norm(x, g, b, mean, var, axis=int(k.get("axis", 1)), epsilon=float(k.get("epsilon", 1e-5)),
                           center=k.get("center", True), scale=k.get("scale", True), training=False)


def _layer_norm(bb, a, k):
    x, g, b = a
    return R.nn.layer_norm(x, g, b, axes=[int(k.get("axis", -1))], epsilon=float(k.get("epsilon", 1e-5)),
                           center=k.get("center", True), scale=k.get("scale", True))


def _softmax(fn):
    return lambda bb, a, k: fn(a[0], axis=int(k.get("axis", -1)))


def _dropout(bb, a, k):
    return R.nn.dropout(a[0], rate=float(k.get("rate", 0.5)))


def _clip(bb, a, k):
    return R.clip(a[0], relax.PrimValue(float(k["a_min"])), relax.PrimValue(float(k["a_max"])))


# ---------------------------------------------------------------- layout
def _reshape(bb, a, k):
    (x,) = a
    src = list(_shape(x))
    new = k.get("newshape", k.get("shape"))
    new = new if isinstance(new, list) else [new]
    out, i = [], 0  # Relay's special values: 0 copy, -1 infer, -2 copy the rest, -3 merge two
    for d in new:
        d = int(d)
        if d == 0:
            out.append(src[i]); i += 1
        elif d == -2:
            out.extend(src[i:]); i = len(src)
        elif d == -3:
            out.append(src[i] * src[i + 1]); i += 2
        elif d == -4:
            raise UnsupportedAttr("newshape value -4 (split a dimension) is not supported")
        else:
            out.append(d); i += 1
    return R.reshape(x, out)


def _transpose(bb, a, k):
    axes = k.get("axes")
    return R.permute_dims(a[0], None if axes is None else [int(v) for v in axes])


def _expand_dims(bb, a, k):
    (x,) = a
    axis, num = int(k["axis"]), int(k.get("num_newaxis", 1))
    if axis < 0:
        axis += len(_shape(x)) + 1
    return R.expand_dims(x, list(range(axis, axis + num)))


def _squeeze(bb, a, k):
    axis = k.get("axis")
    return R.squeeze(a[0], None if axis is None else [int(v) for v in axis])


def _concatenate(bb, a, k):
    (t,) = a
    return R.concat(t, axis=int(k.get("axis", 0)))


def _split(bb, a, k):
    return R.split(a[0], k["indices_or_sections"], axis=int(k.get("axis", 0)))


def _strided_slice(bb, a, k):
    (x,) = a
    shape = _shape(x)
    begin = [int(v) for v in k["begin"]]
    end = [int(v) for v in k["end"]]
    axes = k.get("axes")
    axes = list(range(len(begin))) if axes is None else [int(v) for v in axes]
    strides = [int(v) for v in (k.get("strides") or [1])]
    strides = strides + [strides[-1]] * (len(begin) - len(strides))
    if k.get("slice_mode", "end") == "size":
        end = [shape[ax] if e < 0 else b + e for ax, b, e in zip(axes, begin, end)]
    return R.strided_slice(x, axes, begin, end, strides)


def _broadcast_to(bb, a, k):
    return R.broadcast_to(a[0], [int(v) for v in k["shape"]])


def _take(bb, a, k):
    x, idx = a
    return R.take(x, idx, axis=k.get("axis"))


def _batch_flatten(bb, a, k):
    (x,) = a
    s = _shape(x)
    n = 1
    for d in s[1:]:
        n *= d
    return R.reshape(x, [s[0], n])


def _reduce(fn):
    def conv(bb, a, k):
        (x,) = a
        n = len(_shape(x))
        axes = _axes(k.get("axis"), n)
        if k.get("exclude", False):
            axes = [i for i in range(n) if i not in (axes or [])]
        return fn(x, axis=axes, keepdims=bool(k.get("keepdims", False)))

    return conv


def _cast(bb, a, k):
    return R.astype(a[0], k["dtype"])


def _unary(fn):
    return lambda bb, a, k: fn(a[0])


def _binary(fn):
    return lambda bb, a, k: fn(a[0], a[1])


OPS = {
    "nn.dense": _dense, "nn.matmul": _matmul, "nn.batch_matmul": _batch_matmul, "nn.conv2d": _conv2d,
    "nn.bias_add": _bias_add, "nn.batch_norm": _batch_norm, "nn.layer_norm": _layer_norm,
    "nn.relu": _unary(R.nn.relu), "nn.softmax": _softmax(R.nn.softmax), "nn.log_softmax": _softmax(R.nn.log_softmax),
    "nn.dropout": _dropout, "nn.max_pool2d": _pool(R.nn.max_pool2d), "nn.avg_pool2d": _pool(R.nn.avg_pool2d),
    "nn.global_avg_pool2d": _global_avg_pool2d, "nn.batch_flatten": _batch_flatten, "clip": _clip,
    "exp": _unary(R.exp), "sqrt": _unary(R.sqrt), "rsqrt": _unary(R.rsqrt), "tanh": _unary(R.tanh),
    "erf": _unary(R.erf), "sigmoid": _unary(R.sigmoid), "log": _unary(R.log), "abs": _unary(R.abs),
    "negative": _unary(R.negative), "floor": _unary(R.floor), "ceil": _unary(R.ceil),
    "logical_not": _unary(R.logical_not), "copy": lambda bb, a, k: a[0],
    "add": _binary(R.add), "subtract": _binary(R.subtract), "multiply": _binary(R.multiply),
    "divide": _binary(R.divide), "power": _binary(R.power), "maximum": _binary(R.maximum),
    "minimum": _binary(R.minimum), "floor_divide": _binary(R.floor_divide),
    "equal": _binary(R.equal), "not_equal": _binary(R.not_equal), "less": _binary(R.less),
    "less_equal": _binary(R.less_equal), "greater": _binary(R.greater), "greater_equal": _binary(R.greater_equal),
    "logical_and": _binary(R.logical_and), "logical_or": _binary(R.logical_or),
    "where": lambda bb, a, k: R.where(a[0], a[1], a[2]),
    "reshape": _reshape, "transpose": _transpose, "expand_dims": _expand_dims, "squeeze": _squeeze,
    "concatenate": _concatenate, "split": _split, "strided_slice": _strided_slice, "broadcast_to": _broadcast_to,
    "take": _take, "cast": _cast,
    "sum": _reduce(R.sum), "mean": _reduce(R.mean), "max": _reduce(R.max), "min": _reduce(R.min),
    "prod": _reduce(R.prod),
}
