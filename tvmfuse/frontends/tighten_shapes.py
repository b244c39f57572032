"""TightenShapes: simplify symbolic shapes with the ranges the exporter declared (torch.export Dims).

Contract: `tighten(mod, ranges)` takes the imported module and {symbolic var name: (min, max)}. In
each binding of `main` whose tensor type has a shape expression that the ranges simplify (the
analyzer bound with every named var's range), the value is bound as before and then reshaped to the
simplified shape (the same elements: a view, and an injective op fusion folds into its consumer);
later bindings read the reshaped var, so shape inference downstream sees the simple shape. Nothing
else changes; the shapes agree by the declared ranges. (A match_cast would say the same, but TVM
0.27's CanonicalizeBindings segfaults on it: measured.)

Why: transformers' BERT slices its position-id buffer `[1, 512]` to the sequence length `s`. TVM's
strided_slice infers `[1, min(s, 512)]`, and the next `add` with a `[1, s, d]` tensor can no longer
prove the shapes equal: its result, and every op after it, has an unknown shape (`ndim=3`), which
legalization rejects with a bare AssertionError ("emit_te now only supports Tensor that has
ShapeExpr shape"). Under `s <= 512`, `min(s, 512)` is `s`.

Must not fire: a module without symbolic vars, or ranges that simplify nothing.
"""
from __future__ import annotations

import tvm
from tvm import relax


def _analyzer(func, ranges):
    from tvm.sym import Analyzer

    a = Analyzer()
    bound = False
    for p in func.params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
            continue
        for d in ty.shape.values:
            for v in tvm.tirx.analysis.undefined_vars(d):
                if v.name in ranges:
                    lo, hi = ranges[v.name]
                    t = str(v.ty)
                    a.bind(v, tvm.ir.Range(tvm.tirx.const(lo, t), tvm.tirx.const(hi + 1, t)))
                    bound = True
    return a if bound else None


def _tightened(ty, analyzer):
    """The tensor type with its shape simplified, or None when nothing simplifies."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    old = list(ty.shape.values)
    new = [analyzer.simplify(d) for d in old]
    if all(str(a) == str(b) for a, b in zip(old, new)):
        return None
    return relax.TensorType(new, ty.dtype)


@relax.expr_functor.mutator
class _Tighten(relax.PyExprMutator):
    def __init__(self, mod, analyzer):
        super().__init__(mod)
        self.analyzer = analyzer
        self.casts = 0

    def visit_var_binding_(self, binding):
        value = self.builder_.normalize(self.visit_expr(binding.value))
        kind = type(binding.var)
        tight = _tightened(value.ty, self.analyzer)
        if tight is None:
            new = kind(binding.var.name, value.ty)
            self.builder_.emit_normalized(relax.VarBinding(new, value))
        else:
            loose = kind(binding.var.name + "_loose", value.ty)
            self.builder_.emit_normalized(relax.VarBinding(loose, value))
            view = self.builder_.normalize(relax.op.reshape(loose, relax.ShapeExpr(list(tight.shape.values))))
            new = kind(binding.var.name, view.ty)
            self.builder_.emit_normalized(relax.VarBinding(new, view))
            self.casts += 1
        self.set_var_remap(binding.var, new)


def tighten(mod: tvm.IRModule, ranges: dict) -> tvm.IRModule:
    func = mod["main"]
    analyzer = _analyzer(func, ranges) if ranges else None
    if analyzer is None:
        return mod
    m = _Tighten(mod, analyzer)
    new = m.visit_expr(func)
    if not m.casts:
        return mod
    out = mod.clone() if hasattr(mod, "clone") else tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    out["main"] = new
    return relax.transform.Normalize()(out)


def export_ranges(ep) -> dict:
    """{symbol name: (min, max)} from a torch ExportedProgram's range constraints (finite ones)."""
    out = {}
    for sym, vr in getattr(ep, "range_constraints", {}).items():
        try:
            out[str(sym)] = (int(vr.lower), int(vr.upper))
        except (TypeError, ValueError, OverflowError, AttributeError):  # an unbounded side (int_oo)
            continue
    return out
