"""AddShapeBuckets: one build that carries a static specialization per shape bucket and a generic
symbolic version for every other size, dispatched at run time inside the one compiled module.

Contract: `add_buckets(mod, buckets)` takes a module whose Relax "main" has symbolic dims and
`buckets` {dim name: [sizes]} (`{"seq": [32, 64, 128]}`), and returns a module where
  - `main__generic` is main as it was (fresh variables): the symbolic kernels for every size;
  - `main__<dim>_<size>[__<dim>_<size>...]` is main with those dims bound, one per combination of
    sizes (BindSymbolicVars: every shape static, so its kernels are static kernels, scheduled and
    tuned, records included, exactly as a static model's are);
  - `main` dispatches on the dims' runtime values: a chain of If's, each bucket's branch matching its
    static input shapes (match_cast) and casting the result back to main's return type, the last
    branch calling `main__generic`. main keeps its parameters and attributes (declared ranges).
main is stamped with `tvmfuse.buckets` (JSON: [[{dim: size, ...}, function name], ...]), which
`Compiled` reads. The math is main's at every size: each version is main with some dims fixed.
Bad buckets (a dim main does not have, a size outside the dim's declared range, no sizes, more than
MAX_BUCKETS combinations) raise InputError saying which and how to fix it.
"""
from __future__ import annotations

import itertools
import json

import tvm
from tvm import relax

from ..errors import InputError

ATTR = "tvmfuse.buckets"
RANGES_ATTR = "tvmfuse.ranges"  # the importer's declared {dim: [min, max]} (build.RANGES_ATTR)
MAX_BUCKETS = 64  # combinations: each is a whole specialized copy of the model's kernels


def _symbolic_vars(func) -> dict:
    """{name: tir Var} of the symbolic dims in main's parameter shapes."""
    out = {}
    for p in func.params:
        shape = getattr(p.ty, "shape", None)
        for v in getattr(shape, "values", None) or ():
            if isinstance(v, tvm.tirx.Var):
                out.setdefault(v.name, v)
    return out


def _check(func, buckets: dict) -> list[dict]:
    """The bucket combinations [{dim: size}], in order, or InputError."""
    if not isinstance(buckets, dict) or not buckets:
        raise InputError(f"buckets must be a dict {{dim name: [sizes]}}, e.g. {{'seq': [32, 64, 128]}}; got {buckets!r}")
    syms = _symbolic_vars(func)
    ranges = func.attrs.get(RANGES_ATTR) if func.attrs is not None else None
    ranges = {str(k): (int(v[0]), int(v[1])) for k, v in dict(ranges or {}).items()}
    for dim, sizes in buckets.items():
        if dim not in syms:
            have = ", ".join(sorted(syms)) or "none: every input shape is static"
            raise InputError(f"bucket dim {dim!r} is not a symbolic dim of main's inputs (they are: {have})")
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes):
            raise InputError(f"bucket dim {dim!r}: give a non-empty list of int sizes, got {sizes!r}")
        lo, hi = ranges.get(dim, (1, None))
        bad = [s for s in sizes if s < max(lo, 1) or (hi is not None and s > hi)]
        if bad:
            raise InputError(f"bucket dim {dim!r}: sizes {bad} are outside its declared range [{lo}, {hi}]; "
                             "drop them or import with a wider torch.export Dim")
    dims = list(buckets)
    combos = [dict(zip(dims, sizes)) for sizes in itertools.product(*(sorted(set(buckets[d])) for d in dims))]
    if len(combos) > MAX_BUCKETS:
        raise InputError(f"{len(combos)} bucket combinations (the product of the sizes of {dims}); at most "
                         f"{MAX_BUCKETS}: each is a whole specialized copy of the model's kernels")
    return combos


def _renamed(func, name: str):
    """A copy of main under another name: its global symbol (when it has one) follows."""
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.with_attr("global_symbol", name)
    return func


def _name(combo: dict) -> str:
    return "main__" + "__".join(f"{d}_{s}" for d, s in combo.items())


def _branch(params, callee_gv, bound, ret_ty) -> relax.SeqExpr:
    """Call the bucket's version with main's `params` cast to its shapes, the result cast back to
    main's `ret_ty`. `bound` is main with the bucket's dims bound but its other symbolic vars main's
    own (already defined by main's parameters): the casts define no var of another function."""
    bindings, args = [], []
    for p, q in zip(params, bound.params):
        if tvm_ffi_equal(p.ty, q.ty):
            args.append(p)
        else:
            v = relax.Var(f"{p.name}_b", q.ty)
            bindings.append(relax.MatchCast(v, p, q.ty))
            args.append(v)
    r = relax.Var("r_b", bound.ret_ty)
    bindings.append(relax.VarBinding(r, relax.Call(callee_gv, args)))
    out = relax.Var("out_b", ret_ty)
    bindings.append(relax.MatchCast(out, r, ret_ty))
    return relax.SeqExpr([relax.BindingBlock(bindings)], out)


def tvm_ffi_equal(a, b) -> bool:
    import tvm_ffi

    return bool(tvm_ffi.structural_equal(a, b))


def add_buckets(mod: tvm.IRModule, buckets: dict) -> tvm.IRModule:
    main = mod["main"]
    combos = _check(main, buckets)
    syms = _symbolic_vars(main)
    rest = {gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"}
    bb = relax.BlockBuilder(tvm.IRModule(rest, attrs=mod.attrs))  # typed GlobalVars for the new functions
    generic = _renamed(relax.utils.copy_with_new_vars(main), "main__generic")
    gv_generic = bb.add_func(generic, "main__generic")
    specialized = []
    for combo in combos:
        bound = relax.transform.BindSymbolicVars({syms[d]: s for d, s in combo.items()})(tvm.IRModule({"main": main}))
        f = _renamed(relax.utils.copy_with_new_vars(bound["main"]), _name(combo))
        gv = bb.add_func(f, _name(combo))
        specialized.append((combo, gv, bound["main"]))  # its types in main's own vars (not f's fresh ones)
    # main: a chain of If's over the buckets, the generic version last
    params = list(main.params)
    ret_ty = main.ret_ty
    r = relax.Var("r_g", ret_ty)  # main's own type: the generic version is main under another name
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(r, relax.Call(gv_generic, params))])], r)
    for combo, gv, f in reversed(specialized):
        cond = None
        for d, s in combo.items():
            v = syms[d]
            eq = tvm.tirx.EQ(v, tvm.tirx.const(s, str(v.ty)))
            cond = eq if cond is None else tvm.tirx.And(cond, eq)
        res = relax.Var("res", ret_ty)
        body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(
            res, relax.If(cond, _branch(params, gv, f, ret_ty), body))])], res)
    table = [[combo, gv.name_hint] for combo, gv, _f in specialized]
    dispatcher = relax.Function(params, body, ret_ty, main.is_pure, main.attrs, main.span).with_attr(
        ATTR, json.dumps(table))
    bb.add_func(dispatcher, "main")
    return relax.transform.Normalize()(bb.get())


def table(func) -> list:
    """[(combo, function name)] of a bucketed main (from its `tvmfuse.buckets`); [] otherwise."""
    text = func.attrs.get(ATTR) if getattr(func, "attrs", None) is not None else None
    return [(dict(c), n) for c, n in json.loads(str(text))] if text else []
