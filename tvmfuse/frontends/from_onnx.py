"""`from_onnx(path_or_model, shapes=None)`: an ONNX model -> Relax.

Contract:
- accepts a path (str / PathLike) or an `onnx.ModelProto`; a missing file, a file that is not a
  valid ONNX protobuf, or a model onnx.checker rejects is a FrontendError saying which;
- every node's op_type is checked against TVM's ONNX converter table first: an unsupported op is a
  FrontendError naming the op and the nodes that use it;
- `shapes` ({input name: [dims]}) fixes input shapes; a named symbolic dimension (`dim_param`,
  "batch") that `shapes` does not fix stays symbolic (one build for every size, like torch.export's
  Dims; docs/dynamic-shapes.md); an unnamed unknown dimension is a FrontendError naming the input;
- converted with `tvm.relax.frontend.onnx.from_onnx`, then `common.normalize`.
  `params="constants"` (default) embeds the initializers; `params="inputs"` returns `(mod, params)`
  like from_torch;
- when TVM's importer fails on a model whose inputs are all static (and `shapes` is not given), it
  is retried once on the model with its shape computations folded by onnxruntime's basic
  optimizations (onnx_fold.py: torch.onnx.export's computed "same" pads and ConstantOfShape masks);
  the first error is reported when that fails too.
"""
from __future__ import annotations

from ..errors import FrontendError
from ..relax_utils import GRAPH_LOCK
from .common import finish, read_path

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 16: "bfloat16"}


def load_onnx(path_or_model):
    """An onnx.ModelProto from a path or a ModelProto, checked by onnx.checker."""
    import onnx

    if isinstance(path_or_model, onnx.ModelProto):
        model, where = path_or_model, "the given ModelProto"
    else:
        path = read_path(path_or_model, "from_onnx", (".onnx",))
        where = f"'{path}'"
        try:
            model = onnx.load(path)
        except Exception as err:  # DecodeError from protobuf, or onnx's own errors
            raise FrontendError(f"{where} is not a valid ONNX model ({type(err).__name__}: {err}); "
                                "re-export it (e.g. torch.onnx.export) and check the file is complete") from err
    if not model.graph.node:
        raise FrontendError(f"{where} has an empty graph (no nodes): not an ONNX model, or a truncated file")
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        raise FrontendError(f"{where} fails onnx.checker: {err}") from err
    return model


def unsupported_ops(model) -> list[tuple[str, list[str]]]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = set(_get_convert_map()) | {"Constant", "If"}
    found: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in known:
            found.setdefault(node.op_type, []).append(node.name or f"node #{i}")
    return list(found.items())


def graph_inputs(model) -> list[tuple[str, list, str]]:
    """(name, dims: ints, the dim_param name of a symbolic one, None for an unnamed unknown one, dtype)
    of the real inputs (not initializers)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out.append((vi.name, dims, _ONNX_DTYPES.get(tt.elem_type, "float32")))
    return out


def from_onnx(path_or_model, shapes: dict | None = None, *, params: str = "constants", normalize: bool = True):
    """Import an ONNX model; see the module docstring for the contract."""
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    if params not in ("constants", "inputs"):
        raise FrontendError(f"params={params!r}: use 'constants' (weights embedded) or 'inputs'")
    model = load_onnx(path_or_model)
    missing = unsupported_ops(model)
    if missing:
        where = "; ".join(f"'{op}' (nodes {', '.join(n[:3])}{', ...' if len(n) > 3 else ''})" for op, n in missing)
        raise FrontendError(f"TVM's Relax ONNX frontend does not support {where}; export the model "
                            "without those ops (another opset, or rewrite that part of the model)")
    shapes = dict(shapes or {})
    ins = graph_inputs(model)
    unknown = sorted(set(shapes) - {n for n, _, _ in ins})
    if unknown:
        raise FrontendError(f"shapes names {unknown}, which are not inputs of the model; inputs: "
                            f"{[n for n, _, _ in ins]}")
    shape_dict, dtype_dict = {}, {}
    for name, dims, dtype in ins:
        dims = list(shapes.get(name, dims))
        if any(d is None or (isinstance(d, int) and d <= 0) for d in dims):
            raise FrontendError(f"input '{name}' has unknown, unnamed dimensions {dims}; fix them with "
                                f"shapes={{'{name}': [...]}}")
        dtype_dict[name] = dtype
        if all(isinstance(d, int) for d in dims):
            shape_dict[name] = dims  # else TVM's importer keeps each named dim a symbolic var
    try:
        mod = _import(tvm_from_onnx, model, shape_dict, dtype_dict, params)
    except Exception as err:
        mod = _import_folded(tvm_from_onnx, model, shapes, shape_dict, dtype_dict, params)
        if mod is None:
            raise FrontendError(f"TVM's Relax ONNX frontend failed: {type(err).__name__}: {err}") from err
    return finish(mod, params, normalize)


def _import(tvm_from_onnx, model, shape_dict, dtype_dict, params):
    with GRAPH_LOCK:  # TVM's importer opens BlockBuilder function scopes (relax_utils.py)
        return tvm_from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict,
                             keep_params_in_input=params == "inputs")


def _import_folded(tvm_from_onnx, model, shapes, shape_dict, dtype_dict, params):
    """The import retried on the model with its shape computations folded (onnx_fold.py), when its
    inputs are all static and not reshaped by `shapes`; None when that is not possible or fails too."""
    from .onnx_fold import fold, static_inputs

    if shapes or not static_inputs(model):
        return None
    try:
        return _import(tvm_from_onnx, fold(model), shape_dict, dtype_dict, params)
    except Exception:  # the first error is the one reported
        return None
