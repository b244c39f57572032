"""Helpers shared by the frontends.

`normalize(mod)` is what every importer runs on the Relax module it produced, so the three fusion
variants start from the same clean graph:

  DecomposeOpsForInference  batch_norm(training=False) etc. into plain arithmetic
  CanonicalizeBindings      `t = (a, b, c); y = t[0]` -> `y = a` (literal tuples left by the decomposition)
  tighten_shapes            symbolic shapes simplified under the exporter's Dim ranges (min(s, 512) -> s)
  FoldConstantsOnce         (passes/fold_constants.py: every constant binding evaluated by one build)
  FoldConstant              shape arithmetic on weights (ONNX Shape/Gather chains, expand_dims of BN
                            statistics) computed once at import instead of per inference
  DeadCodeElimination       drop what the two passes above left unused
"""
from __future__ import annotations

import os

import numpy as np
import tvm
from tvm import relax

from ..errors import FrontendError
from ..relax_utils import static_shape


def _nonnegative_slice_axes(call, _builder):
    """strided_slice with a negative axis as the same slice with axis + ndim: TVM 0.27's legalizer
    passes a negative axis to topi's dynamic strided slice, which rejects it ("axis < src_tensor_dim
    (-1 vs. 2)": GPT-2's position-id diff, exported with a symbolic sequence)."""
    x, axes = call.args[0], call.args[1]
    ndim = x.ty.ndim if isinstance(x.ty, relax.TensorType) else -1
    try:
        values = [int(getattr(a, "value", a)) for a in axes]
    except (TypeError, ValueError):
        return None
    if ndim < 0 or all(v >= 0 for v in values):
        return None
    rest = dict(zip(("begin", "end", "strides"), call.args[2:]))
    return relax.op.strided_slice(x, axes=[v % ndim for v in values], assume_inbound=bool(call.attrs.assume_inbound),
                                  **rest)


def _identity_cast(call, _builder):
    """astype to the dtype the tensor already has: the tensor itself (transformers' GPT-2 casts its
    attention probabilities to V's dtype; under torch.compile(dynamic=True) the cast stood between
    the softmax and the matmul with V, so no flash attention was matched: 662 vs 507 ms at 384 tokens)."""
    x = call.args[0]
    if isinstance(x.ty, relax.TensorType) and str(x.ty.dtype) == str(call.attrs.dtype):
        return x
    return None


def normalize(mod: tvm.IRModule, fold_constants: bool = True, ranges: dict | None = None) -> tvm.IRModule:
    """`ranges` ({symbolic var name: (min, max)}, from torch.export's Dims) tighten symbolic shapes
    (tighten_shapes.py) once the bindings are canonical."""
    from ..relax_utils import rewrite_op_calls

    T = relax.transform
    mod = rewrite_op_calls(mod, "relax.strided_slice", _nonnegative_slice_axes)
    mod = rewrite_op_calls(mod, "relax.astype", _identity_cast)
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential([T.DecomposeOpsForInference(), T.CanonicalizeBindings()])(mod)
        if ranges:
            from ..build import RANGES_ATTR
            from .tighten_shapes import tighten

            mod = tighten(mod, ranges)
            mod["main"] = mod["main"].with_attr(RANGES_ATTR, {k: [lo, hi] for k, (lo, hi) in ranges.items()})
        passes = []
        if fold_constants:  # all at once first (one build), then TVM's own pass for what that declined
            from ..passes.fold_constants import fold_all

            passes.append(fold_all())
        passes.append(T.DeadCodeElimination())
        return tvm.transform.Sequential(passes)(mod)


def finish(mod: tvm.IRModule, params: str, do_normalize: bool, ranges: dict | None = None):
    """The shared tail of the torch and ONNX importers: weights detached as trailing inputs when
    params == "inputs" (returns (mod, weights)), else kept as constants and folded; normalized
    (symbolic shapes tightened by `ranges`, see normalize)."""
    weights = None
    if params == "inputs":
        mod, detached = relax.frontend.detach_params(mod)
        weights = [np.asarray(p.numpy()) for p in detached.get("main", [])]
    if do_normalize:
        mod = normalize(mod, fold_constants=params == "constants", ranges=ranges)
    return mod if weights is None else (mod, weights)


def read_path(path, what: str, suffixes: tuple[str, ...] = ()) -> str:
    """The path as a str, or a FrontendError saying the file is missing (and what was expected)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        hint = f" (expected a {'/'.join(suffixes)} file)" if suffixes else ""
        raise FrontendError(f"{what}: no such file '{path}'{hint}; check the path (relative paths are "
                            f"taken from {os.getcwd()})")
    return path


def input_specs(mod: tvm.IRModule) -> list[tuple[str, tuple, str]]:
    """(name, static shape or None, dtype) of main's parameters, in order."""
    return [(p.name, static_shape(p.ty), str(p.ty.dtype)) for p in mod["main"].params]


def random_inputs(specs, seed: int = 0, int_high: int = 8) -> list[np.ndarray]:
    """Deterministic inputs for a module whose inputs nobody gave: normal floats, ints in
    [0, int_high), random bools. Integer inputs are usually ids or indices, hence small and >= 0."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, dtype in specs:
        if shape is None:
            raise FrontendError(f"input '{name}' has a symbolic shape; give concrete inputs (or shapes=)")
        if dtype.startswith(("int", "uint")):
            out.append(rng.integers(0, int_high, size=shape).astype(dtype))
        elif dtype == "bool":
            out.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out
