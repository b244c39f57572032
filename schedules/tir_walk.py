"""children(stmt): the statements directly inside a TIR statement, for the small walkers of the
schedule rules (tvm.tirx has no Python statement visitor in 0.27).

Contract: yields, in program order, the child statements of a For, SBlockRealize, SBlock (its
init first), IfThenElse, LetStmt, AttrStmt, Allocate and SeqStmt; nothing for a leaf (a store, an
evaluate). Expressions are not visited."""
from __future__ import annotations

from tvm import tirx

_FIELDS = ("block", "init", "body", "then_case", "else_case")


def children(stmt):
    if isinstance(stmt, tirx.SeqStmt):
        yield from stmt.seq
        return
    for field in _FIELDS:
        child = getattr(stmt, field, None)
        if isinstance(child, tirx.Stmt):
            yield child
