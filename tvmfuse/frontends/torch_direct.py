"""An in-place build called without the VM: a fused optimizer step.

Contract: `kernel_call(compiled, module)` returns `run(tensors) -> tuple | None` for a build whose
main is a sequence of `call_tir_inplace`, each over main's parameters only, that writes every
output into a parameter and returns only those (the fused optimizer step, frontends/torch_update.py
with passes/update_in_place.py: one kernel, or a few when the step exceeds `horizontal_max_ops`),
else None. `module` is the build's executable as loaded for PyTorch's threads
(torch_threads.module_on_torch_threads). `run` calls the kernels themselves, in main's order, with
the torch tensors in each one's parameter order, and returns main's outputs: the input tensors
they wrote. It returns None, having run nothing, where a tensor is empty or not 64-byte aligned
(TVM's kernels assume the alignment and do not check it) or is strided (one kernel: its own entry
check raises before it writes anything; several: checked here first, since a later kernel's
refusal would come after an earlier one wrote): the caller then goes through the VM
(torch_tensors.call), which gets dense copies.

Why: the VM checks every argument against main's signature, and the kernel's entry checks them
again. On the MLP's SGD step (18 tensors, one kernel) a call through the VM took 18 us and this
one 4 us; eager PyTorch's whole step takes about 50.
"""
from __future__ import annotations

import tvm
from tvm import relax

ALIGNMENT = 64  # bytes, as torch_tensors.TVM_ALIGNMENT


def kernel_call(compiled, module):
    """`run(tensors)` for an in-place build (see the module docstring), or None."""
    if compiled.kernel_function != "main":
        return None
    plan = _plan(compiled.launched["main"])
    if plan is None:
        return None
    calls, out_params = plan
    fns = []
    for kernel, arg_params in calls:
        try:  # exported under its GlobalVar's name (the PrimFunc's own global_symbol may be stale)
            fn = module.get_function(kernel, query_imports=True)
        except Exception:  # noqa: BLE001 - not exported under that name: the VM path
            return None
        if fn is None:
            return None
        fns.append((fn, arg_params))
    used = sorted({k for _, arg_params in calls for k in arg_params})
    check_strides = len(fns) > 1

    def run(tensors):
        for k in used:
            t = tensors[k]
            p = t.data_ptr()
            if not p or p % ALIGNMENT or check_strides and not t.is_contiguous():
                return None
        try:
            for fn, arg_params in fns:
                fn(*[tensors[k] for k in arg_params])
        except ValueError as err:  # one kernel: a strided tensor, rejected at its entry, nothing written
            if check_strides or "strides" not in str(err):
                raise
            return None
        return tuple(tensors[k] for k in out_params)

    return run


def _plan(main):
    """([(kernel name, main's parameter index of each of its arguments)] in call order, main's
    parameter index of each output) when main is a sequence of call_tir_inplace over its
    parameters writing every output into one of them; else None."""
    inplace_op = tvm.ir.Op.get("relax.call_tir_inplace")
    params = {p: i for i, p in enumerate(main.params)}
    if not isinstance(main.body, relax.SeqExpr):
        return None
    calls, results, tuples = [], {}, {}  # results: var -> main's parameter the kernel wrote it into
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.same_as(inplace_op):
                args = list(v.args[1].fields) if isinstance(v.args[1], relax.Tuple) else [v.args[1]]
                inplace = [int(i) for i in v.attrs.inplace_indices]
                if not all(isinstance(a, relax.Var) and a in params for a in args) or any(i < 0 for i in inplace):
                    return None  # an argument computed in the graph, or an output the kernel allocates
                calls.append((v.args[0].name_hint, [params[a] for a in args]))
                written = [params[args[i]] for i in inplace]
                results[b.var] = written[0] if len(written) == 1 else written
            elif isinstance(v, relax.TupleGetItem) and isinstance(results.get(v.tuple_value), list):
                results[b.var] = results[v.tuple_value][int(v.index)]
            elif isinstance(v, relax.Tuple):
                tuples[b.var] = v
            elif isinstance(v, relax.Var) and v in results:
                results[b.var] = results[v]
            else:
                return None  # anything else runs in the VM
    ret = main.body.body
    ret = tuples.get(ret, ret)
    fields = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret]
    outs = [results.get(f) if isinstance(f, relax.Var) else None for f in fields]
    if not calls or any(not isinstance(o, int) for o in outs):
        return None
    return calls, outs
