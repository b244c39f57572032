"""Update graphs through `torch.compile(backend="tvmfuse")`: an optimizer step (`torch.compile(opt.step,
backend="tvmfuse")`, or a step function that calls `opt.step()`) built by tvmfuse.

The dispatcher (frontends/torch_backend.py) sends a dynamo graph here when no input needs autograd
and the graph updates a graph input or a module/optimizer attribute in place (`is_update`: an
in-place op, `torch._foreach_add_`, `p.mul_`, `p.copy_`, ..., whose target is a placeholder or a
`get_attr`): the parameters, their gradients and the optimizer's state (momentum buffers, exp_avg,
exp_avg_sq, step tensors), which dynamo keeps as attributes of the graph.

The route: `aot_module_simplified` (the attributes lifted to inputs) with
`keep_inference_input_mutations=True`: AOTAutograd functionalizes the graph and ends it with one
`copy_(input, new value)` per mutated input. `_functional` makes those new values outputs of the
graph tvmfuse builds (kind "update" in the records) and marks which input each one updates; the
build writes a new value into its input's memory where passes/update_in_place.py proves that safe
(the fused update kernel reads each element of the parameter, the moments and the step count
before it stores the same element), and the rest are copied into place after the call. The
parameters and the optimizer state are updated in place as eager updates them. The decompositions
are the training route's (core ATen, torch_train.decompositions) and `FOREACH`: each `_foreach_*` op
of the foreach implementations as the per-tensor ops it applies, so the update of N parameters is N
independent elementwise chains that the planner's horizontal pass (fusion/fuse_horizontal.py, on
for these builds: `horizontal=True`) joins into one kernel. The ATen graph is built by
torch_train.compile_aten_graph (torch.export, TVM's importer with GRAD_CONVERTERS: prims.fma,
functional copy) and recorded like the forward and backward graphs.

What runs eagerly, with its reason recorded and logged: a graph with a tensor off the CPU (before
AOTAutograd), one AOTAutograd cannot trace (the dynamo graph itself), one whose ATen graph tvmfuse
cannot import or build (the ATen graph, AOT's copy-back intact). Either way the step stays correct.
"""
from __future__ import annotations

import copy

import torch

from . import torch_train

# the elementwise foreach ops torch.optim's foreach implementations use (SGD and AdamW are tested,
# tests/test_torch_optimizer.py; an op TVM cannot convert leaves its graph to eager, logged)
_FOREACH = ("add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "pow", "maximum", "minimum", "neg",
            "sqrt", "rsqrt", "reciprocal", "abs", "exp", "log", "sign", "clamp_min", "clamp_max", "sigmoid",
            "tanh", "zero")


def _mutated(node) -> list:
    """The nodes an in-place op writes (its first argument, or each tensor of a list), or []."""
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
    elif node.op == "call_method":
        name = str(node.target)
    else:
        return []
    if not name.endswith("_") or name.endswith("__") or not node.args:
        return []
    first = node.args[0]
    items = first if isinstance(first, (list, tuple)) else [first]
    return [a for a in items if isinstance(a, torch.fx.Node)]


def is_update(gm) -> bool:
    """Whether the dynamo graph updates one of its inputs or attributes in place (see the docstring)."""
    return any(t.op in ("placeholder", "get_attr") for n in gm.graph.nodes for t in _mutated(n))


def refusal(gm, example_inputs) -> str:
    """Why the graph cannot go the update route at all ('' when it can): a tensor off the CPU."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    tensors += [t for t in list(gm.parameters()) + list(gm.buffers())]
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target, None) if "." not in n.target else None
            if isinstance(t, torch.Tensor):
                tensors.append(t)
    for t in tensors:
        if t.device.type != "cpu":
            return (f"a tensor of the update is on {t.device}; the tvmfuse backend builds update graphs for the "
                    "CPU")
    return ""


def _per_tensor(name: str):
    """The decomposition of `_foreach_<name>.*`: aten.<name> applied to the i-th tensor of each list
    argument (and the i-th scalar of a scalar list); addcmul / addcdiv's positional value is its
    keyword (a 1-D tensor of scalars gives its i-th element)."""
    op = getattr(torch.ops.aten, name)

    def decompose(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        out = []
        for i in range(n):
            item = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
            if name in ("addcmul", "addcdiv") and len(item) > 3:
                value = item.pop(3)
                if isinstance(value, torch.Tensor) and value.dim() == 1:
                    value = value[i]
                if isinstance(value, torch.Tensor):
                    inner = torch.ops.aten.mul(item[1], item[2]) if name == "addcmul" else \
                        torch.ops.aten.div(item[1], item[2])
                    out.append(torch.ops.aten.add(item[0], torch.ops.aten.mul(inner, value)))
                    continue
                kwargs = {**kwargs, "value": value}
            out.append(torch.ops.aten.zeros_like(item[0]) if name == "zero" else op(*item, **kwargs))
        return out

    return decompose


def foreach_decompositions() -> dict:
    """{_foreach_<op>.<overload>: per-tensor decomposition} for the functional overloads of `_FOREACH`."""
    table = {}
    for name in _FOREACH:
        packet = getattr(torch.ops.aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload in packet.overloads():
            if "out" not in overload:
                table[getattr(packet, overload)] = _per_tensor(name)
    return table


def decompositions() -> dict:
    return {**torch_train.decompositions(), **foreach_decompositions()}


def update_backend(gm, example_inputs, options: dict, fallback: str, new_record):
    """The update route for one dynamo graph: AOTAutograd's functional graph built by tvmfuse (kind
    "update"), its new values written into the mutated tensors (`_functional`). `new_record(kind,
    ops)` makes the GraphRecord of the ATen graph. Raises what AOTAutograd raises (the caller runs
    `gm` eagerly)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    options = {"horizontal": True, **options}
    compiler = torch_train._compiler("update", options, fallback, new_record, functional=_functional)
    with torch.no_grad():
        return aot_module_simplified(gm, example_inputs, fw_compiler=compiler, inference_compiler=compiler,
                                     decompositions=decompositions(), keep_inference_input_mutations=True)


def _functional(gm):
    """(a copy of `gm` whose trailing `copy_(input, new)` are outputs instead, {output: input},
    wrap): AOTAutograd keeps an update graph's mutations as copies into its inputs
    (keep_inference_input_mutations); tvmfuse builds the graph without them, writing each new value
    into its input where passes/update_in_place.py proves it safe, and `wrap(fn, compiled)` copies
    the rest into place (`copy_`, counted in the record) and returns the graph's own outputs."""
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    out = next(n for n in graph.nodes if n.op == "output")
    outs = list(out.args[0]) if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
    n_own, updates = len(outs), {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and not node.users \
                and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder":
            updates[len(outs)] = placeholders.index(node.args[0])
            outs.append(node.args[1])
            graph.erase_node(node)
    out.args = (tuple(outs),)
    left = [n for n in graph.nodes if any(t.op == "placeholder" for t in _mutated(n))]
    if left:
        raise NotImplementedError(f"the update graph mutates an input with {left[0].target} (not a trailing copy_), "
                                  "which the built graph would drop")

    def wrap(fn, compiled):
        def run(args):
            results = fn(args)
            targets, pending = None, []
            for o, i in updates.items():
                src = results[o]
                # written in place by the build (returned as the input itself, torch_tensors.call)
                if src is args[i] or src.data_ptr() == args[i].data_ptr():
                    continue
                if targets is None:
                    targets = {args[k].data_ptr() for k in updates.values()}
                # a source in another updated tensor's memory (its old value) is read before any copy
                pending.append((args[i], src.clone() if src.data_ptr() in targets else src))
            for dst, src in pending:
                dst.copy_(src)
            return results[:n_own]

        run.copies = in_place_copies(compiled, updates)
        return run

    return torch.fx.GraphModule(gm, graph), updates, wrap


def in_place_copies(compiled, updates: dict) -> int:
    """How many of an update graph's new values are copied into place per call (the rest the
    build writes in place: passes/update_in_place.py)."""
    from ..passes.update_in_place import aliased_outputs

    return len(updates) - (len(aliased_outputs(compiled.mod)) if compiled is not None else 0)

