"""Graph outputs that are views of graph inputs: replayed on the runtime tensors, never computed.

AOTAutograd's forward graph returns what the backward reads, and for a Linear layer that is the
weight's transpose (`permute(primals_1, [1, 0])`): a view of an input. Built by tvmfuse, such an
output is a transpose kernel per call and a copy into the strides AOT traced. Replayed in torch on
the input itself, it is what eager PyTorch saves: a view, no launch, no bytes moved.

`input_view(node, placeholders)` -> (input index, [(view op, its other arguments)]) when `node` is a
chain of view ops (ATen overloads whose schema says they alias their first argument, `is_view`)
whose other arguments are constants (dims, shapes), ending at a placeholder; else None.
`replay(tensor, steps)` applies the chain to the runtime tensor: the same ATen ops on the same
arguments, so the result has the sizes and strides AOT traced.
"""
from __future__ import annotations

import torch


def input_view(node, placeholders):
    steps = []
    while node.op == "call_function":
        target = node.target
        if not getattr(target, "is_view", False) or node.kwargs or not node.args:
            return None
        rest = node.args[1:]
        if any(_has_node(a) for a in rest):
            return None  # a size or index computed in the graph: not a constant view
        steps.append((target, rest))
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return None
    if node.op != "placeholder" or not steps:
        return None
    return placeholders.index(node), steps[::-1]


def replay(tensor, steps):
    for target, rest in steps:
        tensor = target(tensor, *rest)
    return tensor


def _has_node(arg) -> bool:
    if isinstance(arg, torch.fx.Node):
        return True
    if isinstance(arg, (list, tuple)):
        return any(_has_node(a) for a in arg)
    return False
