"""Optimizer steps through torch.compile(backend="tvmfuse") (frontends/torch_update.py): the
in-place update graph of torch.optim's SGD and AdamW (foreach and per-parameter implementations,
momentum, weight decay) is functionalized by AOTAutograd, built by tvmfuse as one "update" graph
whose independent per-parameter chains are one kernel (fusion/fuse_horizontal.py), which writes
the new values into the parameters and the optimizer state (passes/update_in_place.py: no copy
back). Each step's parameters
and state equal eager's (rtol 1e-5, atol 1e-6, float32); what tvmfuse cannot build runs eagerly
with its reason logged and stays correct.

The gradients are seeded random values of magnitude ~0.1, the same for both models at each step,
not a backward's: under torch.compile AdamW's bias corrections are float32 tensor math (eager's
step computes them in Python doubles) and its ops run in another order, and where a gradient is
near AdamW's eps (1e-8) the update m / (sqrt(v) + eps) amplifies that to ~5e-6 absolute after two
steps: measured on the MLP's backward gradients for every compiled form, Inductor's and
AOTAutograd's own eager run of the same graph included, so it is no property of tvmfuse's build.
"""
import copy
import logging

import pytest
import torch

import tvmfuse
from tvmfuse.frontends import torch_records

from test_torch_training import MLP  # Linear, GELU, Linear, LayerNorm

STEPS = 4




OPTIMIZERS = {
    "sgd-foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=True),
    "sgd-loop": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False),
    "adamw-foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=True),
    "adamw-loop": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=False),
}


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


def _grads(models, x, seed=[0]):
    """The same seeded random gradient in every model's parameters (see the module docstring)."""
    seed[0] += 1
    gen = torch.Generator().manual_seed(seed[0])
    grads = [0.1 * torch.randn(p.shape, generator=gen) for p in models[0].parameters()]
    for m in models:
        for p, g in zip(m.parameters(), grads):
            p.grad = g.clone()


def _check_equal(model, opt, ref, ref_opt, step):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        _close(p.detach(), q.detach(), f"step {step}: parameter {name}")
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert set(state) == set(ref_state)
        for key, value in ref_state.items():
            _close(torch.as_tensor(state[key]).float(), torch.as_tensor(value).float(), f"step {step}: {name} {key}")


def _new_records(before):
    return [r for r in torch_records.RECORDS if id(r) not in before]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_step_is_one_tvmfuse_kernel_and_equals_eager_at_every_step(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(8, 32)
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](ref.parameters())
    before = {id(r) for r in torch_records.RECORDS}
    step = torch.compile(opt.step, backend="tvmfuse", options={"fallback": "error"})
    params = [p for p in model.parameters()]
    for i in range(STEPS):
        _grads((model, ref), x)
        step()
        ref_opt.step()
        _check_equal(model, opt, ref, ref_opt, i)
    assert all(p is q for p, q in zip(model.parameters(), params))  # updated in place, never rebound
    updates = [r for r in _new_records(before) if r.kind == "update"]
    assert updates and all(r.compiled is not None and not r.calls_eager for r in updates)
    n = len(params)
    for r in updates:
        assert r.compiled.launches <= 3, r.line()  # the whole update, copy-back excluded
        assert r.copies == 0, r.line()  # params, momentum, exp_avg(_sq), step: all written in place
    last = updates[-1]
    assert last.compiled.launches == 1
    assert any(g.kind.startswith("horizontal") for g in last.compiled.plan.groups)
    text = tvmfuse.explain(step)
    assert "update graph" in text and "tvmfuse (tvmfuse, 1 kernels)" in text and "0 eager" in text


def test_a_step_function_that_calls_step():
    """Compiling a function that calls opt.step() (and clears the gradients): the same route."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    model, x = MLP(), torch.randn(8, 32)
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw-foreach"](model.parameters()), OPTIMIZERS["adamw-foreach"](ref.parameters())

    @torch.compile(backend="tvmfuse")
    def train_step():
        opt.step()

    for i in range(3):
        _grads((model, ref), x)
        train_step()
        ref_opt.step()
        _check_equal(model, opt, ref, ref_opt, i)
    text = tvmfuse.explain(train_step)
    assert "update graph" in text and "0 eager" in text


def test_an_update_tvmfuse_cannot_build_runs_eagerly_with_its_reason(caplog):
    """lgamma has no converter in TVM's importer: the update graph runs in eager PyTorch (its
    copies into the parameters intact), with the reason logged and recorded, and the parameters move as in eager."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    model, x = MLP(), torch.randn(8, 32)
    ref = copy.deepcopy(model)

    def update(m):  # a hand-written update with an op TVM does not convert
        for p in m.parameters():
            p.sub_(0.01 * torch.lgamma(p.grad.abs() + 1))

    compiled = torch.compile(update, backend="tvmfuse")
    before = {id(r) for r in torch_records.RECORDS}
    with caplog.at_level(logging.INFO, logger="tvmfuse.torch"):
        for i in range(2):
            _grads((model, ref), x)
            with torch.no_grad():  # the update route takes no-grad graphs (with grad on, AOT's training route)
                compiled(model)
                update(ref)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                _close(p.detach(), q.detach(), f"step {i}: {name}")
    records = [r for r in _new_records(before) if r.kind == "update"]
    assert records and all(r.compiled is None and "lgamma" in r.reason for r in records)
    assert "lgamma" in caplog.text and "eager" in caplog.text
    assert "EAGER" in tvmfuse.explain(compiled)


def test_the_update_route_takes_in_place_updates_of_inputs_only():
    """torch_update.is_update: an in-place op on a graph input or attribute (a parameter, a state
    tensor) sends the graph to the update route; one on a tensor the graph made itself does not."""
    from tvmfuse.frontends.torch_update import is_update

    def graph_of(fn, *args):
        graphs = []

        def grab(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        torch._dynamo.reset()
        torch.compile(fn, backend=grab)(*args)
        return graphs[0]

    x, y = torch.randn(4), torch.randn(4)
    assert is_update(graph_of(lambda a, b: a.add_(b), x, y))
    assert is_update(graph_of(lambda a, b: torch._foreach_mul_([a, b], 0.5), x, y))
    assert not is_update(graph_of(lambda a, b: (a * 2).add_(b).relu_(), x, y))
    assert not is_update(graph_of(lambda a, b: a + b, x, y))


def test_an_update_off_the_cpu_is_refused_before_aot():
    """A tensor on another device (a GPU's; here the meta device stands in) is refused with the
    reason, and the dynamo graph runs eagerly."""
    from tvmfuse.frontends.torch_update import refusal

    gm = torch.fx.symbolic_trace(lambda a, b: a.add_(b))
    assert "on meta" in refusal(gm, [torch.empty(4, device="meta"), torch.empty(4, device="meta")])
    assert refusal(gm, [torch.empty(4), torch.empty(4)]) == ""


def test_an_update_that_saves_the_old_value_of_another_updated_tensor():
    """prev.copy_(p); p.add_(..): prev must get p's old value. The build may not write p in place
    while p's old value is also an output, and no copy into place may read a tensor another copy
    already overwrote (whatever order the copies run in)."""
    torch._dynamo.reset()

    def update(prev, p, q):
        prev.copy_(p)
        p.add_(1.0)
        q.mul_(2.0)

    compiled = torch.compile(update, backend="tvmfuse", options={"fallback": "error"})
    before = {id(r) for r in torch_records.RECORDS}
    p, q = torch.randn(64), torch.randn(8, 8)
    prev = torch.zeros(64)
    for _ in range(2):
        old_p, old_q = p.clone(), q.clone()
        with torch.no_grad():
            compiled(prev, p, q)
        _close(prev, old_p, "prev holds p's old value")
        _close(p, old_p + 1.0, "p")
        _close(q, 2.0 * old_q, "q")
    (record,) = [r for r in _new_records(before) if r.kind == "update"]
    assert record.compiled is not None and record.copies >= 1, record.line()  # prev (and p) copied
