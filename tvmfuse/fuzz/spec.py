"""A fuzz graph as plain data (a "spec"), and the Relax module and numpy inputs it stands for.

A spec is JSON-able, so a failing graph can be saved as a regression test and rebuilt exactly:

    {"inputs":  [{"name": "x0", "shape": [3, 7], "dtype": "float32", "kind": "normal"}, ...],
     "ops":     [{"name": "v0", "op": "add", "args": ["x0", "x1"], "attrs": {}}, ...],
     "outputs": ["v3", "v1"],
     "knobs":   {"allow_recompute": true, ...},          # optional: tvmfuse fusion knobs
     "symbolic": {"n": 7, "sizes": [7, 10]}}            # optional: axis 0 = 7 of the rank >= 2 inputs
                                                        # becomes a symbolic dim, checked at each size

An argument is a value name, or a number (a scalar constant of the other operand's dtype). Inputs of
kind "normal" are uniform in [-2, 2], "positive" ones in [0.5, 2] (divisors). Several outputs give
a tuple-returning main (multi-output).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ..relax_utils import GRAPH_LOCK

_UNARY = {"exp": R.exp, "tanh": R.tanh, "sigmoid": R.sigmoid, "relu": R.nn.relu, "negative": R.negative,
          "abs": R.abs, "sqrt": R.sqrt, "rsqrt": R.rsqrt}
_BINARY = {"add": R.add, "subtract": R.subtract, "multiply": R.multiply, "divide": R.divide,
           "maximum": R.maximum, "minimum": R.minimum}
_REDUCE = {"sum": R.sum, "mean": R.mean, "max": R.max, "min": R.min}


def _arg(x, env, dtype):
    if isinstance(x, str):
        return env[x]
    return relax.const(float(x), dtype)


def _dtype_of(args, env):
    return next(env[a].ty.dtype for a in args if isinstance(a, str))


def relax_expr(op: str, args: list, attrs: dict, env: dict) -> relax.Expr:
    """The Relax call for one spec op; `env` maps value names to Relax vars."""
    dt = _dtype_of(args, env)
    a = [_arg(x, env, dt) for x in args]
    if op in _UNARY:
        return _UNARY[op](a[0])
    if op in _BINARY:
        return _BINARY[op](a[0], a[1])
    if op in _REDUCE:
        return _REDUCE[op](a[0], axis=attrs["axis"], keepdims=attrs["keepdims"])
    simple = {
        "astype": lambda: R.astype(a[0], attrs["dtype"]),
        "reshape": lambda: R.reshape(a[0], attrs["shape"]),
        "permute_dims": lambda: R.permute_dims(a[0], attrs["axes"]),
        "expand_dims": lambda: R.expand_dims(a[0], attrs["axis"]),
        "squeeze": lambda: R.squeeze(a[0], attrs["axis"]),
        "strided_slice": lambda: R.strided_slice(a[0], attrs["axes"], attrs["begin"], attrs["end"],
                                                 attrs["strides"]),
        "concat": lambda: R.concat(a, axis=attrs["axis"]),
        "softmax": lambda: R.nn.softmax(a[0], axis=attrs["axis"]),
        "layer_norm": lambda: R.nn.layer_norm(a[0], a[1], a[2], attrs["axes"], attrs["epsilon"]),
        "matmul": lambda: R.matmul(a[0], a[1]),
        "conv2d": lambda: R.nn.conv2d(a[0], a[1], strides=attrs["strides"], padding=attrs["padding"],
                                      groups=attrs.get("groups", 1)),
        "pad": lambda: R.nn.pad(a[0], attrs["pad_width"]),
    }
    if op not in simple:
        raise KeyError(f"unknown fuzz op {op!r}")
    return simple[op]()


def input_shape(spec: dict, i: dict, size=None) -> list:
    """An input's shape; with `size` (an int, or a TIR var for the symbolic build) in place of the
    spec's symbolic dim: axis 0 of every input of rank >= 2 whose axis 0 is spec["symbolic"]["n"]."""
    shape = list(i["shape"])
    sym = spec.get("symbolic")
    if size is not None and sym and len(shape) >= 2 and shape[0] == sym["n"]:
        shape[0] = size
    return shape


def to_module(spec: dict, size=None):
    """The Relax IRModule (one dataflow block in main) for a spec; `size`: see input_shape."""
    bb = relax.BlockBuilder()
    params = [relax.Var(i["name"], relax.TensorType(input_shape(spec, i, size), i["dtype"])) for i in spec["inputs"]]
    env = {p.name: p for p in params}
    outputs = set(spec["outputs"])
    with GRAPH_LOCK, bb.function("main", params):
        with bb.dataflow():
            for o in spec["ops"]:
                expr = relax_expr(o["op"], o["args"], o.get("attrs", {}), env)
                if o["name"] in outputs:
                    env[o["name"]] = bb.emit_output(expr, name_hint=o["name"])
                else:
                    env[o["name"]] = bb.emit(expr, name_hint=o["name"])
        outs = [env[n] for n in spec["outputs"]]
        bb.emit_func_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
    return bb.get()


def make_inputs(spec: dict, seed: int = 0, size: int | None = None) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i in spec["inputs"]:
        lo, hi = (0.5, 2.0) if i.get("kind") == "positive" else (-2.0, 2.0)
        out.append(rng.uniform(lo, hi, size=input_shape(spec, i, size)).astype(i["dtype"]))
    return out


def spec_ops(spec: dict) -> list[str]:
    return [o["op"] for o in spec["ops"]]


def spec_id(spec: dict) -> str:
    """A short stable hash of the spec (names regression files, de-duplicates campaign graphs)."""
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
