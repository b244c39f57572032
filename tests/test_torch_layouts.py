"""tvmfuse.frontends.torch_layouts: a permuted input of an ATen graph is taken as its dense base
and permuted inside the graph; contiguous, expanded and sliced inputs are left alone. The
compiled graph computes the same values, and its main takes the base's shape."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tvmfuse.frontends import torch_layouts
from tvmfuse.frontends.torch_train import compile_aten_graph

aten = torch.ops.aten


@pytest.mark.parametrize("make, order", [
    (lambda: torch.randn(4, 6), None),  # contiguous
    (lambda: torch.randn(6, 4).t(), (1, 0)),  # a saved weight transpose
    (lambda: torch.randn(2, 5, 3).permute(2, 0, 1), (1, 2, 0)),
    (lambda: torch.randn(1, 6).expand(4, 6), None),  # overlapping: no permutation makes it dense
    (lambda: torch.randn(6, 8)[:, :4], None),  # a slice: not dense
    (lambda: torch.randn(5), None),
])
def test_memory_order(make, order):
    t = make()
    assert torch_layouts.memory_order(t) == order
    if order is not None:
        assert t.permute(order).is_contiguous()


def _graph(a, b):
    return make_fx(lambda x, wt: (aten.mm.default(x, wt),))(a, b)


def test_a_transposed_input_becomes_its_base_and_a_permute_in_the_graph():
    x, wt = torch.randn(3, 6), torch.randn(4, 6).t()
    gm = _graph(x, wt)
    orders = torch_layouts.take_dense_bases(gm, [x, wt])
    assert orders == {1: (1, 0)}
    permutes = [n for n in gm.graph.nodes if n.target == aten.permute.default]
    assert len(permutes) == 1 and permutes[0].args[1] == [1, 0]
    w = torch_layouts.bases([x, wt], orders)[1]
    assert w.is_contiguous() and w.data_ptr() == wt.data_ptr()  # a view, no copy
    torch.testing.assert_close(gm(x, w)[0], x @ wt)


def test_contiguous_and_expanded_inputs_are_not_rewritten():
    x, e = torch.randn(3, 6), torch.randn(6, 1).expand(6, 4)
    gm = _graph(x, e)
    before = str(gm.graph)
    assert torch_layouts.take_dense_bases(gm, [x, e]) == {}
    assert str(gm.graph) == before


def test_compiled_graph_takes_the_base_and_matches_eager():
    x, wt = torch.randn(5, 8), torch.randn(7, 8).t()
    run, compiled = compile_aten_graph(_graph(x, wt), [x, wt])
    w_param = compiled.mod["main"].params[1]
    assert [int(d) for d in w_param.ty.shape] == [7, 8]  # the base, not the (8, 7) view
    torch.testing.assert_close(run([x, wt])[0], x @ wt)
    other = torch.randn(8, 7)  # the same shape in another layout at run time: made dense, same values
    torch.testing.assert_close(run([x, other])[0], x @ other)
