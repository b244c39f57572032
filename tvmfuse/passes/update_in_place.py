"""UpdateInPlace: an update graph writes the new value of a parameter into the parameter itself.

Contract. Reads main's attribute `tvmfuse.updates` ({output index: parameter index}: main's output k
is the new value of its parameter i, as an optimizer step's functional graph returns the new
parameters and moments; frontends/torch_update.py sets it). For each pair it can prove safe, the
call_tir that computes output k becomes a call_tir_inplace whose output aliases parameter i, and
its PrimFunc (a copy, `<name>_inplace`) writes into i's buffer instead of a buffer of its own
(PrimFunc.specialize). Stamps main with `tvmfuse.in_place`: the output indices now aliased. A
module without the attribute is returned as it is.

Legal (`_refusal` says why not, logged on `tvmfuse.fusion`):
  - in main: parameter i is an argument of that call once, and used nowhere else (not returned, no
    other call reads it), so nothing can read its old value after the call;
  - in the PrimFunc: the parameter's buffer is read by one block only, the block that writes the
    output, at the very indices it writes (an elementwise update: each element read before the
    same element is stored, in the same iteration), and never written; same shape and dtype. A
    flat view of a buffer (a DeclBuffer over its memory, schedules/flat_views.py: element k at
    offset k) counts as the buffer itself.
  A kernel whose later block reads the old value (AdamW's parameter step reading the old moment
  instead of the new one) is refused. The values computed do not change; only where they are put.

Why: without it, each new value is written to a fresh tensor and copied back into the parameter
by AOTAutograd's runtime wrapper, one `copy_` per tensor: an AdamW step over 8 tensors was 1
kernel and 24 copies. Runs after the schedules (the phase `in_place`), which move loops but not
which element a block reads.
"""
from __future__ import annotations

import logging

import tvm
import tvm_ffi
from tvm import relax

log = logging.getLogger("tvmfuse.fusion")

UPDATES = "tvmfuse.updates"
IN_PLACE = "tvmfuse.in_place"


def offer_updates(mod: tvm.IRModule, marks: dict) -> tvm.IRModule:
    """`mod` with main stamped `tvmfuse.updates` = marks ({main's output: main's parameter}), when any."""
    if marks:
        mod["main"] = mod["main"].with_attr(UPDATES, marks)
    return mod


def aliased_outputs(mod: tvm.IRModule) -> list[int]:
    """main's outputs this pass wrote into their parameters (its `tvmfuse.in_place` stamp)."""
    attrs = mod["main"].attrs
    return [int(k) for k in (attrs.get(IN_PLACE) if attrs is not None else None) or ()]


def _bindings(func):
    return {b.var: b.value for block in func.body.blocks for b in block.bindings}


def _uses(func) -> dict:
    """{Relax var: how many times main's body mentions it}, counted in one walk."""
    count = {}

    def visit(v):
        count[v] = count.get(v, 0) + 1

    tvm_ffi.structural_walk(func.body, (relax.Var, visit), order="post")
    return count


def _top_level(prim) -> list[list]:
    """The blocks of each top-level statement of the kernel's root block, in program order (each
    a loop nest that finishes before the next begins)."""
    body = prim.body  # down to the root block's body, and no further (a 0-d kernel's block is right there)
    body = body.block if isinstance(body, tvm.s_tir.SBlockRealize) else body
    body = body.body if isinstance(body, tvm.s_tir.SBlock) else body
    stmts = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
    nests = []
    for stmt in stmts:
        found = []
        tvm_ffi.structural_walk(stmt, (tvm.s_tir.SBlock, found.append), order="post")
        nests.append(found)
    return nests


def _point(region) -> list | None:
    """The indices of a one-element region, or None."""
    if any(not (isinstance(r.extent, tvm.tirx.IntImm) and int(r.extent) == 1) for r in region.region):
        return None
    return [r.min for r in region.region]


def _same_indices(a, b) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(
        tvm_ffi.structural_equal(x, y) for x, y in zip(a, b))


def _views(prim) -> list:
    """[(view, the buffer whose memory it declares)] for the kernel's DeclBuffers over another
    buffer's data (schedules/flat_views.py: a flat view of a whole buffer, element k at offset k)."""
    found = []
    tvm_ffi.structural_walk(prim.body, (tvm.tirx.DeclBuffer, found.append), order="post")
    return [(d.buffer, d.data.args[0]) for d in found
            if isinstance(d.data, tvm.ir.Call) and len(d.data.args) == 1 and str(d.data.op.name) == "tirx.buffer_data"]


def _same_memory(buf, param, views) -> bool:
    """Whether `buf` is the parameter's buffer or a view of it."""
    return buf.same_as(param) or any(v.same_as(buf) and base.same_as(param) for v, base in views)


def _prim_refusal(prim, src, dst) -> str:
    """Why output buffer `dst` cannot take the place of input buffer `src` ('' when it can)."""
    if str(src.dtype) != str(dst.dtype) or not _same_indices(list(src.shape), list(dst.shape)):
        return "the output's shape or dtype differs from the parameter's"
    nests, views = _top_level(prim), _views(prim)
    blocks = [(k, b) for k, nest in enumerate(nests) for b in nest]
    if any(_same_memory(w.source, src, views) for _k, b in blocks for w in b.writes):
        return "the kernel writes the parameter"
    writers = [(k, b) for k, b in blocks if any(_same_memory(w.source, dst, views) for w in b.writes)]
    if len(writers) != 1:
        return "the new value is not written by one block"
    at_nest, block = writers[0]
    writes = [w for w in block.writes if _same_memory(w.source, dst, views)]
    if len(block.writes) != 1 or block.init is not None:
        return f"the block writing the new value ({block.name_hint}) writes other buffers too"
    at = _point(writes[0])
    for k, b in blocks:
        reads = [r for r in b.reads if _same_memory(r.source, src, views)]
        if not reads or k < at_nest:  # an earlier loop nest: done before the new value is stored
            continue
        if not b.same_as(block):
            return f"block {b.name_hint} reads the parameter's old value after or beside the update"
        if not all(_same_indices(_point(r), at) for r in reads):
            return f"block {b.name_hint} reads the parameter at other elements than it writes"
    return ""


def _site(func, binds, out_index):
    """(call binding var, the call, output position j) computing main's output `out_index`, or a reason."""
    ret = func.body.body
    ret = binds.get(ret, ret) if isinstance(ret, relax.Var) else ret
    if not isinstance(ret, relax.Tuple) or out_index >= len(ret.fields):
        return "main does not return a tuple with that output"
    value, j = ret.fields[out_index], 0
    item = binds.get(value) if isinstance(value, relax.Var) else value
    if isinstance(item, relax.TupleGetItem):  # a field of a multi-output kernel
        value, j = item.tuple_value, int(item.index)
    call = binds.get(value) if isinstance(value, relax.Var) else None  # else the kernel's own output
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
        return "the output is not computed by a kernel call"
    if len(call.args) > 2:
        return "the kernel takes symbolic shape arguments"
    return value, call, j


def _plan(mod, func, updates):
    """{call var: (call, {output j: arg index a})} of the legal pairs, and the main outputs they serve."""
    plans, served = {}, []
    binds, uses = _bindings(func), _uses(func)
    for out_index, param_index in sorted(updates.items()):
        param = func.params[param_index]
        site = _site(func, binds, out_index)
        why = site if isinstance(site, str) else ""
        if not why:
            var, call, j = site
            args = list(call.args[1].fields)
            positions = [a for a, x in enumerate(args) if x.same_as(param)]
            if len(positions) != 1 or uses.get(param, 0) != 1:
                why = "the parameter is read elsewhere in the graph"
            else:
                prim = mod[call.args[0]]
                n_in = len(args)
                why = _prim_refusal(prim, prim.params[positions[0]], prim.params[n_in + j])
        if why:
            log.info("update of input %d (output %d) stays a copy: %s", param_index, out_index, why)
            continue
        plans.setdefault(var, (call, {}))[1][j] = positions[0]
        served.append(out_index)
    return plans, served


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    """Each planned call_tir as a call_tir_inplace of a specialized copy of its PrimFunc."""

    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = list(plans.values())

    def visit_call_(self, call):
        plan = next((p for p in self.plans if p[0].same_as(call)), None)
        if plan is None:
            return super().visit_call_(call)
        _call, aliases = plan
        prim = self.builder_.get()[call.args[0]]
        n_in = len(call.args[1].fields)
        prim = prim.specialize({prim.params[n_in + j]: prim.params[a] for j, a in aliases.items()})
        gv = self.builder_.add_func(prim, call.args[0].name_hint + "_inplace")
        ty = call.ty
        fields = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
        indices = [aliases.get(j, -1) for j in range(len(fields))]
        return relax.call_tir_inplace(gv, call.args[1], indices, fields if isinstance(ty, relax.TupleType) else fields[0])


@tvm.transform.module_pass(opt_level=0, name="tvmfuse.UpdateInPlace")
def UpdateInPlace(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    func = mod["main"]
    updates = func.attrs.get(UPDATES) if func.attrs else None
    if not updates:
        return mod
    plans, served = _plan(mod, func, {int(k): int(v) for k, v in updates.items()})
    if not plans:
        return mod
    rewriter = _Rewrite(mod, plans)
    new = rewriter.visit_expr(func).with_attr(IN_PLACE, served)
    out = rewriter.builder_.get()
    out["main"] = new
    return relax.transform.DeadCodeElimination(["main"])(out)
