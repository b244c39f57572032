"""`from_torch(module, example_inputs, dynamic_shapes=None)`: PyTorch eager -> Relax.

Contract:
- capture: `torch.export.export(module.eval(), example_inputs, dynamic_shapes=...)`, then torch's
  core-ATen decompositions (what TVM's frontend itself would run);
- every ATen op of the captured graph is checked against TVM's converter table BEFORE conversion: an
  op TVM cannot convert is a FrontendError naming the op and the module path it came from
  (`encoder.layer.0.attention`, from the node's nn_module_stack);
- convert with `tvm.relax.frontend.torch.from_exported_program` (single outputs unwrapped), then
  `common.normalize` (inference decompositions, constant folding);
- weights: `params="constants"` (default) embeds them, the result is an IRModule whose main takes
  the example inputs only; `params="inputs"` returns `(mod, params)`, main takes the inputs followed
  by the weights and `params` is the list of numpy arrays to pass after the inputs.

Known TVM 0.27 frontend bug worked around here: `aten.cumsum` of a bool/int tensor keeps the input
dtype (torch promotes to int64), and LLVM codegen then fails on a bool add. transformers' masking
code emits exactly that; `_cumsum` promotes like torch. More in torch_fixes.py (true division of
integers, index.Tensor with sliced dims).
"""
from __future__ import annotations

from ..errors import FrontendError
from ..relax_utils import GRAPH_LOCK
from .common import finish
from .torch_fixes import FIXES as TORCH_FIXES

_INTEGRAL = ("bool", "int8", "int16", "int32", "uint8")


def _cumsum(node, importer):
    from tvm import relax

    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if "dtype" in node.kwargs and node.kwargs["dtype"] is not None:
        dtype = importer._convert_data_type(str(node.kwargs["dtype"]), importer.env)
    else:
        dtype = "int64" if x.ty.dtype in _INTEGRAL else None
    return importer.block_builder.emit(relax.op.cumsum(x, dim, dtype))


FIXES = {"cumsum.default": _cumsum, **TORCH_FIXES}  # torch_fixes.py: division, indexing


def _describe(inputs) -> str:
    import torch

    return ", ".join(f"{list(t.shape)}:{str(t.dtype).replace('torch.', '')}" if isinstance(t, torch.Tensor)
                     else type(t).__name__ for t in inputs)


def _export(module, inputs, dynamic_shapes):
    import torch

    try:
        return torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # torch raises many types (RuntimeError, UserError, TypeError, ...)
        first = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
        raise FrontendError(
            f"torch.export could not run {type(module).__name__}.forward on the example inputs "
            f"({_describe(inputs)}): {type(err).__name__}: {first}. Check that the example inputs have "
            "the shapes and dtypes forward expects (and that forward is traceable by torch.export)"
        ) from err


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "<top-level forward>"
    path, kind = list(stack.values())[-1]
    kind = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
    return f"{path or '<root>'} ({kind})"


def unsupported_ops(ep, extra=()) -> list[tuple[str, str]]:
    """(ATen op, module path) of every call in the (decomposed) graph TVM has no converter for."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    known = set(ExportedProgramImporter().create_convert_map()) | set(extra)
    seen, out = set(), []
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name not in known and (name, _module_path(node)) not in seen:
            seen.add((name, _module_path(node)))
            out.append((name, _module_path(node)))
    return out


def from_torch(module, example_inputs, dynamic_shapes=None, *, params: str = "constants",
               custom_convert_map=None, normalize: bool = True):
    """Import a torch.nn.Module; see the module docstring for the contract."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise FrontendError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    if params not in ("constants", "inputs"):
        raise FrontendError(f"params={params!r}: use 'constants' (weights embedded) or 'inputs'")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    ep = _export(module.eval(), example_inputs, dynamic_shapes)
    return from_exported(ep, type(module).__name__, params=params, custom_convert_map=custom_convert_map,
                         normalize=normalize, dynamic=bool(dynamic_shapes))


def from_exported(ep, name: str, *, params: str = "constants", custom_convert_map=None, normalize: bool = True,
                  dynamic: bool = False, pure: bool = False):
    """The tail of from_torch on a torch.export ExportedProgram (also the torch.compile backend's
    ATen route, frontends/torch_aten.py): decompositions, the converter check, TVM's importer,
    finish. `pure`: a program that updates a buffer or an input in place is a FrontendError (the
    Relax module returns values only, so the update would be lost)."""
    from tvm.relax.frontend.torch import from_exported_program

    ep = ep.run_decompositions()
    sig = ep.graph_signature  # (a parameter updated in place: an optimizer step's graph)
    mutated = {**sig.buffers_to_mutate, **sig.parameters_to_mutate, **sig.user_inputs_to_mutate}
    if pure and mutated:
        names = ", ".join(sorted(set(mutated.values()))[:4])
        raise FrontendError(f"{name} updates {names} in place (e.g. BatchNorm's running statistics in train mode); "
                            "the compiled module returns values only, so it cannot run it (call model.eval() for "
                            "inference)")
    convert_map = {**FIXES, **(custom_convert_map or {})}
    missing = unsupported_ops(ep, convert_map)
    if missing:
        where = "; ".join(f"'{op}' in {path}" for op, path in missing)
        raise FrontendError(
            f"{name}: TVM's Relax torch frontend has no converter for {where}. Rewrite that "
            "part of the model with supported ops, or pass custom_convert_map={'<op>': fn(node, importer)}"
        )
    try:
        with GRAPH_LOCK:  # TVM's importer opens BlockBuilder function scopes (relax_utils.py)
            mod = from_exported_program(ep, keep_params_as_input=params == "inputs", unwrap_unit_return_tuple=True,
                                        custom_convert_map=convert_map, run_ep_decomposition=False)
    except Exception as err:
        raise FrontendError(f"TVM's Relax torch frontend failed on {name}: "
                            f"{type(err).__name__}: {err}") from err
    # symbolic shapes are simplified under the declared Dim ranges (min(s, 512) -> s; tighten_shapes.py)
    from .tighten_shapes import export_ranges

    return finish(mod, params, normalize, ranges=export_ranges(ep) if dynamic else None)
