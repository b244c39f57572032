"""Shape analysis shared by the CPU and CUDA row-reduction rules.

A *row chain* is a PrimFunc whose blocks (after inlining) all share the same leading spatial loops,
the rows, and every reduction reduces only inside a row: each element it reads belongs to one row.
Stitched softmax, layer norm and RMS norm are row chains with one row per token. A group of full
reductions (multi_reduce) is a row chain with zero rows. Matmul and conv are not: a row of the
output reads a column of the weight that every row shares.

`analyze(sch)` returns a RowChain or None (decline). It only reads the schedule.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.s_tir import ScheduleError
from tvm.s_tir.dlight.analysis import normalize_prim_func


@dataclass
class RowChain:
    rows: int  # number of leading spatial loops shared by every block (0: full reductions)
    blocks: list  # sblock RVs in program order
    reductions: list  # the subset that are reductions
    last: object  # the last block: every other block is computed at its row loop


def _int(x):
    return int(x) if isinstance(x, tvm.tirx.IntImm) else None


def _extent_key(e):
    """A loop extent as a comparable key: the int, or the simplified text of a symbolic extent (one
    PrimFunc names each of its symbolic variables once, so equal text is the same extent)."""
    if isinstance(e, tvm.tirx.IntImm):
        return int(e)
    from tvm.sym import Analyzer

    return "sym:" + str(Analyzer().simplify(e))


def vars_in(expr):
    names = set()

    def visit(e):
        names.add(e.name)

    tvm_ffi.structural_walk(expr, (tvm.tirx.Var, visit), order="post")
    return names


def reduction_operands(block) -> int:
    """How many buffers `block` reads at an index that moves with a reduction variable: 2 for a
    matmul or conv (input and weight), 1 for a row sum, 0 for a spatial block."""
    red = {iv.var.name for iv in block.iter_vars if int(iv.iter_type) == 2}  # 2: CommReduce
    return sum(any(vars_in(rg.min) & red for rg in r.region) for r in block.reads) if red else 0


def read_indices(block) -> list[tuple[set, set]]:
    """For each buffer `block` reads: (the names of every variable in its indices, those in its
    innermost index). What the reduction rules ask of a read: whether it walks a reduced axis along
    its rows (the innermost index) or across them (sum(g, axis=0): a column per vector lane)."""
    return [(set().union(*(vars_in(rg.min) for rg in r.region)), vars_in(r.region[-1].min))
            for r in block.reads if r.region]


def _is_reduction(sch, block_rv) -> bool:
    return any(int(iv.iter_type) == 2 for iv in sch.get(block_rv).iter_vars)


def is_output(sch, block_rv) -> bool:
    params = sch.mod["main"].params  # 0.27: params are the buffers; a region's buffer is .source
    return any(any(w.source.same_as(p) for p in params) for w in sch.get(block_rv).writes)


def analyze(sch) -> RowChain | None:
    infos = normalize_prim_func(sch)
    if not infos:
        return None
    blocks = [i.block_rv for i in infos]
    reductions = [b for b in blocks if _is_reduction(sch, b)]
    if not reductions:
        return None
    # loops of each block, with their extents; a reduction block must be S...SR...R
    shapes = []
    for info in infos:
        kinds = info.dom_kind()
        if "RS" in kinds or "O" in kinds:
            return None  # a spatial loop inside a reduction loop, or an opaque iterator
        extents = [_extent_key(sch.get(lp).extent) for lp in sch.get_loops(info.block_rv)]
        if len(extents) != len(kinds):
            return None  # loops not one-to-one with block iters
        lead = len(kinds) - len(kinds.lstrip("S"))
        shapes.append(extents[:lead])
    rows = 0
    while all(len(s) > rows for s in shapes) and len({s[rows] for s in shapes}) == 1:
        rows += 1
    # every reduction reads its row of each tensor; the one exception is a tensor no stage writes
    # (a function input) read the same by every row, when the reduction yields one value per row
    # (the weight vector of a GEMV). A matmul's weight matrix is read by every row too, but it has
    # output columns inside the row: that is a matmul, not a row chain.
    produced = {w.source for b in blocks for w in sch.get(b).writes}
    for b in reductions:
        block = sch.get(b)
        row_vars = {iv.var.name for iv in list(block.iter_vars)[:rows]}
        columns = [iv for iv in list(block.iter_vars)[rows:] if int(iv.iter_type) == 0 and _int(iv.dom.extent) != 1]
        for r in block.reads:
            used = set().union(*(vars_in(rg.min) for rg in r.region)) if len(r.region) else set()
            if row_vars <= used:
                continue
            shared_input = not any(r.source.same_as(p) for p in produced)
            if not (shared_input and not columns and not used & row_vars):
                return None
    return RowChain(rows, blocks, reductions, blocks[-1])


def same_thread_mapping(sch, chain: RowChain) -> bool:
    """True when every buffer a materialised spatial block writes is read by its in-kernel consumers
    at the consumer's own (non-unit) iteration point. Splitting every block's inner loops the same
    way then puts a producer element and its reads on the same thread, so no barrier is needed."""
    for b in chain.blocks[:-1]:
        if _is_reduction(sch, b):
            continue
        block = sch.get(b)
        for w in block.writes:
            for c in sch.get_consumers(b):
                cb = sch.get(c)
                own = [iv.var for iv in cb.iter_vars if _int(iv.dom.extent) != 1]
                for r in cb.reads:
                    if not r.source.same_as(w.source):
                        continue
                    idx = [rg.min for rg in r.region if _int(rg.extent) == 1]
                    non_unit = [i for i in idx if not (isinstance(i, tvm.tirx.IntImm))]
                    if len(non_unit) != len(own) or not all(a.same_as(v) for a, v in zip(non_unit, own)):
                        return False
    return True


def _iterations(sch, block_rv):
    n = tvm.tirx.const(1, "int64")
    for iv in sch.get(block_rv).iter_vars:
        n = n * tvm.tirx.Cast("int64", iv.dom.extent)
    return n


def _loop_trips(sch, block_rv):
    n = tvm.tirx.const(1, "int64")
    for lp in sch.get_loops(block_rv):
        n = n * tvm.tirx.Cast("int64", sch.get(lp).extent)
    return n


def _same_count(a, b) -> bool:
    """Provably equal iteration counts (static ints, or symbolic products such as n * 768)."""
    from tvm.sym import Analyzer

    return bool(Analyzer().can_prove_equal(a, b))


def join_row(sch, blocks, row, rows: int = 0):
    """Move every stage after the first into the first stage's row loop `row`, in program order
    (reverse_compute_at), and check that each stage still runs each of its iterations exactly
    once. reverse_compute_at sizes a stage by what its in-row producers wrote: a stage that also
    reads only inputs (the x half of concat(x, max(x))) would shrink to the produced part, and one
    with no in-row producer (a sibling tanh(x)) would run whole in every row. With `rows` (the
    number of leading row loops every block has), a stage with no in-row producer (a layer norm's
    second mean, x_hat from a saved mean and rstd in its backward) has its own row loops merged
    with `row` instead, running first in the row. Returns the row loop (a new one after a merge),
    or None, as for a join TVM refuses (a pooling window's strided read of a padding stage:
    ValueError "TensorRegion pattern match failed"), and the rule declines; `sch` is then partly
    changed, and the rule drops it."""
    want = {b: _iterations(sch, b) for b in blocks}
    joined = [blocks[0]]
    for b in blocks[1:]:
        try:
            if rows and not _has_producer_in(sch, b, joined):
                lead = sch.get_loops(b)[:rows]
                own = sch.fuse(*lead) if len(lead) > 1 else lead[0]
                row = sch.merge(own, row)  # the merged loop stands where `row` stood
            else:
                sch.reverse_compute_at(b, row, preserve_unit_loops=True)
        except (ScheduleError, ValueError):  # TVM reports a region it cannot map as a ValueError
            return None
        joined.append(b)
    return row if all(_same_count(_loop_trips(sch, b), want[b]) for b in blocks) else None


def _has_producer_in(sch, block_rv, blocks) -> bool:
    stmts = [sch.get(b) for b in blocks]
    return any(any(sch.get(p).same_as(s) for s in stmts) for p in sch.get_producers(block_rv))
