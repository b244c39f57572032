"""The graph a fuzz generator builds (gen.py draws the graph, ops.py one op kind each): values with
their bounds, the ops emitted so far, and the size and range limits every op respects.

Values stay in a safe range: each value carries a bound on |value| and a lower bound when it is
known positive. An op whose result bound would pass the dtype's limit is not taken (no exp
overflow), and divisors are values known to be >= 0.25 (no division by ~0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DIMS = (1, 3, 2, 7, 5, 8, 13, 16, 17, 32)  # 1 first (the shrink target), odd sizes, one vector and one
# past it, and 32: the CPU matmul/conv micro-kernels only fire on multiples of their tile
DTYPES = ("float32", "float16")
LIMIT = {"float32": 1e4, "float16": 2e2}  # largest |value| a graph may produce, per dtype
MAX_ELEMS = 1024  # per tensor: keeps 3 builds + runs per graph well under a second

UNARY = ("exp", "tanh", "sigmoid", "relu", "negative", "abs", "sqrt_abs")
BINARY = ("add", "multiply", "subtract", "maximum", "minimum", "divide")
LAYOUT = ("reshape", "permute_dims", "expand_dims", "squeeze", "strided_slice", "concat", "pad")
REDUCE = ("sum", "mean", "max", "min", "softmax", "layer_norm_decomposed", "layer_norm")
OTHER = ("matmul", "conv2d", "astype", "attention", "anchor_slices")  # attention: a composite (matmul,
# softmax, matmul); anchor_slices: two slices of one matmul's output combined (SwiGLU, Winograd)
SIZED_OPS = frozenset({"reshape", "strided_slice", "conv2d", "pad"})  # attributes that name sizes: no symbolic dims
KINDS = BINARY[:1] + UNARY + BINARY[1:] + LAYOUT + REDUCE + OTHER  # "add" first: the shrink target
ALL_OPS = sorted({"add", "subtract", "multiply", "divide", "maximum", "minimum", "exp", "tanh", "sigmoid",
                  "relu", "negative", "abs", "sqrt", "rsqrt", "astype", "reshape", "permute_dims",
                  "expand_dims", "squeeze", "strided_slice", "concat", "pad", "sum", "mean", "max", "min",
                  "softmax", "layer_norm", "matmul", "conv2d"})


@dataclass
class Val:
    name: str
    shape: tuple
    dtype: str
    bound: float  # |value| <= bound
    lo: float = 0.0  # value >= lo > 0 when known positive, else 0


class _Reject(Exception):
    """The drawn op does not fit the drawn operand; the generator draws again."""


class Graph:
    def __init__(self, src, dtype: str, max_elems: int = MAX_ELEMS):
        self.src, self.dtype, self.max_elems = src, dtype, max_elems  # elements per new input (x4 per result)
        self.inputs, self.ops, self.vals = [], [], []

    # ------------------------------------------------------------------ choices
    def pick(self, seq):
        if not seq:
            raise _Reject("nothing to pick")
        return seq[self.src.int(0, len(seq) - 1)]

    def flag(self) -> bool:
        return self.src.int(0, 1) == 1

    def shape(self, rank=None):
        rank = self.src.int(1, 4) if rank is None else rank
        dims, n = [], 1
        for _ in range(rank):
            d = self.pick(DIMS)
            d = d if n * d <= self.max_elems else 1
            dims.append(d)
            n *= d
        return tuple(dims)

    # ------------------------------------------------------------------ values
    def new_input(self, shape, dtype=None, positive=False) -> Val:
        v = Val(f"x{len(self.inputs)}", tuple(shape), dtype or self.dtype, 2.0, 0.5 if positive else 0.0)
        self.inputs.append({"name": v.name, "shape": list(v.shape), "dtype": v.dtype,
                            "kind": "positive" if positive else "normal"})
        self.vals.append(v)
        return v

    def emit(self, op, args, out_shape, bound, lo=0.0, out_dtype=None, **attrs) -> Val:
        dtype = out_dtype or next(a.dtype for a in args if isinstance(a, Val))
        if not bound <= LIMIT[dtype] or int(np.prod(out_shape, dtype=np.int64)) > 4 * self.max_elems:
            raise _Reject(f"{op}: result out of range")
        v = Val(f"v{len(self.ops)}", tuple(int(s) for s in out_shape), dtype, float(bound), float(lo))
        self.ops.append({"name": v.name, "op": op,
                         "args": [a.name if isinstance(a, Val) else a for a in args], "attrs": attrs})
        self.vals.append(v)
        return v

    def operand(self, pred=lambda v: True) -> Val:
        return self.pick([v for v in self.vals if pred(v)])

    def spec(self, extra_outputs: list) -> dict:
        used = {a for o in self.ops for a in o["args"] if isinstance(a, str)}
        leaves = [o["name"] for o in self.ops if o["name"] not in used]
        outs = leaves + [n for n in extra_outputs if n not in leaves]
        return {"inputs": self.inputs, "ops": self.ops, "outputs": outs}


def broadcast_shape(a, b):
    return tuple(int(s) for s in np.broadcast_shapes(tuple(a), tuple(b)))


def exp_bound(b):
    return math.exp(min(b, 700.0))
