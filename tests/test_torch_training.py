"""Training through torch.compile(backend="tvmfuse") (frontends/torch_train.py): AOTAutograd's
forward and backward graphs built by tvmfuse, parameters as inputs, so a model trains for several
optimizer steps with the losses and every gradient of eager PyTorch; what cannot be built runs
eagerly with its reason recorded, and never raises where eager PyTorch would not.

Tolerances: rtol 1e-4 (float32). atol is 1e-5 of the largest magnitude of each gradient, plus
1e-7: tvmfuse's kernels sum in another order than ATen's (a bias gradient is a sum over the batch,
a weight gradient a matmul over it), so an entry that is a near-zero difference of large terms
differs by a few ulps of those terms, not of itself (measured: at most 4e-6 of the largest entry
beyond rtol, resnet-tiny's conv weights). The 1e-7 floor is for gradients that are zero in exact
arithmetic and rounding noise in both (BERT's key bias: softmax does not see a shift of its row,
both sides give ~1e-12).
"""
import copy
import logging

import pytest
import torch

from tvmfuse.errors import BackendFallbackError
from tvmfuse.frontends import torch_backend, torch_records, torch_train
from tvmfuse.zoo.models import _resnet_module
from tvmfuse.relax_utils import call_tir_sites

STEPS = 5


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.act, self.l2, self.ln = (torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
                                               torch.nn.LayerNorm(32))

    def forward(self, x):
        return self.ln(self.l2(self.act(self.l1(x))))


class Bert(torch.nn.Module):
    """transformers BertModel, hidden 256, 2 layers, 4 heads, intermediate 1024, dropout 0 (a
    vocabulary of 1000: the embedding's gradient is the only thing its size changes)."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        cfg = BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                         vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         attn_implementation="eager")
        self.bert = BertModel(cfg)

    def forward(self, ids):
        return self.bert(input_ids=ids).last_hidden_state


def _mlp():
    return MLP(), torch.randn(8, 32)


def _bert():
    return Bert(), torch.randint(0, 1000, (4, 128))


def _resnet():
    return _resnet_module(), torch.randn(4, 3, 16, 16)


MODELS = {"mlp": _mlp, "bert-small": _bert, "resnet-tiny": _resnet}
OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
              "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3)}


def _close(got, want, what):
    if want is None:  # a parameter the loss does not reach (BERT's pooler)
        assert got is None or not got.any(), f"{what}: eager has no gradient, got {got}"
        return
    assert got is not None, f"{what}: missing"
    atol = 1e-5 * float(want.abs().max()) + 1e-7
    torch.testing.assert_close(got, want, rtol=1e-4, atol=atol, msg=lambda m: f"{what}: {m}")


def _train(model, x, optimizer, steps=STEPS, options=None):
    """Train a copy of `model` eagerly and `model` through the tvmfuse backend side by side; the
    losses and every gradient compared at every step. Returns the compiled model."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model.train()
    ref = copy.deepcopy(model)
    with torch.no_grad():
        target = torch.randn_like(copy.deepcopy(ref).eval()(x))  # (a train-mode call updates BatchNorm)
    compiled = torch.compile(model, backend="tvmfuse", options=options)
    opt, ref_opt = OPTIMIZERS[optimizer](model.parameters()), OPTIMIZERS[optimizer](ref.parameters())
    for step in range(steps):
        losses = []
        for m, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), target)
            loss.backward()
            losses.append(loss)
        _close(losses[0].detach(), losses[1].detach(), f"step {step}: loss")
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            _close(p.grad, q.grad, f"step {step}: the gradient of {name}")
        opt.step()
        ref_opt.step()
    for (name, b), c in zip(model.named_buffers(), ref.buffers()):  # BatchNorm's running statistics
        _close(b.float(), c.float(), f"buffer {name}")
    return compiled


def _built_by_tvmfuse(compiled):
    records = torch_records.of_model(compiled)
    kinds = {r.kind: r for r in records}
    assert {"forward", "backward"} <= set(kinds), [r.line() for r in records]
    for r in records:
        assert not r.eager and not r.calls_eager, r.line()
        c = r.compiled
        assert c.fusion == "tvmfuse" and c.plan is not None, r.line()
        sites = len(list(call_tir_sites(c.mod["main"])))
        assert sites == c.plan.kernels(), r.line()  # each call site is a kernel of the plan
        assert c.launches <= sites, r.line()  # less the reshapes lowering makes views (Compiled.call_sites)
    return kinds


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_train_with_eager_gradients_at_every_step(name, optimizer):
    model, x = MODELS[name]()
    compiled = _train(model, x, optimizer)
    kinds = _built_by_tvmfuse(compiled)
    bw = kinds["backward"].compiled
    assert bw.launches < sum(len(g.ops) for g in bw.plan.groups)  # the backward's ops fused


def test_compile_training_returns_the_forward_and_backward_builds():
    model, x = _mlp()
    torch._dynamo.reset()
    built = torch_train.compile_training(model, x)
    (fw,), (bw,) = built.forward, built.backward
    assert fw is not None and bw is not None and built.launches() == fw.launches + bw.launches
    assert all(p.grad is None for p in model.parameters())
    assert "backward graph" in "\n".join(r.line() for r in built.records)


def test_no_grad_keeps_the_inference_route_and_eval_with_grad_trains():
    """Under no_grad a train-mode model is compiled for inference (parameters frozen); an eval-mode
    model called with grad on gets gradients (what AOTAutograd decides: some input requires grad)."""
    torch._dynamo.reset()
    model, x = _mlp()
    compiled = torch.compile(model.eval(), backend="tvmfuse")
    with torch.no_grad():
        _close(compiled(x), model(x), "no_grad output")
    (inference,) = torch_records.of_model(compiled)
    assert inference.kind == "" and [s for _n, s, _d in inference.compiled.params] == [(8, 32)]  # frozen
    out = compiled(x)
    assert out.requires_grad
    w = torch.randn_like(out)  # (a plain sum through LayerNorm has a zero gradient)
    (out * w).sum().backward()
    ref = copy.deepcopy(model)
    ref.zero_grad()
    (ref(x) * w).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad, "gradient in eval mode")
    assert {r.kind for r in torch_records.of_model(compiled)} == {"", "forward", "backward"}


@pytest.mark.parametrize("conv", [dict(stride=2, padding=1, dilation=1), dict(stride=3, padding=2, dilation=2),
                                  dict(stride=1, padding=0, dilation=1, bias=False)])
def test_convolution_backward_matches_eager(conv):
    """The convolution_backward converter: odd sizes (the output padding of the transposed conv),
    strides, dilation, no bias."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, **conv), torch.nn.ReLU(), torch.nn.Conv2d(5, 4, 1))
    compiled = _train(model, torch.randn(2, 3, 11, 13), "sgd", steps=2)
    _built_by_tvmfuse(compiled)


def test_an_op_without_converter_runs_eagerly_with_its_reason(caplog):
    """A grouped convolution's weight gradient has no converter: the backward runs in eager PyTorch
    (logged, recorded), the forward is still built, and the gradients are eager's."""
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1, groups=2), torch.nn.ReLU())
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"):
        compiled = _train(model, torch.randn(2, 4, 8, 8), "sgd", steps=2)
    kinds = {r.kind: r for r in torch_records.of_model(compiled)}
    assert not kinds["forward"].eager
    assert kinds["backward"].eager and "grouped convolution" in kinds["backward"].reason
    assert "backward graph" in caplog.text and "grouped convolution" in caplog.text
    with pytest.raises(Exception, match="grouped convolution"):  # fallback="error" raises instead
        _train(model, torch.randn(2, 4, 8, 8), "sgd", steps=1, options={"fallback": "error"})


def test_a_model_off_the_cpu_runs_eagerly_with_a_clear_reason():
    """Inputs on another device (a GPU; `meta` here, which this CPU-only torch has) never reach
    AOTAutograd: the dynamo graph runs eagerly, autograd intact, and says why."""
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    inputs = [torch.randn(2, 4, device="meta", requires_grad=True)]
    fn = torch_backend.tvmfuse_backend(gm, inputs)
    assert fn == gm.forward
    record = torch_records.RECORDS[-1]
    assert record.kind == "training" and "on meta" in record.reason and "CPU" in record.reason
    with pytest.raises(BackendFallbackError, match="on meta"):
        torch_backend.tvmfuse_backend(gm, inputs, options={"fallback": "error"})


def test_double_backward_is_a_clear_error_and_eager_autograd_takes_it(caplog):
    """create_graph=True: the first-order gradients are the compiled backward's (a WARNING says a
    second backward cannot go through them); the second backward raises AOTAutograd's error, as
    under Inductor. options={'autograd': 'eager'} runs the graphs eagerly: double backward works."""
    torch._dynamo.reset()
    model, x = _mlp()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tvmfuse")
    w = torch.randn(8, 32)  # (the square of LayerNorm's output sums to a near-constant)
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"):
        grads = torch.autograd.grad((compiled(x) * w).sum(), list(model.parameters()), create_graph=True)
    want = torch.autograd.grad((ref(x) * w).sum(), list(ref.parameters()), create_graph=True)
    for g, r in zip(grads, want):
        _close(g.detach(), r.detach(), "create_graph gradient")
    assert "create_graph=True" in caplog.text and "double backward" in caplog.text
    with pytest.raises(RuntimeError, match="double backward"):
        sum(g.square().sum() for g in grads).backward()
    torch._dynamo.reset()
    eager = torch.compile(model, backend="tvmfuse", options={"autograd": "eager"})
    grads = torch.autograd.grad((eager(x) * w).sum(), list(model.parameters()), create_graph=True)
    sum(g.square().sum() for g in grads).backward()
    want = torch.autograd.grad((ref(x) * w).sum(), list(ref.parameters()), create_graph=True)
    sum(g.square().sum() for g in want).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad, "double-backward gradient")
    assert "options={'autograd': 'eager'}" in torch_records.of_model(eager)[-1].reason


def test_a_bad_autograd_option_is_a_clear_error():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    with pytest.raises(BackendFallbackError, match="autograd.*'aot'.*'eager'"):
        torch_backend.tvmfuse_backend(gm, [torch.randn(2, 4)], options={"autograd": "yes"})


def test_a_bad_partitioner_option_is_a_clear_error():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    with pytest.raises(BackendFallbackError, match="partitioner.*'min_cut'.*'default'"):
        torch_backend.tvmfuse_backend(gm, [torch.randn(2, 4)], options={"partitioner": "greedy"})


def test_both_partitioners_train_with_eager_gradients_and_min_cut_saves_less():
    """Inductor's min-cut partitioner (the default) and AOTAutograd's default one both give eager's
    gradients; min-cut's forward computes fewer outputs for the backward (it recomputes ReLU masks)."""
    from tvm import relax

    computed = {}
    for partitioner in ("default", "min_cut"):
        model, x = _resnet()
        kinds = _built_by_tvmfuse(_train(model, x, "sgd", steps=2, options={"partitioner": partitioner}))
        ret = kinds["forward"].compiled.mod["main"].ret_ty
        computed[partitioner] = len(ret.fields) if isinstance(ret, relax.TupleType) else 1
    assert computed["min_cut"] < computed["default"], computed


def test_dropout_runs_its_forward_eagerly_with_torchs_own_mask():
    """Train-mode dropout draws random numbers: its forward graph runs eagerly (torch's mask, the
    same as eager under the same seed), the backward is still built by tvmfuse."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).train()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tvmfuse")
    x, w = torch.randn(8, 16), torch.randn(8, 4)
    torch.manual_seed(3)
    out = compiled(x)
    (out * w).sum().backward()
    torch.manual_seed(3)
    want = ref(x)
    (want * w).sum().backward()
    _close(out.detach(), want.detach(), "output")
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad, "gradient")
    kinds = {r.kind: r for r in torch_records.of_model(compiled)}
    assert kinds["forward"].eager and "random numbers" in kinds["forward"].reason
    assert not kinds["backward"].eager


def test_a_new_batch_size_trains_eagerly_with_the_reason():
    """A second batch size makes dynamo recompile with symbolic sizes: those training graphs run
    eagerly (static shapes only), logged, and the gradients are still eager's."""
    torch._dynamo.reset()
    model, _x = _mlp()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="tvmfuse")
    for n in (8, 5):
        x, w = torch.randn(n, 32), torch.randn(n, 32)
        model.zero_grad()
        ref.zero_grad()
        (compiled(x) * w).sum().backward()
        (ref(x) * w).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            _close(p.grad, q.grad, f"batch {n}")
    reasons = [r.reason for r in torch_records.of_model(compiled) if r.eager]
    assert reasons and all("static shapes only" in why for why in reasons)


def test_a_failing_compiled_call_runs_that_call_eagerly(monkeypatch, caplog):
    """A run-time error of a built graph (a bug) never reaches the user: that call runs the ATen
    graph eagerly, with a WARNING and the reason recorded."""
    from tvmfuse.frontends import torch_tensors

    model, x = _mlp()
    compiled = _train(model, x, "sgd", steps=1)

    def broken(*tensors):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(torch_tensors, "_main", lambda compiled: broken)  # the VM's main, as every call reaches it
    ref = copy.deepcopy(model)
    w = torch.randn(8, 32)
    model.zero_grad()
    with caplog.at_level(logging.WARNING, logger="tvmfuse.torch"):
        (compiled(x) * w).sum().backward()
    (ref(x) * w).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        _close(p.grad, q.grad, "gradient")
    assert "kernel exploded" in caplog.text
    assert all("kernel exploded" in r.calls_eager[-1] for r in torch_records.of_model(compiled))


def test_sgd_step_compiled_by_the_backend_updates_the_parameters_as_eager(caplog):
    """torch.compile(optimizer.step, backend="tvmfuse"): SGD's first graph creates the momentum
    buffers and updates the parameters in place, the later ones update both in place. Each is built
    by tvmfuse as an update graph (frontends/torch_update.py: functionalized by AOTAutograd, the new
    values copied back); tests/test_torch_optimizer.py checks the optimizers in detail."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = _mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["sgd"](model.parameters()), OPTIMIZERS["sgd"](ref.parameters())
    step = torch.compile(opt.step, backend="tvmfuse")
    for _ in range(3):
        for m in (model, ref):
            m.zero_grad()
            m(x).square().mean().backward()
        step()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        _close(p.detach(), q.detach(), f"parameter {name}")
    assert "left to eager PyTorch" not in caplog.text and "runs in eager PyTorch" not in caplog.text
    updates = [r for r in torch_records.RECORDS if r.kind == "update" and r.root[1] == "step"][-2:]
    assert len(updates) == 2 and all(r.compiled is not None and r.compiled.launches == 1 for r in updates)


def test_batchnorm_running_statistics_are_joined_into_one_kernel():
    """A train-mode BatchNorm's running mean and variance updates are small independent elementwise
    chains, one per BatchNorm: the training route turns horizontal fusion on, so the forward build
    joins them (six BatchNorms of resnet-tiny: one horizontal group, not one kernel per update).
    The numerics are test_models_train_with_eager_gradients_at_every_step's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    build = torch_train.compile_training(_resnet_module().train(), torch.randn(2, 3, 16, 16))
    (forward,) = build.forward
    joined = [g for g in forward.plan.groups if g.merges.count("horizontal") >= 5]
    assert joined, [(g.kind, g.merges) for g in forward.plan.groups]
    with_horizontal_off = torch_train.compile_training(_resnet_module().train(), torch.randn(2, 3, 16, 16),
                                                       options={"horizontal": False})
    assert forward.launches < with_horizontal_off.forward[0].launches
