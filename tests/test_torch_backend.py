"""torch.compile(model, backend="tvmfuse") (issue 18, item 5): the graphs dynamo captures, static
or dynamic=True, are built by tvmfuse and match eager; anything tvmfuse cannot take runs eagerly."""
import copy
import logging

import pytest
import torch
import tvm

from tvmfuse.frontends import torch_backend
from conftest import real_model


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.ln = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)

    def forward(self, x):
        return self.ln(torch.softmax(self.l2(torch.relu(self.l1(x))), -1) + x)


def _counting(builds):
    def backend(gm, example_inputs, **kw):
        fn = torch_backend.tvmfuse_backend(gm, example_inputs, **kw)
        builds.append(getattr(fn, "compiled", None))
        return fn
    return backend


def test_the_name_is_registered():
    assert "tvmfuse" in torch._dynamo.list_backends()
    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="tvmfuse")(x), m(x), rtol=1e-5, atol=1e-5)


def test_a_block_is_fused_and_matches_eager():
    torch._dynamo.reset()
    builds = []
    m = Block().eval()
    cm = torch.compile(m, backend=_counting(builds))
    with torch.no_grad():
        for _ in range(3):  # one compile, reused
            x = torch.randn(4, 16)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    (compiled,) = builds
    assert compiled is not None and compiled.fusion == "tvmfuse" and compiled.plan is not None
    assert compiled.launches < len([g for g in compiled.plan.groups for _ in g.ops])  # fused


def test_parameters_are_baked_in_and_an_in_place_update_runs_eagerly(caplog):
    """freeze (the default): the parameters dynamo passes as inputs become constants of the build
    (folded, pre-packed; not copied in on each call), so main takes only x; after an optimizer-style
    in-place update the call runs eagerly (logged) and still matches; freeze=False keeps them inputs."""
    torch._dynamo.reset()
    builds = []
    m = Block().eval()
    cm = torch.compile(m, backend=_counting(builds))
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        (compiled,) = builds
        assert [shape for _n, shape, _d in compiled.params] == [(4, 16)]
        m.l1.weight.add_(0.5)  # in place, as optimizer.step() does
        with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"):
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    assert "a parameter changed since the build" in caplog.text
    torch._dynamo.reset()
    unfrozen = []
    with torch.no_grad():
        out = torch.compile(m, backend=_counting(unfrozen), options={"freeze": False})(x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-5)
    assert len(unfrozen[0].params) == 1 + sum(1 for _ in m.parameters())


def test_options_reach_the_build():
    torch._dynamo.reset()
    builds = []
    m = Block().eval()
    with torch.no_grad():
        torch.compile(m, backend=_counting(builds), options={"fusion": "none"})(torch.randn(2, 16))
    assert builds[0].fusion == "none" and builds[0].plan is None


def test_what_tvmfuse_cannot_take_runs_eagerly(caplog):
    torch._dynamo.reset()
    m = Block().eval()
    x = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(m, backend="tvmfuse", options={"not_a_knob": 1})(x)  # the build refuses
    torch.testing.assert_close(out, m(x))
    assert "left to eager PyTorch" in caplog.text and "not_a_knob" in caplog.text


def test_dynamic_graphs_compile_once_and_run_every_size():
    """dynamic=True: dynamo sends one graph with a symbolic batch (and a SymInt input for it);
    tvmfuse builds it once, symbolic, fused like the static build, and it runs at every size."""
    torch._dynamo.reset()
    builds = []
    m = Block().eval()
    cm = torch.compile(m, backend=_counting(builds), dynamic=True)
    with torch.no_grad():
        for n in (2, 5, 9):
            x = torch.randn(n, 16)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    (compiled,) = builds  # one compile for the three sizes
    assert compiled is not None, "the dynamic graph was left to eager"
    assert any(not isinstance(d, int) for d in compiled._dims[[p[0] for p in compiled.params].index(
        next(p[0] for p in compiled.params if p[1] is None))])  # a symbolic input
    torch._dynamo.reset()
    static = []
    with torch.no_grad():
        torch.compile(m, backend=_counting(static))(torch.randn(5, 16))
    assert compiled.launches == static[0].launches


def test_dynamic_graphs_take_buckets_through_options():
    """options={"buckets": [...]}: the one dynamic build carries a static version per size, and
    every size (in a bucket or not) still matches eager from that one compile."""
    torch._dynamo.reset()
    builds = []
    m = Block().eval()
    cm = torch.compile(m, backend=_counting(builds), dynamic=True, options={"buckets": [4, 8]})
    with torch.no_grad():
        for n in (3, 4, 8, 11):
            x = torch.randn(n, 16)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
    (compiled,) = builds
    assert compiled is not None, "the dynamic graph was left to eager"
    assert sorted(combo[next(iter(combo))] for combo, _fn in compiled.buckets) == [4, 8]
    assert len(set(compiled.bucket_launches().values())) == 1  # every version fuses alike


def test_small_bert_dynamic_compiles_once_and_matches_eager_at_every_length():
    """transformers' BERT under dynamic=True computes with its sequence-length input (views by it,
    slices its position ids by it): each such size is read from a tensor input's shape, the slice's
    min(s, 256) tightened under dynamo's bound, so the one graph builds symbolic and runs every
    length; the attention is one flash kernel per layer."""
    pytest.importorskip("transformers")
    from tvmfuse.zoo import models

    torch._dynamo.reset()
    torch.manual_seed(0)
    m = models._bert_module().eval()
    builds = []
    cm = torch.compile(m, backend=_counting(builds), dynamic=True)
    with torch.no_grad():
        for s in (8, 13, 100):
            x = torch.randint(0, 100, (1, s))
            out, ref = cm(x), m(x)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    (compiled,) = builds  # one compile for the three lengths
    assert compiled is not None, "the dynamic graph was left to eager"
    assert list(compiled.ranges.values()) == [(2, 256)]
    rules = compiled.rules()
    assert rules.count("cpu.Attention") == 2 and "cpu.Fallback" not in rules


class ConvBnRelu6(torch.nn.Module):
    """MobileNetV2's layer as transformers writes it: TF "same" padding by F.pad, conv, BatchNorm
    (running statistics are buffers), ReLU6 (dynamo captures hardtanh(x, 0.0, 6.0))."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, bias=False)
        self.bn = torch.nn.BatchNorm2d(8, eps=1e-3)
        with torch.no_grad():  # statistics that are not the identity
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        return torch.nn.functional.relu6(self.bn(self.conv(torch.nn.functional.pad(x, (0, 1, 0, 1)))))


def _no_eager_fallback(caplog):
    return "left to eager PyTorch" not in caplog.text


def test_batch_norm_and_relu6_build_fold_and_match(caplog):
    """F.batch_norm as a function and hardtanh with positional bounds (TVM's importer read them as
    -1 and 1: a wrong MobileNetV2). The buffers are baked in like the parameters, so BatchNorm folds
    into the conv: one kernel, main takes only x."""
    torch._dynamo.reset()
    builds = []
    m = ConvBnRelu6().eval()
    x = torch.randn(1, 3, 17, 17) * 4  # past both bounds of relu6
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(m, backend=_counting(builds))(x)
    assert _no_eager_fallback(caplog), caplog.text
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-5)
    (compiled,) = builds
    assert [shape for _n, shape, _d in compiled.params] == [(1, 3, 17, 17)]
    assert compiled.launches == 1


def test_training_batch_norm_computes_batch_statistics():
    """Batch statistics (train mode without running stats: F.batch_norm(training=True)) are not
    folded: TVM's FX importer refuses the graph, the ATen route (torch.export) compiles it, and the
    batch's own statistics are used, as eager does."""
    torch._dynamo.reset()
    m = ConvBnRelu6().train()
    m.bn = torch.nn.BatchNorm2d(8, track_running_stats=False)
    x = torch.randn(2, 3, 9, 9)
    builds = []
    with torch.no_grad():
        out = torch.compile(m, backend=_counting(builds))(x)
        torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-5)
    assert builds[0] is not None


def test_running_statistics_updates_are_built_as_an_update_graph(caplog):
    """Train mode with running statistics updates BatchNorm's buffers in place (num_batches_tracked.add_,
    the running mean and variance): under no_grad the graph goes the update route
    (frontends/torch_update.py: functionalized by AOTAutograd, built by tvmfuse, the new buffer values
    written into the buffers: passes/update_in_place.py), and the output and the buffers move as in eager."""
    from tvmfuse.frontends import torch_records

    torch._dynamo.reset()
    m = ConvBnRelu6().train()
    x = torch.randn(2, 3, 9, 9)
    ref = copy.deepcopy(m)
    before = m.bn.running_mean.clone()
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(m, backend="tvmfuse")(x)
        expected = ref(x)
    assert "eager" not in caplog.text
    record = torch_records.RECORDS[-1]
    assert record.kind == "update" and record.compiled is not None and record.copies == 0  # mean, var, count in place
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert not torch.equal(m.bn.running_mean, before)  # updated once, as eager updates it
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(m.bn, name), getattr(ref.bn, name), rtol=1e-5, atol=1e-6)


class MaskOps(torch.nn.Module):
    """The ops transformers' GPT-2 mask code uses: torch.diff with prepend, cumsum of a bool,
    new_ones with a dtype, indexing by several index tensors (negative ones too), torch.where with a
    scalar fill, torch.zeros / torch.ones."""

    def forward(self, pos, scores):
        restart = torch.diff(pos, prepend=pos[:, :1] - 1, dim=-1) != 1
        seg = restart.cumsum(-1)  # int64, as in PyTorch
        b = torch.arange(pos.shape[0])[:, None, None]
        q = torch.arange(pos.shape[1])[None, :, None]
        k = torch.arange(pos.shape[1])[None, None, :] - pos.shape[1]  # negative: from the end
        ok = pos.new_ones((), dtype=torch.bool) & (seg[b, q] == seg[b, k]) & (pos[b, k] <= pos[b, q])
        return torch.where(ok, scores, torch.finfo(scores.dtype).min) + torch.zeros(()) + torch.ones(1)


def test_mask_ops_build_and_match(caplog):
    torch._dynamo.reset()
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    scores = torch.randn(1, 7, 7)
    m = MaskOps()
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(m, backend="tvmfuse")(pos, scores)
    assert _no_eager_fallback(caplog), caplog.text
    torch.testing.assert_close(out, m(pos, scores))


@pytest.mark.parametrize("name", ["gpt2-tiny", "resnet-tiny", "llama-tiny"])
def test_tiny_models_build_without_eager_fallback(name, caplog):
    """transformers' GPT-2 (its mask code), ResNet (BatchNorm as a function) and Llama
    (torch._C._log_api_usage_once in its mask code) ran eagerly under the backend before; now each
    is one tvmfuse build that matches eager."""
    torch._dynamo.reset()
    w = real_model(name)
    x = [torch.from_numpy(a) for a in w.inputs()]
    builds = []
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        out = torch.compile(w.module, backend=_counting(builds))(*x)
        ref = w.module(*x)
    assert _no_eager_fallback(caplog), caplog.text
    assert builds and all(b is not None for b in builds)
    first = lambda o: o if isinstance(o, torch.Tensor) else o[0]
    torch.testing.assert_close(first(out), first(ref), rtol=1e-3, atol=1e-3)


class NewGelu(torch.nn.Module):
    """GPT-2's activation: under dynamic=True dynamo lifts math.pi to an input and traces
    math.sqrt(2 / pi) as torch._sym_sqrt, and writes the view's shape as torch.Size([1, s, 8])."""

    def forward(self, x):
        import math

        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return y.view(x.size(0), x.size(1), 2, 4).sum(-1)


def test_dynamic_sym_sqrt_and_size_build(caplog):
    torch._dynamo.reset()
    m = NewGelu()
    builds = []
    cm = torch.compile(m, backend=_counting(builds), dynamic=True)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        for s in (5, 9):
            x = torch.randn(1, s, 8)
            torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)
    assert _no_eager_fallback(caplog), caplog.text
    assert builds and all(b is not None for b in builds)


def test_gpt2_dynamic_compiles_once_and_matches_eager(caplog):
    """transformers' GPT-2 under dynamic=True: one symbolic build for every length (its mask code's
    diff, advanced indexing and size-valued tensors, its GELU's sqrt of a lifted float)."""
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    w = real_model("gpt2-tiny")
    builds = []
    cm = torch.compile(w.module, backend=_counting(builds), dynamic=True)
    first = lambda o: o if isinstance(o, torch.Tensor) else o[0]
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"), torch.no_grad():
        for s in (5, 11):
            x = torch.randint(0, 100, (1, s))
            torch.testing.assert_close(first(cm(x)), first(w.module(x)), rtol=1e-3, atol=1e-3)
    assert _no_eager_fallback(caplog), caplog.text
    assert len(builds) == 1 and builds[0] is not None
    # one flash-attention kernel per layer (an identity cast of the probabilities hid it)
    rules = builds[0].rules()
    assert rules.count("cpu.Attention") == w.module.gpt2.config.n_layer, rules
