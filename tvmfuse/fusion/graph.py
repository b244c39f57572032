"""The dataflow graph of one Relax dataflow block, as fusion sees it.

A node is an op binding (its class from tvmfuse.classify); a TupleGetItem of a node's tuple is an
alias of that node. Other bindings (tuples built for outputs, ...) are external users.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import relax

from .classify import COMPUTE, REDUCTION, classify_call
from ..relax_utils import dims, planning_bytes, static_shape


@dataclass
class Node:
    idx: int  # position in the block
    var: relax.Var
    call: relax.Call
    cls: str
    reason: str
    aliases: list = field(default_factory=list)  # TupleGetItem bindings of this node's tuple
    alias_pos: list = field(default_factory=list)  # their positions in the block
    escapes: bool = False  # the tuple value itself is used by a non-TupleGetItem

    def positions(self):
        """Block positions of the node's own binding and its TupleGetItem aliases."""
        return [self.idx] + self.alias_pos

    @property
    def name(self):
        return self.var.name

    @property
    def op(self):
        return self.call.op.name.replace("relax.", "")

    @property
    def shape(self):
        """The static shape (ints), None when any dim is symbolic (what shape arithmetic needs)."""
        return static_shape(self._ty())

    @property
    def dims(self):
        """The shape as ints and SymDims (relax_utils): what legality compares, symbolic or not."""
        return dims(self._ty())

    def _ty(self):
        ty = self.var.ty
        return ty.fields[0] if isinstance(ty, relax.TupleType) else ty

    def row_space(self):
        """For a reduction: (kept leading dims, True) when it reduces trailing axes; else
        (input shape, False): it may then only fuse with ops of exactly that input shape."""
        if self.cls != REDUCTION:
            return None
        in_shape = dims(self.call.args[0].ty)
        if in_shape is None:
            return None
        n = len(in_shape)
        axes = self._reduced_axes(in_shape)
        if axes is None:
            return None
        if axes == list(range(n - len(axes), n)):
            return tuple(in_shape[: n - len(axes)]), True
        return tuple(in_shape), False


    def reduced_axes(self):
        """For a reduction: the input axes it folds (sorted), None when they cannot be told."""
        in_shape = dims(self.call.args[0].ty) if self.cls == REDUCTION else None
        return None if in_shape is None else self._reduced_axes(in_shape)

    def _reduced_axes(self, in_shape):
        """The input axes the reduction folds (sorted), None when they cannot be told. An `axis`
        or `axes` attribute names them (none: all); collapse_sum_to / collapse_sum_like fold the
        leading axes the target lacks and those where the target has 1 (broadcasting's inverse)."""
        n = len(in_shape)
        if self.op in ("collapse_sum_to", "collapse_sum_like"):
            out = dims(self._ty())
            if out is None:
                return None
            lead = n - len(out)
            return [i for i in range(n) if i < lead or (out[i - lead] == 1 and in_shape[i] != 1)]
        attrs = self.call.attrs
        axes = None
        for key in ("axis", "axes"):
            val = getattr(attrs, key, None) if attrs is not None else None
            if val is not None:
                axes = val
                break
        if axes is None:
            axes = list(range(n))
        elif not isinstance(axes, (list, tuple, tvm_ffi.Array)):
            axes = [axes]
        return sorted({int(a) % n for a in axes}) if n else []


class BlockGraph:
    def __init__(self, block: relax.DataflowBlock, outputs: set):
        self.block = block
        self.bindings = list(block.bindings)
        self.nodes: list[Node] = []
        self.node_of_var: dict = {}  # var (incl. aliases) -> Node
        for i, bd in enumerate(self.bindings):
            v = bd.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                cls, reason, _ = classify_call(v)
                n = Node(i, bd.var, v, cls, reason)
                self.nodes.append(n)
                self.node_of_var[bd.var] = n
            elif isinstance(v, relax.TupleGetItem) and v.tuple_value in self.node_of_var:
                n = self.node_of_var[v.tuple_value]
                n.aliases.append(bd)
                n.alias_pos.append(i)
                self.node_of_var[bd.var] = n
        # users: node -> set of nodes / "external" (-1) consuming any of its vars
        self.users = {n.idx: set() for n in self.nodes}
        self.producers = {n.idx: set() for n in self.nodes}
        self.external_uses = {n.idx: set() for n in self.nodes}  # vars used outside ops
        # through[p]: nodes that read p's value through a binding that is not an op (a match_cast
        # the importer added, an alias): no fusion edge, but an order the cycle check must see
        self.through = {n.idx: set() for n in self.nodes}
        via = {}  # var of a non-op binding -> the nodes its value comes from
        for i, bd in enumerate(self.bindings):
            v = bd.value
            user = self.node_of_var.get(bd.var)
            free = relax.analysis.free_vars(v)
            if user is None:
                via[bd.var] = {self.node_of_var[f].idx for f in free if f in self.node_of_var}.union(
                    *[via[f] for f in free if f in via])
            else:
                for f in free:
                    for p in via.get(f, ()):
                        if p != user.idx:
                            self.through[p].add(user.idx)
            for fv in free:
                prod = self.node_of_var.get(fv)
                if prod is None:
                    continue
                if user is not None and user is not prod:
                    self.users[prod.idx].add(user.idx)
                    self.producers[user.idx].add(prod.idx)
                elif user is None:
                    self.external_uses[prod.idx].add(fv)
                    if fv.same_as(prod.var) and isinstance(prod.var.ty, relax.TupleType):
                        prod.escapes = True
        for n in self.nodes:
            for v in [n.var] + [a.var for a in n.aliases]:
                if v in outputs:
                    self.external_uses[n.idx].add(v)
        self.by_idx = {n.idx: n for n in self.nodes}
        self._out_bytes = {}
        self.attention: list = []  # member sets of the attentions found (plan_fusion fills it)

    def out_bytes(self, idx):
        if idx not in self._out_bytes:  # read through the FFI once per node, not once per score
            self._out_bytes[idx] = planning_bytes(self.by_idx[idx].var.ty)
        return self._out_bytes[idx]

    def is_anchor(self, idx):
        return self.by_idx[idx].cls == COMPUTE
