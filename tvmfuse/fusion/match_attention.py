"""Recognize attention in one dataflow block: O = softmax(Q·Kᵀ (·scale) (+mask) , axis=-1)·V.

Contract: `find(g)` takes a BlockGraph (graph.py) and returns (matches, misses). A match is the set
of nodes that together compute one attention, whatever its spelling:
  - the score matmul as a 4-D batch matmul (the zoo, ONNX) or a 3-D one between reshapes and
    identity broadcast_to's (torch.export of transformers' eager attention);
  - Kᵀ as permute_dims of K (absorbed, so the kernel reads K row by row) or any [.., D, Sk] tensor;
  - then, in any order, a scale (multiply or divide by a scalar), an additive mask (any tensor
    that broadcasts to the scores) or a `where(cond, scores, fill)` with a scalar fill;
  - softmax over the last axis;
  - the matmul with V (P possibly reshaped/broadcast first), and reshapes of its result;
  - K and V repeated for grouped-query attention (transformers' repeat_kv: expand_dims,
    broadcast_to, reshape), absorbed: the kernel reads key/value head h // R for query head h.
Every value inside the match is used only inside it (the score matrix is never written); tensors
are float32, and their dims constants or bare symbolic variables (a symbolic batch or sequence:
extents compare by provable equality, relax_utils.SymDim; the kernel binds the variables from its
buffers' shapes). Anything else is not a match: near misses come back in `misses` with
their reason and are logged on `tvmfuse.fusion`; their ops stay on the ordinary fusion path.

A match becomes one group (legality.py lets it hold two anchors and a reduction: the flash
attention rule); FuseGroupsTE lowers it through the ops' own TE (the reference semantics) and
stamps `tvmfuse.attention` with `spec(...)`, from which the schedule rules write one kernel with an
online softmax (schedules/cpu/attention.py, schedules/cuda/attention.py).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

import tvm
from tvm import relax

from schedules.attention import SPEC_ATTR  # the rules read what this module writes

from ..relax_utils import SymDim, dims, static_shape

log = logging.getLogger("tvmfuse.fusion")



@dataclass
class AttentionMatch:
    members: set  # node idx
    q: relax.Expr  # [.., Sq, D]
    k: relax.Expr  # [.., Sk, D], or [.., D, Sk] when k_transposed
    v: relax.Expr  # [.., Sk, Dv]
    out: relax.Var  # [.., Sq, Dv]
    k_transposed: bool
    steps: list = field(default_factory=list)  # score ops in order: (kind, *exprs); kind in mul/div/add/where
    score_shape: tuple = ()  # the scores' shape where the steps apply (masks broadcast against it)
    heads: dict = field(default_factory=dict)  # "q"/"k"/"v"/"out" -> H where that tensor is [B, S, H*D]
    repeat: dict = field(default_factory=dict)  # "k"/"v" -> R where R query heads share each of its heads


def _const_scalar(expr):
    """A float from a scalar constant, else None."""
    if isinstance(expr, tvm.ir.expr.Constant):
        a = expr.value.numpy()
        if a.size == 1:
            return float(a.reshape(()))
    return None


def _is_scalar(expr) -> bool:
    shape = static_shape(expr.ty) if isinstance(expr.ty, relax.TensorType) else None
    return shape is not None and math.prod(shape) == 1


class _Walk:
    def __init__(self, g):
        self.g = g

    def node(self, expr):
        return self.g.node_of_var.get(expr) if isinstance(expr, relax.Var) else None

    def private(self, n) -> bool:
        """n's value is read by exactly one op and is no output of the block."""
        return len(self.g.users[n.idx]) == 1 and not self.g.external_uses[n.idx] and not n.aliases

    def heads_split(self, expr, members, perm):
        """`expr` = permute_dims(reshape(x, [B, S, H, D]), perm), both single-use, x [B, S, H*D]: the
        head split of every transformer. Absorbs both; -> (x, H). Else (expr, None)."""
        p = self.node(expr)
        if p is None or p.op != "permute_dims" or not self.private(p) or p.dims is None or len(p.dims) != 4:
            return expr, None
        if p.call.attrs.axes is None or [int(a) for a in p.call.attrs.axes] != perm:
            return expr, None
        r = self.node(p.call.args[0])
        if r is None or r.op != "reshape" or not self.private(r):
            return expr, None
        x = r.call.args[0]
        xs, (b, s, h, d) = dims(x.ty), r.dims
        if xs is None or not isinstance(h, int) or not isinstance(d, int) or tuple(xs) != (b, s, h * d):
            return expr, None
        members |= {p.idx, r.idx}
        return x, h

    def reaches_matmul(self, expr, depth: int = 6) -> bool:
        """`expr` comes from a matmul through single-use score steps (the scores' side of an add)."""
        n = self.node(expr)
        if n is None or depth == 0 or not self.private(n):
            return False
        if n.op == "matmul":
            return True
        if n.op in ("reshape", "multiply", "divide", "add", "where"):
            return any(self.reaches_matmul(a, depth - 1) for a in n.call.args)
        return False

    def repeat_kv(self, expr, members):
        """`expr` = reshape(broadcast_to(expand_dims(x, 2), [B, G, R, S, D]), [B, G*R, S, D]), each
        single-use: transformers' `repeat_kv`, grouped-query attention's R query heads per key/value
        head. Absorbs the three; -> (x, R). Else (expr, 1). The kernel reads head h of Q against
        head h // R of x: the repeated tensor is never made."""
        r = self.node(expr)
        if r is None or r.op != "reshape" or not self.private(r) or r.dims is None or len(r.dims) != 4:
            return expr, 1
        bc = self.node(r.call.args[0])
        if bc is None or bc.op != "broadcast_to" or not self.private(bc) or bc.dims is None or len(bc.dims) != 5:
            return expr, 1
        ex = self.node(bc.call.args[0])
        if ex is None or ex.op != "expand_dims" or not self.private(ex) or \
                [int(a) for a in ex.call.attrs.axis] != [2]:
            return expr, 1
        x = ex.call.args[0]
        b, g, rep, s, d = bc.dims
        if not all(isinstance(n, int) for n in (g, rep, d)) or dims(x.ty) is None or \
                tuple(dims(x.ty)) != (b, g, s, d) or tuple(r.dims) != (b, g * rep, s, d):
            return expr, 1
        members |= {r.idx, bc.idx, ex.idx}
        return x, rep

    def see_through(self, expr, members):
        """Up through single-use reshapes and identity broadcast_to's (views in the torch spelling),
        stopping at a grouped-query repeat (`repeat_kv`)."""
        while True:
            n = self.node(expr)
            if n is None or not self.private(n) or n.op not in ("reshape", "broadcast_to"):
                return expr
            if self.repeat_kv(expr, set())[1] > 1:
                return expr
            src = n.call.args[0]
            if n.op == "broadcast_to" and dims(src.ty) != n.dims:
                return expr  # a real broadcast (grouped-query heads): not a view
            members.add(n.idx)
            expr = src


def _match(g, sm):
    """(AttentionMatch, None) or (None, reason) for the softmax node `sm`: back from the softmax to
    the score matmul (_scores), forward to the matmul with V (_probabilities), then Q, K, V and the
    output through their views and head splits (_operands)."""
    why = _softmax_refusal(sm)
    if why:
        return None, why
    w, members = _Walk(g), {sm.idx}
    got, why = _scores(w, sm, members)
    if got is None:
        return None, why
    score, steps, score_shape = got
    got, why = _probabilities(w, g, sm, members)
    if got is None:
        return None, why
    pv, out = got
    q, k, v, out, k_transposed, heads, repeat = _operands(w, g, score, pv, out, members)
    for e in [q, k, v] + [x for step in steps for x in step[1:]]:  # operands come from outside
        n = w.node(e)
        if n is not None and n.idx in members:
            return None, f"{n.name} ({n.op}) is both inside the attention and one of its operands"
    m = AttentionMatch(members, q, k, v, out.var, k_transposed, steps, tuple(score_shape), heads, repeat)
    why = _check_shapes(m)
    return (None, why) if why else (m, None)


def _softmax_refusal(sm) -> str | None:
    """Why the softmax `sm` cannot be an attention's (None: it can)."""
    shape = sm.dims
    if shape is None or len(shape) < 2:
        return "softmax without a known shape of rank >= 2"
    axis = int(sm.call.attrs.axis)
    if axis % len(shape) != len(shape) - 1:
        return f"softmax over axis {axis}, not the key axis (the last)"
    if sm.var.ty.dtype != "float32":
        return f"softmax in {sm.var.ty.dtype}: the attention kernel is float32"
    return None


def _scores(w, sm, members):
    """Back from the softmax to the score matmul: ((score matmul node, steps on the scores in the
    order they apply, the scores' shape), None) or (None, reason). Adds what it passes to `members`."""
    steps, cur, score_shape = [], sm.call.args[0], sm.dims
    while True:
        p = w.node(cur)
        if p is None:
            return None, "the softmax input is not computed in this block"
        if not w.private(p):
            return None, f"{p.name} ({p.op}) is also used outside the attention (the scores would be written)"
        members.add(p.idx)
        args = p.call.args
        masked = any(s[0] in ("add", "where") for s in steps)
        if p.op == "matmul":
            steps.reverse()  # in the order they apply to the scores
            return (p, steps, score_shape), None
        if p.op == "reshape":
            cur = args[0]
        elif p.op in ("multiply", "divide") and _is_scalar(args[1]):
            steps.append(("mul" if p.op == "multiply" else "div", args[1]))
            cur = args[0]
        elif p.op == "multiply" and _is_scalar(args[0]):
            steps.append(("mul", args[0]))
            cur = args[1]
        elif p.op == "add" and not masked:
            on_left = w.reaches_matmul(args[0]) or not w.reaches_matmul(args[1])
            scores, mask = (args[0], args[1]) if on_left else (args[1], args[0])
            if dims(scores.ty) != p.dims:
                return None, f"{p.name} (add) broadcasts the scores"
            steps.append(("add", mask))
            score_shape, cur = p.dims, scores
        elif p.op == "where" and not masked and _is_scalar(args[2]):
            if dims(args[1].ty) != p.dims:
                return None, f"{p.name} (where) broadcasts the scores"
            steps.append(("where", args[0], args[2]))
            score_shape, cur = p.dims, args[1]
        else:
            return None, f"{p.name} ({p.op}) between the score matmul and the softmax"


def _probabilities(w, g, sm, members):
    """Forward from the softmax to the matmul with V, then through the reshapes of its result
    (torch's 3-D batch matmul back to 4-D): ((the P @ V node, the output node), None) or (None,
    reason). Adds what it passes to `members`."""
    cur = sm
    while True:
        if not w.private(cur):
            return None, f"{cur.name} ({cur.op}) is also used outside the attention (the probabilities would be written)"
        u = g.by_idx[next(iter(g.users[cur.idx]))]
        if u.op in ("reshape", "broadcast_to") and (u.op == "reshape" or dims(u.call.args[0].ty) == u.dims):
            members.add(u.idx)
            cur = u
            continue
        if u.op == "matmul" and u.call.args[0].same_as(cur.var):
            pv = u
            break
        return None, f"the probabilities go to {u.name} ({u.op}), not to a matmul with V"
    members.add(pv.idx)
    out = pv
    while w.private(out):
        u = g.by_idx[next(iter(g.users[out.idx]))]
        if u.op != "reshape":
            break
        members.add(u.idx)
        out = u
    return (pv, out), None


def _operands(w, g, score, pv, out, members):
    """Q, K and V up through their views, head splits and grouped-query repeats, and the output
    through the merge of the heads: (q, k, v, out, k_transposed, heads, repeat)."""
    heads = {}
    q = w.see_through(score.call.args[0], members)
    q, heads["q"] = w.heads_split(q, members, [0, 2, 1, 3])
    kt = w.see_through(score.call.args[1], members)
    repeat = {}
    v, repeat["v"] = w.repeat_kv(w.see_through(pv.call.args[1], members), members)
    v, heads["v"] = w.heads_split(v, members, [0, 2, 1, 3])
    k, heads["k"] = w.heads_split(kt, members, [0, 2, 3, 1])  # ONNX: one transpose to Kᵀ
    k_transposed = heads["k"] is None
    kn = w.node(kt)
    repeat["k"] = 1
    if k_transposed and kn is not None and kn.op == "permute_dims" and w.private(kn):
        rank = len(kn.dims)
        axes = [int(a) for a in kn.call.attrs.axes] if kn.call.attrs.axes is not None else None
        if axes == list(range(rank - 2)) + [rank - 1, rank - 2]:
            members.add(kn.idx)
            k, k_transposed = w.see_through(kn.call.args[0], members), False
            k, repeat["k"] = w.repeat_kv(k, members)
            k, heads["k"] = w.heads_split(k, members, [0, 2, 1, 3])
    out, heads["out"] = _merged_heads(w, g, out, members)
    heads = {k_: h for k_, h in heads.items() if h is not None}
    repeat = {k_: r for k_, r in repeat.items() if r > 1}
    return q, k, v, out, k_transposed, heads, repeat


def _merged_heads(w, g, out, members):
    """(the reshape node, heads) when the [B, H, S, D] output is merged back to [B, S, H*D] by a
    private permute_dims + reshape (absorbed into `members`); else (out, None)."""
    if not (w.private(out) and out.dims is not None and len(out.dims) == 4):
        return out, None
    p = g.by_idx[next(iter(g.users[out.idx]))]
    if p.op == "permute_dims" and p.call.attrs.axes is not None and \
            [int(a) for a in p.call.attrs.axes] == [0, 2, 1, 3] and w.private(p):
        r = g.by_idx[next(iter(g.users[p.idx]))]
        b, h, s, d = out.dims
        if r.op == "reshape" and isinstance(h, int) and isinstance(d, int) and tuple(r.dims or ()) == (b, s, h * d):
            members |= {p.idx, r.idx}
            return r, h
    return out, None


def _prod(ds):
    """The product of dims (ints and SymDims): an int when all are static, else a SymDim."""
    out = 1
    for d in ds:
        out = out * (d.expr if isinstance(d, SymDim) else d)
    return out if isinstance(out, int) else SymDim(out)


def _check_shapes(m: AttentionMatch):
    shapes = {name: dims(e.ty) if isinstance(e.ty, relax.TensorType) else None
              for name, e in (("Q", m.q), ("K", m.k), ("V", m.v), ("O", m.out))}
    for name, s in shapes.items():
        if s is None or not 2 <= len(s) <= 4:
            return f"{name} has no known shape of rank 2 to 4"
    for name, e in (("Q", m.q), ("K", m.k), ("V", m.v)):
        if e.ty.dtype != "float32":
            return f"{name} is {e.ty.dtype}: the attention kernel is float32"
    for name, key in (("Q", "q"), ("K", "k"), ("V", "v"), ("O", "out")):
        if key in m.heads:  # [B, S, H*D] -> the [B, H, S, D] it stands for
            b, s, e = shapes[name]
            h = m.heads[key]
            shapes[name] = (b, h, e // h, s) if key == "k" and m.k_transposed else (b, h, s, e // h)
    (Q, K, V, O) = (shapes[n] for n in "QKVO")
    sq, d = Q[-2:]
    sk, dk = (K[-1], K[-2]) if m.k_transposed else (K[-2], K[-1])
    if not isinstance(d, int) or not isinstance(V[-1], int):
        return f"a symbolic head dim: Q {list(Q)}, V {list(V)} (the kernel keeps a row of D in registers)"
    if dk != d or V[-2] != sk or tuple(O[-2:]) != (sq, V[-1]):
        return f"shapes do not chain: Q {list(Q)}, K {list(K)}, V {list(V)}, O {list(O)}"
    heads = {n: _prod(s[:-2]) for n, s in shapes.items()}
    for name, key in (("K", "k"), ("V", "v")):  # grouped-query: R query heads per K/V head
        if key in m.repeat:
            lead = list(shapes[name][:-2])
            heads[name] = _prod(lead[:-1] + [lead[-1] * m.repeat[key]]) if lead else None
    if any(h != heads["Q"] for h in heads.values()):
        return f"batch x heads differ: {heads} (only transformers' repeat_kv broadcasts heads)"
    if tuple(m.score_shape[-2:]) != (sq, sk) or _prod(m.score_shape[:-2]) != heads["Q"]:
        return f"the masked scores {list(m.score_shape)} are not [.., {sq}, {sk}]"
    for step in m.steps:
        for e in step[1:]:
            s = dims(e.ty) if isinstance(e.ty, relax.TensorType) else None
            if s is None or len(s) > len(m.score_shape) or any(
                    a not in (1, b) for a, b in zip(s[::-1], m.score_shape[::-1])):
                return f"a {step[0]} operand of shape {s} does not broadcast to the scores {list(m.score_shape)}"
    return None


def find(g):
    """(matches, misses): the attentions of the block, and why each other softmax is not one."""
    matches, misses, used = [], [], set()
    for n in g.nodes:
        if n.op != "nn.softmax":
            continue
        m, why = _match(g, n)
        if m is not None and m.members & used:
            m, why = None, "overlaps another attention"
        if m is None:
            misses.append((n.name, why))
            log.info("softmax %s is not fused as attention: %s", n.name, why)
            continue
        used |= m.members
        matches.append(m)
    return matches, misses


def _json_dim(d):
    """A dim in the spec: an int, the name of its symbolic variable, or the text of a compound
    extent (`n + 3`); schedules/attention.read_spec maps them onto the kernel's parameters."""
    if isinstance(d, int):
        return d
    return str(d.expr.name) if isinstance(d.expr, tvm.tirx.Var) else str(d.expr)


def spec(m: AttentionMatch, sources: list, out_shape) -> str:
    """The `tvmfuse.attention` attribute of the group's PrimFunc: which parameter is which (by
    position; `sources` are the Relax exprs of its inputs, in order) and the score steps."""
    def ref(expr):
        value = _const_scalar(expr)
        for i, s in enumerate(sources):
            if s.same_as(expr):
                return {"param": i, "value": value}
        if value is not None:  # a scalar constant TE folded into the compute: no parameter
            return {"param": None, "value": value}
        raise ValueError(f"attention operand {expr} is no input of the group")

    shape = lambda e: [_json_dim(x) for x in dims(e.ty)]
    return json.dumps({
        "q": ref(m.q)["param"], "k": ref(m.k)["param"], "v": ref(m.v)["param"],
        "q_shape": shape(m.q), "k_shape": shape(m.k), "v_shape": shape(m.v), "out_shape": [_json_dim(x) for x in out_shape],
        "k_transposed": m.k_transposed, "score_shape": [_json_dim(x) for x in m.score_shape], "heads": m.heads, "repeat": m.repeat,
        "steps": [[kind] + [dict(ref(e), shape=shape(e)) for e in exprs] for kind, *exprs in m.steps],
    })
