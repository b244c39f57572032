"""A training graph's outputs that are views of its inputs (frontends/torch_views.py): AOTAutograd's
forward saves a Linear's weight transpose for the backward; it is handed back as a view of the
weight, not computed by a transpose kernel and copied into AOT's strides."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tvmfuse.frontends import torch_train, torch_views


def _linear_forward(w, x):
    t = torch.ops.aten.permute.default(w, [1, 0])
    return torch.ops.aten.mm.default(x, t), t


def test_a_saved_weight_transpose_is_a_view_of_the_weight():
    w, x = torch.randn(16, 8), torch.randn(4, 8)
    gm = make_fx(_linear_forward)(w, x)
    run, compiled = torch_train.compile_aten_graph(gm, [w, x])
    y, t = run([w, x])
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-5)
    assert t.data_ptr() == w.data_ptr() and t.stride() == (1, 8) and t.shape == (8, 16)  # no copy
    assert compiled.launches == 1  # the matmul alone: no transpose kernel for the saved output


def test_a_chain_of_views_with_constant_arguments_is_replayed():
    def f(w):
        v = torch.ops.aten.view.default(w, [4, 6])
        return (torch.ops.aten.permute.default(v, [1, 0]),)

    w = torch.randn(24)
    gm = make_fx(f)(w)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index, steps = torch_views.input_view(out, placeholders)
    assert index == 0 and len(steps) == 2
    got = torch_views.replay(w, steps)
    assert got.data_ptr() == w.data_ptr() and torch.equal(got, w.view(4, 6).T)


def test_a_computed_value_is_not_a_view_of_an_input():
    """Must not fire: a permute of a computed tensor, and a copy (clone) of an input."""
    def f(w):
        return (torch.ops.aten.permute.default(torch.ops.aten.mul.Tensor(w, 2.0), [1, 0]),
                torch.ops.aten.clone.default(w))

    gm = make_fx(f)(torch.randn(3, 5))
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [torch_views.input_view(o, placeholders) for o in outs] == [None, None]
