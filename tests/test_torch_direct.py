"""frontends/torch_direct.py: an in-place build (the fused optimizer step) called without the VM,
one kernel or several. Each call's results equal the VM's on the same tensors; a strided or
unaligned tensor goes through the VM instead, with nothing written before; a forward or backward
build (kernels that allocate their outputs) is never called directly."""
import pytest
import torch

from tvmfuse.frontends import torch_direct, torch_records, torch_tensors

from test_torch_training import MLP  # Linear, GELU, Linear, LayerNorm


def _sgd_update_build(**options):
    """The tvmfuse build of the MLP's SGD step with momentum (one in-place kernel, or several with a
    small `horizontal_max_ops`)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    before = {id(r) for r in torch_records.RECORDS}
    step = torch.compile(opt.step, backend="tvmfuse", options={"fallback": "error", **options})
    for _ in range(2):  # the first step has no momentum buffers yet: the second graph is the steady one
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        step()
    (record,) = [r for r in torch_records.RECORDS if id(r) not in before and r.kind == "update"][-1:]
    return record.compiled


def _tensors(compiled, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _, shape, _ in compiled.params]


def _vm(compiled, tensors):
    """main through the VM on copies of `tensors`: (the copies after the call, its outputs)."""
    copies = [t.clone() for t in tensors]
    out = torch_tensors._main(compiled)(*copies)
    return copies, [out[j] for j in range(len(out))]


@pytest.mark.parametrize("max_ops", [256, 8])
def test_the_update_is_called_directly_and_equals_the_vm(max_ops):
    c = _sgd_update_build(horizontal_max_ops=max_ops)
    assert (c.launches == 1) == (max_ops == 256)
    plan = torch_direct._plan(c.launched["main"])
    assert plan is not None and [k for k, _ in plan[0]] == c.call_sites()
    tensors = _tensors(c, 1)
    want_inputs, want = _vm(c, tensors)
    main = torch_tensors._main(c)

    def no_vm(*args):
        raise AssertionError("the VM was called")

    c._local.torch_main = no_vm  # a VM call would now fail
    try:
        got = torch_tensors.call(c, tensors)
    finally:
        c._local.torch_main = main
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    for g, w in zip(tensors, want_inputs):  # written in place, as the VM writes
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    outs = plan[1]
    assert all(g is tensors[k] for g, k in zip(got, outs))  # the updated inputs themselves


@pytest.mark.parametrize("max_ops", [256, 8])
def test_strided_or_unaligned_tensors_go_through_the_vm(max_ops):
    c = _sgd_update_build(horizontal_max_ops=max_ops)
    calls, outs = torch_direct._plan(c.launched["main"])
    arg_params = [k for _, ks in calls for k in ks]
    reads = [k for k in arg_params if k not in outs and len(c.params[k][1]) == 2]  # a 2-D gradient
    assert reads
    k = reads[0]
    for make in ("strided", "unaligned"):
        tensors = _tensors(c, 2)
        _copies, want = _vm(c, tensors)
        t = tensors[k]
        if make == "strided":
            tensors[k] = t.t().contiguous().t()
            assert not tensors[k].is_contiguous()
        else:
            buf = torch.empty(t.numel() + 1)
            tensors[k] = buf[1:].view(t.shape).copy_(t)
            assert tensors[k].data_ptr() % torch_tensors.TVM_ALIGNMENT
        assert c._local.torch_direct(tensors) is None  # declined, nothing run
        got = torch_tensors.call(c, tensors)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_must_not_fire_on_builds_that_allocate_outputs():
    from tvmfuse.frontends.torch_train import compile_training

    torch.manual_seed(0)
    model, x = MLP(), torch.randn(8, 32)
    build = compile_training(model, x)
    for c in build.forward + build.backward:
        assert c.launches > 1 and torch_direct._plan(c.launched["main"]) is None
        assert c._local.torch_direct is None
