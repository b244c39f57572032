"""Torch tensors in and out of a tvmfuse build without copies (DLPack).

Contract: `call(compiled, tensors)` runs `compiled` (a build.Compiled for llvm) on CPU torch
tensors and returns its outputs as torch tensors (a tuple, one per output). A tensor TVM can take
as it is (dense, row-major, its data 64-byte aligned: TVM's kernels assume the alignment) goes to
the VM as the torch tensor itself, which tvm-ffi passes through DLPack, and the outputs come back as
torch tensors viewing TVM's memory; any other input is made dense by torch first (`_dense`). An
output that shares memory with an input (a graph that returns an input) is cloned, so the caller's tensors never alias
each other unexpectedly. The kernels run on PyTorch's OpenMP threads where that can be set up
(torch_threads.py). Per call this costs about 18 µs for 11 inputs, against 144 µs through
tvm.runtime Tensors with Compiled's checks and several hundred through numpy copies (a compiled
optimizer step over 18 tensors spent 0.8 ms in them against 57 µs for eager PyTorch's whole step).
"""
from __future__ import annotations

import torch
import tvm
import tvm_ffi

from . import torch_direct, torch_threads

TVM_ALIGNMENT = 64  # bytes: tvm.runtime.from_dlpack's requirement (and what TVM's buffers declare)


def _view_ok(t: torch.Tensor) -> bool:
    return (t.device.type == "cpu" and t.layout == torch.strided and t.is_contiguous()
            and not t.is_conj() and not t.is_neg() and t.data_ptr() % TVM_ALIGNMENT == 0)


def to_tvm(t: torch.Tensor):
    """A torch tensor as a tvm.runtime.Tensor on the CPU: a view when TVM can take one, else a copy."""
    t = t.detach()
    if _view_ok(t) and t.numel():
        return tvm.runtime.from_dlpack(t)
    return tvm.runtime.tensor(t.contiguous().numpy().reshape(tuple(t.shape)), tvm.cpu(0))


def _dense(t: torch.Tensor):
    """A tensor TVM cannot take as it is (strided: an expanded gradient, a transposed saved
    tensor; or unaligned), made dense by torch (its allocator aligns to 64 bytes); through a copy
    into a tvm.runtime.Tensor only where that is still not enough (an empty tensor). The numpy
    route this replaces cost about 100 us a call on a small training step's expanded gradient."""
    d = t.detach()
    d = d.contiguous() if not d.is_contiguous() else d.clone()
    if d.numel() and d.data_ptr() % TVM_ALIGNMENT == 0 and _view_ok(d):
        return d
    return to_tvm(t)


def _main(compiled):
    """`compiled`'s main for this thread, its kernels on PyTorch's OpenMP threads where that can be
    set up (torch_threads.py), else the build's own (TVM's thread pool)."""
    local = compiled._local
    main = getattr(local, "torch_main", None)
    if main is None:
        module = torch_threads.module_on_torch_threads(compiled)
        local.torch_direct = None if module is None else torch_direct.kernel_call(compiled, module)
        main = None if module is None else tvm.relax.VirtualMachine(module, tvm.cpu(0))["main"]
        main = local.torch_main = main or compiled._main()
    return main


def call(compiled, tensors, donated=None) -> tuple:
    """Run `compiled` on torch tensors; its outputs as torch tensors (see the module docstring).
    `donated` ({output index: input index}): outputs the build writes into an input's memory (an
    update written in place, passes/update_in_place.py); each is returned as that input itself,
    not fetched from the VM's result nor cloned, unless the input had to be made dense (then the
    kernel wrote the copy, and its output is returned).
    No shape or dtype check here: the callers run graphs dynamo and AOTAutograd traced for these
    very shapes and dtypes (their guards recompile on any other), and a failing call is theirs to
    report."""
    main = _main(compiled)
    direct = compiled._local.torch_direct  # in-place kernels, called without the VM (torch_direct.py)
    if direct is not None and (out := direct(tensors)) is not None:
        return out
    args = [t if t.data_ptr() % TVM_ALIGNMENT == 0 and t.is_contiguous() and t.numel() else _dense(t)
            for t in tensors]
    out = main(*args)  # tvm-ffi takes torch tensors through DLPack and returns torch tensors
    if isinstance(out, (torch.Tensor, tvm.runtime.Tensor)):
        outs, n = (out,), 1
    else:
        outs, n = out, len(out)
    donated = donated or {}
    fresh = _fresh_outputs(compiled)
    ptrs = None  # the inputs' addresses, taken only when an output that may alias one is fetched
    result = []
    for j in range(n):
        i = donated.get(j)
        if i is not None and args[i] is tensors[i]:
            result.append(tensors[i])
            continue
        o = outs[j] if n == 1 else _array_item(outs, j)
        r = o if isinstance(o, torch.Tensor) else torch.from_dlpack(o)
        if j not in fresh and r.numel():
            if ptrs is None:
                inputs = set(donated.values())
                ptrs = {t.data_ptr() for k, t in enumerate(tensors) if t.numel() and k not in inputs}
            if r.data_ptr() in ptrs:
                r = r.clone()
        result.append(r)
    return tuple(result)


def _fresh_outputs(compiled) -> frozenset:
    """Indices of main's outputs that are a kernel's own new tensor (bound to a call_tir, or an
    element of one's tuple), which cannot share memory with an input: the aliasing check is skipped
    for them (about 0.5 us an output; a ResNet's forward returns 47). Any other output (an input, a
    view of one, a value written in place) is checked at each call. Cached on `compiled`."""
    cached = compiled.__dict__.get("_torch_fresh_outputs")
    if cached is not None:
        return cached
    from tvm import relax

    func = compiled.launched["main"]  # reshapes that lowering makes views are R.reshape here
    call_tir = tvm.ir.Op.get("relax.call_tir")
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}

    def fresh(expr) -> bool:
        value = bound.get(expr)
        if isinstance(value, relax.TupleGetItem):
            value = bound.get(value.tuple_value)
        return isinstance(value, relax.Call) and value.op.same_as(call_tir)

    ret = func.body.body
    ret = bound.get(ret, ret) if isinstance(bound.get(ret), relax.Tuple) else ret  # R.output(gv), gv = (..)
    items = list(ret.fields) if isinstance(ret, relax.Tuple) else [ret]
    cached = frozenset(j for j, e in enumerate(items) if fresh(e))
    compiled.__dict__["_torch_fresh_outputs"] = cached
    return cached


# one element of a tvm-ffi Array, without the Python-level index checks of Array.__getitem__
# (about 1.4 us an element, as much as a small kernel on a graph with 40 outputs)
_array_item = tvm_ffi.get_global_func("ffi.ArrayGetItem")
