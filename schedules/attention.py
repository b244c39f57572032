"""What the attention kernels share: reading the `tvmfuse.attention` spec of a fused group and
writing TVMScript index expressions for its tensors.

The spec (tvmfuse/passes/match_attention.py `spec`) says which parameter of the group's PrimFunc is
Q, K, V and each mask operand, in which layout, and the score steps in order. The kernels iterate
over `bh` (batch x heads, flattened), query row `i` and key `j`; a tensor is read either in its
own [.., S, D] layout (leading dims unravelled from bh) or as [B, S, H*D] (`heads`: the head split
a transformer does with reshape + permute, absorbed into the kernel's indexing).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

SPEC_ATTR = "tvmfuse.attention"
# "minus infinity" that stays finite through exp(x - max): float32's lowest value, at or below any
# mask fill (transformers fill with finfo(float32).min), so a fully masked row still has a max
NEG = "T.min_value(\"float32\")"


@dataclass
class Spec:
    raw: dict
    params: list  # [(name, shape, dtype)] of the PrimFunc, inputs then the output

    @property
    def bh(self) -> int:
        return math.prod(self.logical("q")[:-2])

    @property
    def sq(self) -> int:
        return self.logical("q")[-2]

    @property
    def sk(self) -> int:
        k = self.logical("k")
        return k[-1] if self.raw["k_transposed"] else k[-2]

    @property
    def d(self) -> int:
        return self.logical("q")[-1]

    @property
    def dv(self) -> int:
        return self.logical("v")[-1]

    def logical(self, role: str) -> tuple:
        """The [.., S, D] shape a tensor stands for (a [B, S, H*D] one as [B, H, S, D])."""
        shape = self.raw["out_shape" if role == "out" else f"{role}_shape"]
        h = self.raw["heads"].get(role)
        if h is None:
            return tuple(shape)
        b, s, e = shape
        return (b, h, s, e // h)

    def name(self, role: str) -> str:
        idx = len(self.params) - 1 if role == "out" else self.raw[role]
        return self.params[idx][0]

    def flops(self) -> int:
        return 2 * self.bh * self.sq * self.sk * (self.d + self.dv)


def read_spec(func):
    """The Spec of a fused attention PrimFunc, or None when it is not one."""
    text = func.attrs.get(SPEC_ATTR) if func.attrs else None
    if text is None:
        return None
    params = []
    for i, p in enumerate(func.params):
        buf = p  # TVM 0.27: a PrimFunc parameter is its buffer
        params.append((f"p{i}", tuple(int(x) for x in buf.shape), str(buf.dtype)))
    return Spec(json.loads(str(text)), params)


def _unravel(bh: str, lead: tuple) -> list[str]:
    """Index expressions of the leading dims `lead` (product = BH) for the flat head index `bh`."""
    out, stride = [], 1
    for n in reversed(lead):
        out.append("0" if n == 1 else f"({bh}) // {stride} % {n}" if stride > 1 else f"({bh}) % {n}")
        stride *= n
    return list(reversed(out))


def index(spec: Spec, role: str, bh: str, row: str, col: str) -> str:
    """`name[...]` of element (row, col) of head bh of Q/K/V/out. For K, (row, col) = (key, d)
    whatever its layout."""
    name, shape = spec.name(role), spec.raw["out_shape" if role == "out" else f"{role}_shape"]
    h = spec.raw["heads"].get(role)
    if h is not None:  # [B, S, H*D]
        d = shape[2] // h
        return f"{name}[({bh}) // {h}, {row}, ({bh}) % {h} * {d} + {col}]"
    lead = _unravel(bh, tuple(shape[:-2]))
    if role == "k" and spec.raw["k_transposed"]:
        row, col = col, row
    return f"{name}[{', '.join(lead + [row, col])}]"


def operand(spec: Spec, ref: dict, bh: str, i: str, j: str) -> str:
    """A score-step operand at score (bh, i, j): a scalar literal, or the tensor broadcast."""
    if ref["param"] is None:
        return _literal(ref["value"])
    name, shape = spec.params[ref["param"]][0], tuple(ref["shape"])
    if math.prod(shape) == 1:
        return f"{name}[{', '.join('0' for _ in shape)}]" if shape else f"{name}[()]"
    ss = tuple(spec.raw["score_shape"])
    coords = _unravel(bh, ss[:-2]) + [i, j]
    tail = coords[len(coords) - len(shape):]
    return f"{name}[{', '.join('0' if n == 1 else c for n, c in zip(shape, tail))}]"


def _literal(value: float) -> str:
    """A float32 literal TVMScript parses, infinities and NaN included."""
    if math.isnan(value):
        return 'T.reinterpret("float32", T.uint32(0x7FC00000))'
    if math.isinf(value):
        return ("" if value > 0 else "-") + 'T.infinity("float32")'
    return f"T.float32({value!r})"


def steps(spec: Spec, value: str, bh: str, i: str, j: str) -> str:
    """The score steps (scale, mask, where) applied, in order, to the expression `value`."""
    for kind, *refs in spec.raw["steps"]:
        a = operand(spec, refs[0], bh, i, j)
        if kind == "mul":
            value = f"({value}) * {a}"
        elif kind == "div":
            value = f"({value}) / {a}"
        elif kind == "add":
            value = f"({value}) + {a}"
        elif kind == "where":
            fill = operand(spec, refs[1], bh, i, j)
            value = f"T.if_then_else({a}, {value}, {fill})"
        else:  # pragma: no cover - match_attention emits only these
            raise ValueError(f"unknown attention step {kind}")
    return value


def kernel(source: str, spec: Spec):
    """The PrimFunc of a kernel's TVMScript, with its FLOPs stamped (the roofline reads them)."""
    return _parse(source).with_attr("tvmfuse.flops", spec.flops())


@functools.lru_cache(maxsize=64)
def _parse(source: str):
    """Parsed once per distinct source (BERT-base's 12 layers share one; PrimFuncs are immutable)."""
    import tvm

    return tvm.script.from_source(source)


def signature(spec: Spec) -> str:
    return ", ".join(f'{n}: T.Buffer({tuple(s)!r}, "{d}")' for n, s, d in spec.params)
