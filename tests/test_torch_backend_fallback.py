"""torch.compile(backend="tvmfuse") on graphs TVM's FX importer cannot take: the ATen route
(torch.export of the graph, frontends/torch_aten.py) compiles them, static and dynamic=True; what
neither route takes runs eagerly with one WARNING per model, `tvmfuse.explain(compiled)` lists
every graph and why it ran eagerly, and options={"fallback": "error"} raises instead."""
import logging

import pytest
import torch

import tvmfuse
from tvmfuse.errors import BackendFallbackError
from tvmfuse.frontends import torch_backend


class Gaps(torch.nn.Module):
    """Ops TVM 0.27's FX importer lacks (full_like, repeat_interleave, F.group_norm) and `int()` of a size."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(8, 8)
        self.gn = torch.nn.GroupNorm(2, 8)

    def forward(self, x):
        y = self.l(x)
        half = int(y.shape[-1] // 2)
        z = torch.full_like(y, 2.0) * y.repeat_interleave(2, dim=-1)[..., :8]
        return self.gn(z.unsqueeze(-1)).squeeze(-1)[..., :half] + y[..., half:]


class Broken(torch.nn.Module):
    """Two graphs (a print breaks the graph), each built with a knob the build refuses."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x).relu()
        print("graph break")
        return self.b(y).sigmoid()


def _records(builds):
    def backend(gm, example_inputs, **kw):
        fn = torch_backend.tvmfuse_backend(gm, example_inputs, **kw)
        builds.append(getattr(fn, "record", None))
        return fn
    return backend


def test_the_aten_route_compiles_what_the_fx_importer_cannot(caplog):
    torch._dynamo.reset()
    m, builds = Gaps().eval(), []
    cm = torch.compile(m, backend=_records(builds))
    x = torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)  # group norm over 4 values (see below)
    assert "eager" not in caplog.text
    (record,) = builds
    assert record is not None and record.route == "aten" and not record.eager
    assert record.compiled.fusion == "tvmfuse" and record.compiled.plan is not None
    assert record.compiled.launches < record.ops  # fused, not one kernel per op
    assert "Unsupported function" in record.fx_error


def test_the_aten_route_keeps_dynamic_graphs_symbolic():
    torch._dynamo.reset()
    m, builds = Gaps().eval(), []
    cm = torch.compile(m, backend=_records(builds), dynamic=True)
    with torch.no_grad():
        for n in (2, 5, 9):  # atol 1e-4: group norm over 4 values divides by their std, which can be small
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    (record,) = builds  # one build for the three sizes
    assert record.route == "aten" and not record.eager


def test_eager_graphs_warn_once_per_model_and_explain_lists_them(caplog):
    torch._dynamo.reset()
    m = Broken().eval()
    cm = torch.compile(m, backend="tvmfuse", options={"not_a_knob": 1})
    x = torch.randn(2, 4)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        torch.testing.assert_close(cm(x), m(x))
    warnings = [r for r in caplog.records if r.name == "tvmfuse.torch" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not_a_knob" in warnings[0].getMessage()
    assert "fallback" in warnings[0].getMessage() and "explain" in warnings[0].getMessage()
    text = tvmfuse.explain(cm)
    assert "2 graph(s), 0 compiled by tvmfuse, 2 eager" in text, text
    assert text.count("EAGER: UnknownKnobError") == 2, text
    assert "no graph of this model" in tvmfuse.explain(Broken())  # another instance: nothing recorded


def test_explain_reports_compiled_graphs_with_their_kernels():
    torch._dynamo.reset()
    m = Broken().eval()
    cm = torch.compile(m, backend="tvmfuse")
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    text = tvmfuse.explain(cm)
    assert "compiled by tvmfuse, 0 eager" in text and text.count("tvmfuse (tvmfuse, ") >= 2, text


def test_fallback_error_raises_instead_of_running_eagerly():
    torch._dynamo.reset()
    m = Broken().eval()
    cm = torch.compile(m, backend="tvmfuse", options={"not_a_knob": 1, "fallback": "error"})
    with pytest.raises(Exception) as info, torch.no_grad():
        cm(torch.randn(2, 4))
    chain, err = [], info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(e, BackendFallbackError) for e in chain), chain
    assert "not_a_knob" in str(info.value)


def test_a_bad_fallback_option_is_a_clear_error():
    torch._dynamo.reset()
    with pytest.raises(Exception, match="fallback.*'eager'.*'error'"), torch.no_grad():
        torch.compile(Broken().eval(), backend="tvmfuse", options={"fallback": "never"})(torch.randn(2, 4))


def test_train_mode_dropout_runs_eagerly_not_as_the_identity(caplog):
    """Under no_grad a train-mode model still drops: the graph draws random numbers, which a compiled
    module would not (TVM's importer reads dropout as the identity), so it runs eagerly, with the reason."""
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).train()
    x = torch.randn(32, 64)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(m, backend="tvmfuse")(x)
    assert "random" in caplog.text and "ropout" in caplog.text
    assert int((out == 0).sum()) > 100  # about half of 2048 dropped, as eager drops
    torch._dynamo.reset()
    with torch.no_grad():  # eval mode: dropout is the identity and the graph compiles
        cm = torch.compile(m.eval(), backend="tvmfuse")
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert tvmfuse.explain(cm).splitlines()[-1].endswith("tvmfuse (tvmfuse, 1 kernels)")  # the eval-mode graph


def test_a_scalar_output_keeps_its_shape():
    torch._dynamo.reset()
    m = torch.nn.Linear(8, 8).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        out = torch.compile(lambda t: m(t).sum(), backend="tvmfuse")(x)
    assert out.shape == () and torch.allclose(out, m(x).sum(), rtol=1e-4, atol=1e-4)
