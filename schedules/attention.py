"""What the attention kernels share: reading the `tvmfuse.attention` spec of a fused group and
writing TVMScript index expressions for its tensors.

The spec (tvmfuse/fusion/match_attention.py `spec`) says which parameter of the group's PrimFunc is
Q, K, V and each mask operand, in which layout, and the score steps in order. The kernels iterate
over `bh` (batch x heads, flattened), query row `i` and key `j`; a tensor is read either in its
own [.., S, D] layout (leading dims unravelled from bh) or as [B, S, H*D] (`heads`: the head split
a transformer does with reshape + permute, absorbed into the kernel's indexing).
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass

SPEC_ATTR = "tvmfuse.attention"
# "minus infinity" that stays finite through exp(x - max): float32's lowest value, at or below any
# mask fill (transformers fill with finfo(float32).min), so a fully masked row still has a max
NEG = "T.min_value(\"float32\")"


def mul(a, b):
    """a * b for extents: ints, or TVMScript expressions of the kernel's symbolic variables."""
    return a * b if isinstance(a, int) and isinstance(b, int) else f"({a} * {b})"


def cdiv(a, b: int):
    """ceil(a / b) for an extent a and a constant b."""
    return -(-a // b) if isinstance(a, int) else f"(({a} + {b - 1}) // {b})"


def minus1(a):
    return a - 1 if isinstance(a, int) else f"({a} - 1)"


@dataclass
class Spec:
    """A fused attention's spec with its PrimFunc's parameters. Extents are ints, or the names of
    the kernel's symbolic variables (`sym0`, ...) where the group has a symbolic batch or sequence:
    the kernel declares them and binds them from its buffers' shapes (`preamble`)."""
    raw: dict
    params: list  # [(name, shape, dtype)] of the PrimFunc, inputs then the output
    symbols: tuple = ()  # the symbolic variables' names in the kernel, in order

    @property
    def bh(self):
        out = 1
        for n in self.logical("q")[:-2]:
            out = mul(out, n)
        return out

    @property
    def sq(self):
        return self.logical("q")[-2]

    @property
    def sk(self):
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

    def flops(self):
        """The kernel's FLOPs; None when an extent is symbolic."""
        ext = (self.bh, self.sq, self.sk)
        return 2 * self.bh * self.sq * self.sk * (self.d + self.dv) if all(isinstance(x, int) for x in ext) else None


def read_spec(func):
    """The Spec of a fused attention PrimFunc, or None when it is not one (or an extent is not
    expressible in the kernel's variables).

    Symbolic variables get kernel names (`sym0`, ...). A variable that some buffer has as a bare
    dim is declared in the kernel and bound from that buffer (`preamble`); one that appears only
    in compound dims (`n + 3` after a concat) is a scalar parameter of the PrimFunc, as
    fuse_groups_te passes it. A compound extent becomes TVMScript text over the kernel names."""
    import tvm
    from tvm.sym import Analyzer

    text = func.attrs.get(SPEC_ATTR) if func.attrs else None
    if text is None:
        return None
    alias, params, texts, scalars = {}, [], {}, set()
    for p in func.params:  # scalar parameters first: their names are fixed by the signature
        if getattr(p, "shape", None) is None:
            scalars.add(alias.setdefault(p.name, f"sym{len(alias)}"))

    def extent(x):
        if isinstance(x, tvm.tirx.IntImm):
            return int(x)
        if isinstance(x, tvm.tirx.Var):
            return alias.setdefault(x.name, f"sym{len(alias)}")
        free = tvm.tirx.analysis.undefined_vars(x)
        if not all(v.name in alias for v in free):
            return None
        names = {v.name: alias[v.name] for v in free}  # identifiers: renamed in the printed text
        pattern = r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")(?!\w)"
        out = f"({re.sub(pattern, lambda m: names[m.group(1)], str(x))})"
        texts[str(Analyzer().simplify(x))] = out  # the spec writes SymDim's simplified form
        return out

    buffers = [p for p in func.params if getattr(p, "shape", None) is not None]
    for p in buffers:  # bare variables first: compound dims are written over their names
        for x in p.shape:
            if isinstance(x, tvm.tirx.Var):
                extent(x)
    for i, p in enumerate(func.params):  # TVM 0.27: a buffer parameter is its buffer
        if getattr(p, "shape", None) is None:
            params.append((alias[p.name], None, str(p.ty.dtype)))
            continue
        shape = tuple(extent(x) for x in p.shape)
        if any(x is None for x in shape):
            return None
        params.append((f"p{i}", shape, str(p.dtype)))
    raw = json.loads(str(text))

    def mapped(shape):
        return [x if isinstance(x, int) else alias[x] if x in alias else texts[x] for x in shape]

    try:
        for key in ("q_shape", "k_shape", "v_shape", "out_shape", "score_shape"):
            raw[key] = mapped(raw[key])
        for step in raw["steps"]:
            for ref in step[1:]:
                ref["shape"] = mapped(ref["shape"])
    except KeyError:  # an extent no buffer or parameter binds
        return None
    symbols = tuple(v for v in alias.values() if v not in scalars)
    return Spec(raw, params, symbols)


def _unravel(bh: str, lead: tuple) -> list[str]:
    """Index expressions of the leading dims `lead` (product = BH) for the flat head index `bh`."""
    out, stride = [], 1
    for n in reversed(lead):
        out.append("0" if n == 1 else f"({bh}) // {stride} % {n}" if stride != 1 else f"({bh}) % {n}")
        stride = mul(stride, n)
    return list(reversed(out))


def index(spec: Spec, role: str, bh: str, row: str, col: str) -> str:
    """`name[...]` of element (row, col) of head bh of Q/K/V/out. For K, (row, col) = (key, d)
    whatever its layout."""
    name, shape = spec.name(role), spec.raw["out_shape" if role == "out" else f"{role}_shape"]
    rep = spec.raw.get("repeat", {}).get(role, 1)
    if rep > 1:  # grouped-query: R query heads per K/V head (H = G * R, so bh // R = b * G + h // R)
        bh = f"({bh}) // {rep}"
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
    if all(isinstance(n, int) for n in shape) and math.prod(shape) == 1:
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
    """The PrimFunc of a kernel's TVMScript, with its FLOPs stamped when static (the roofline reads
    them)."""
    func = _parse(source)
    flops = spec.flops()
    return func if flops is None else func.with_attr("tvmfuse.flops", flops)


@functools.lru_cache(maxsize=64)
def _parse(source: str):
    """Parsed once per distinct source (BERT-base's 12 layers share one; PrimFuncs are immutable)."""
    import tvm

    return tvm.script.from_source(source)


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(x) for x in shape) + ("," if len(shape) == 1 else "") + ")"


def signature(spec: Spec) -> str:
    """The kernel's parameters: a buffer per static tensor, a handle per symbolic one."""
    return ", ".join(f"{n}: T.{d}" if s is None
                     else f'{n}: T.Buffer({_shape_text(s)}, "{d}")' if all(isinstance(x, int) for x in s)
                     else f"{n}_h: T.handle" for n, s, d in spec.params)


def preamble(spec: Spec, indent: str = "    ") -> str:
    """The symbolic variables declared and bound from the symbolic tensors' shapes ('' when static)."""
    lines = [f"{v} = T.int32()" for v in spec.symbols]
    lines += [f'{n} = T.match_buffer({n}_h, {_shape_text(s)}, "{d}")'
              for n, s, d in spec.params if s is not None and not all(isinstance(x, int) for x in s)]
    return "".join(f"{indent}{line}\n" for line in lines)
