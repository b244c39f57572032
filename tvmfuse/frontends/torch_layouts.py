"""Permuted inputs of an ATen graph taken as their dense base, the permutation done in the graph.

Contract: `take_dense_bases(gm, example_inputs)` rewrites `gm` in place. Each placeholder whose
example input is a permutation of a dense tensor (a Linear's weight transpose that the forward
saved for the backward, arriving as a strided view of the weight) becomes a placeholder for the
dense tensor under it, followed by an `aten.permute` that gives the rest of the graph the view it
had. It returns {input index: memory order}; `bases(tensors, orders)` turns the call's tensors
into those dense bases (zero-copy views; a tensor with another layout at run time is made dense
by the caller, as any input is, torch_tensors.py) and `bases` of the example inputs gives the
shapes to import. The graph computes the same values: only where the transpose happens moves,
from a copy before the call (one per saved weight) into the consuming kernel, which reads the
operand through permuted indices as forward matmuls read theirs.
"""
from __future__ import annotations

import torch


def memory_order(t: torch.Tensor) -> tuple[int, ...] | None:
    """The permutation `order` with `t.permute(order)` contiguous, outermost dimension first; None
    where `t` is contiguous already or no permutation makes it so (an expanded or sliced view)."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))
    return order if t.permute(order).is_contiguous() else None


def take_dense_bases(gm: torch.fx.GraphModule, example_inputs) -> dict[int, tuple[int, ...]]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    orders = {}
    for i, (node, t) in enumerate(zip(placeholders, example_inputs)):
        order = memory_order(t) if isinstance(t, torch.Tensor) else None
        if order is None or not node.users:
            continue
        inverse = tuple(sorted(range(len(order)), key=order.__getitem__))  # base.permute(inverse) == t
        with gm.graph.inserting_after(placeholders[-1]):
            view = gm.graph.call_function(torch.ops.aten.permute.default, (node, list(inverse)))
        node.replace_all_uses_with(view, delete_user_cb=lambda user, v=view: user is not v)
        if "val" in node.meta:
            view.meta["val"] = node.meta["val"]
            node.meta["val"] = node.meta["val"].permute(order)
        orders[i] = order
    gm.recompile()
    return orders


def bases(tensors, orders: dict[int, tuple[int, ...]]) -> list:
    """`tensors` with each one in `orders` as its dense base: a view (contiguous where its layout is
    the one traced). `tensors` itself when there is none (the usual case: no per-call list)."""
    if not orders:
        return tensors
    return [t.permute(orders[i]) if i in orders else t for i, t in enumerate(tensors)]
