"""schedules/flat_views.py: an elementwise nest whose rows are shorter than a vector, rewritten over
flat views of its buffers (cpu.Injective applies it), and the cases where it must not fire. The
rewritten kernels are checked against numpy through tvmfuse.build."""
import numpy as np
import tvm
from tvm import relax, s_tir, te
from tvm.relax import op as R

import tvmfuse
from schedules.flat_views import flat_views

from conftest import assert_matches

SHAPE = (32, 32, 3, 3)  # a 3x3 conv weight
SHORT = lambda extents: extents[-1] < 16  # noqa: E731


def _func(fcompute, *shapes):
    ins = [te.placeholder(s, name=n) for s, n in zip(shapes, "ABCD")]
    out = te.compute(shapes[0], lambda *i: fcompute(ins, i), name="out")
    return te.create_prim_func(ins + [out])


def _blocks(func):
    sch = s_tir.Schedule(func)
    return [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]


def test_golden_a_short_row_nest_is_one_flat_loop_over_views():
    func = _func(lambda ins, i: tvm.tirx.exp(ins[0](*i)) * ins[2]()
                 + tvm.tirx.Select(ins[1](*i) > 0, ins[1](*i), ins[0](*i)), SHAPE, SHAPE, ())
    out = flat_views(func, SHORT)
    assert out is not func
    (block,) = _blocks(out)
    assert [int(iv.dom.extent) for iv in block.iter_vars] == [32 * 32 * 9]
    text = out.script()
    for name in ("A_flat", "B_flat", "out_flat"):
        assert name in text
    assert "S[()]" not in text and "C[()]" in text  # the scalar is read as it is
    assert "//" not in text and "%" not in text


def test_must_not_fire():
    """A broadcast read, a transposed read, a reduction and rows as long as a vector stay as they are."""
    cases = [
        _func(lambda ins, i: ins[0](*i) + ins[1](i[1]), SHAPE, (32,)),  # a per-channel bias
        _func(lambda ins, i: ins[1](i[1], i[0], i[2], i[3]), SHAPE, SHAPE),  # a transpose
        _func(lambda ins, i: ins[0](*i) * 2.0, (8, 64)),  # rows of 64
    ]
    for func in cases:
        assert flat_views(func, SHORT) is func
    k = te.reduce_axis((0, 3))
    a = te.placeholder((32, 3), name="A")
    total = te.create_prim_func([a, te.compute((32,), lambda i: te.sum(a[i, k], axis=k))])
    assert flat_views(total, lambda extents: True) is total


def _update(shape):
    """p - 0.05 * (0.9 * m + g): an SGD momentum step on one tensor."""
    bb = relax.BlockBuilder()
    p, g, m = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "pgm")
    with bb.function("main", [p, g, m]):
        with bb.dataflow():
            buf = bb.emit(R.add(R.multiply(m, relax.const(0.9, "float32")), g))
            new = bb.emit(R.subtract(p, R.multiply(buf, relax.const(0.05, "float32"))))
            out = bb.emit_output(relax.Tuple([new, buf]))
        bb.emit_func_output(out)
    return bb.get()


def test_injective_schedules_a_conv_weight_update_over_flat_views():
    c = tvmfuse.build(_update(SHAPE), "llvm", "tvmfuse")
    assert c.launches == 1 and c.rules() == ["cpu.Injective"]
    (kernel,) = c.call_sites()
    assert "_flat" in c.mod[kernel].script()
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(SHAPE).astype("float32") for _ in range(3))
    new, buf = c(p, g, m)
    assert_matches(buf, 0.9 * m + g, 1e-6, 1e-6)
    assert_matches(new, p - 0.05 * (0.9 * m + g), 1e-6, 1e-6)
    wide = tvmfuse.build(_update((32, 64)), "llvm", "tvmfuse")  # rows of a whole vector: as before
    assert "_flat" not in wide.mod[wide.call_sites()[0]].script()


def test_a_conv_weight_step_over_flat_views_is_still_written_in_place():
    """passes/update_in_place.py sees through the views: the SGD step of a conv's [8, 4, 3, 3]
    weight writes the weight and its momentum in place, and equals eager's at every step."""
    import copy

    import torch

    from tvmfuse.frontends import torch_records

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.Conv2d(8, 8, 3))
    ref = copy.deepcopy(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, ref))
    before = {id(r) for r in torch_records.RECORDS}
    step = torch.compile(opt.step, backend="tvmfuse", options={"fallback": "error"})
    for i in range(3):
        gen = torch.Generator().manual_seed(i)
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = 0.1 * torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        step()
        ref_opt.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    record = [r for r in torch_records.RECORDS if id(r) not in before and r.kind == "update"][-1]
    c = record.compiled
    assert record.copies == 0 and c.launches == 1
    assert "_flat" in c.mod[c.call_sites()[0]].script()
