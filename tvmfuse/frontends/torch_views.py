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
        source = node.args[0]
        if not isinstance(source, torch.fx.Node) or node.all_input_nodes != [source]:
            return None  # a size or index computed in the graph: not a constant view
        steps.append((target, node.args[1:]))
        node = source
    if node.op != "placeholder" or not steps:
        return None
    return placeholders.index(node), steps[::-1]


def replay(tensor, steps):
    for target, rest in steps:
        tensor = target(tensor, *rest)
    return tensor

