"""A single-kernel in-place build called without the VM: a fused optimizer step.

Contract: `kernel_call(compiled, module)` returns `run(tensors) -> tuple | None` for a build whose
main is one `call_tir_inplace` over main's parameters that writes every output into one of them
and returns only those (the fused optimizer step over every parameter, frontends/torch_update.py
with passes/update_in_place.py), else None. `module` is the build's executable as loaded for
PyTorch's threads (torch_threads.module_on_torch_threads). `run` calls the kernel itself with the
torch tensors in its parameter order and returns main's outputs: the input tensors it wrote. It
returns None, having run nothing, where a tensor is empty or not 64-byte aligned (TVM's kernels
assume the alignment and do not check it) or is strided (the kernel's own entry check raises
before it writes anything): the caller then goes through the VM (torch_tensors.call), which gets
dense copies.

Why: the VM checks every argument against main's signature, and the kernel's entry checks them
again. On the MLP's SGD step (18 tensors, one kernel) a call through the VM took 18 us and this
one 4 us; eager PyTorch's whole step takes about 50.
"""
from __future__ import annotations

import tvm
from tvm import relax

ALIGNMENT = 64  # bytes, as torch_tensors.TVM_ALIGNMENT


def kernel_call(compiled, module):
    """`run(tensors)` for a build of one in-place kernel (see the module docstring), or None."""
    if compiled.kernel_function != "main":
        return None
    plan = _plan(compiled.launched["main"])
    if plan is None:
        return None
    kernel, arg_params, out_params = plan
    try:  # exported under its GlobalVar's name (the PrimFunc's own global_symbol may be stale)
        fn = module.get_function(kernel, query_imports=True)
    except Exception:  # noqa: BLE001 - not exported under that name: the VM path
        return None
    if fn is None:
        return None

    def run(tensors):
        args = [tensors[k] for k in arg_params]
        for t in args:
            p = t.data_ptr()
            if not p or p % ALIGNMENT:
                return None
        try:
            fn(*args)
        except ValueError as err:  # a strided tensor: rejected by the kernel's entry, nothing written
            if "strides" not in str(err):
                raise
            return None
        return tuple(tensors[k] for k in out_params)

    return run


def _plan(main):
    """(kernel name, main's parameter index of each kernel argument, main's parameter index of
    each output) when main is one call_tir_inplace writing every output into a parameter; else None."""
    inplace_op = tvm.ir.Op.get("relax.call_tir_inplace")
    params = {p: i for i, p in enumerate(main.params)}
    if not isinstance(main.body, relax.SeqExpr):
        return None
    call_var, call, items, tuples = None, None, {}, {}
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and v.op.same_as(inplace_op) and call is None:
                call_var, call = b.var, v
            elif isinstance(v, relax.TupleGetItem) and call_var is not None and v.tuple_value.same_as(call_var):
                items[b.var] = int(v.index)
            elif isinstance(v, relax.Tuple):
                tuples[b.var] = v
            elif isinstance(v, relax.Var) and v in items:
                items[b.var] = items[v]
            else:
                return None  # anything else runs in the VM
    if call is None:
        return None
    args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
    if not all(isinstance(a, relax.Var) and a in params for a in args):
        return None
    inplace = [int(i) for i in call.attrs.inplace_indices]
    if any(i < 0 for i in inplace):
        return None  # an output the kernel allocates
    ret = main.body.body
    ret = tuples.get(ret, ret)
    fields = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret]
    outs = []
    for f in fields:
        if f.same_as(call_var) and len(inplace) == 1:
            k = 0
        elif isinstance(f, relax.Var) and f in items:
            k = items[f]
        else:
            return None
        outs.append(params[args[inplace[k]]])
    return call.args[0].name_hint, [params[a] for a in args], outs
