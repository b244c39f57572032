"""tvmfuse.training.train_step: forward, relax.transform.Gradient and a relax.training optimizer as
one Relax module built by tvmfuse; the gradients match numeric differentiation of the zoo's MLP and
layernorm workloads, and optimizer steps match the same module built without fusion."""
import numpy as np
import pytest
from tvm.relax.training.loss import MSELoss
from tvm.relax.training.optimizer import SGD, Adam, MomentumSGD

from tvmfuse.errors import InputError
from tvmfuse.training import train_step
from tvmfuse.zoo import workloads

CASES = {"mlp_block": 4, "layernorm_decomposed": 2}  # workload: trained parameters (main's last ones)


def _split(w, num_params):
    arrays = w.inputs()
    n = len(arrays) - num_params
    target = np.random.default_rng(1).standard_normal(w.reference(*arrays).shape).astype("float32")
    return arrays[:n], arrays[n:], target


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_numeric_differentiation(name):
    """SGD with lr 1: each new parameter is the old one minus its gradient. Central differences of
    the float64 numpy reference at random entries of every parameter."""
    w, num_params = workloads.get(name, "small"), CASES[name]
    step = train_step(w.mod, num_params, loss=MSELoss(reduction="sum"), optimizer=SGD(1.0))
    compiled = step.build()
    assert compiled.fusion == "tvmfuse" and compiled.launches == compiled.plan.kernels()
    inputs, params, target = _split(w, num_params)
    loss, new = step.step(compiled, inputs, params, target)

    def f(ps):
        out = w.reference(*[a.astype("float64") for a in inputs], *ps)
        return float(((out - target) ** 2).sum())

    p64 = [p.astype("float64") for p in params]
    assert loss == pytest.approx(f(p64), rel=1e-4)
    rng = np.random.default_rng(0)
    for k, p in enumerate(p64):
        grad = p - new[k]
        for _ in range(6):
            i = tuple(int(rng.integers(0, s)) for s in p.shape)
            h = 1e-3 * max(1.0, abs(p[i]))
            up, down = [q.copy() for q in p64], [q.copy() for q in p64]
            up[k][i] += h
            down[k][i] -= h
            numeric = (f(up) - f(down)) / (2 * h)
            assert grad[i] == pytest.approx(numeric, rel=2e-3, abs=1e-3 * max(1.0, abs(numeric))), (k, i)


def _steps(fusion, optimizer, steps=3):
    w = workloads.get("mlp_block", "small")
    inputs, params, target = _split(w, 4)
    step = train_step(w.mod, 4, loss=MSELoss(reduction="mean"), optimizer=optimizer)
    compiled = step.build(fusion=fusion)
    ps, losses = list(params), []
    for _ in range(steps):
        loss, ps = step.step(compiled, inputs, ps, target)
        losses.append(loss)
    return compiled, losses, ps


def _same(a, b):
    np.testing.assert_allclose(a[1], b[1], rtol=1e-4)
    for x, y in zip(a[2], b[2]):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_momentum_steps_fuse_and_match_the_unfused_build():
    """Three MomentumSGD steps of the MLP: the whole step (forward, backward, update) is one fused
    module with fewer launches than the unfused build, and the losses and parameters are its."""
    fused, plain = _steps("tvmfuse", MomentumSGD(0.05, 0.9)), _steps("none", MomentumSGD(0.05, 0.9))
    assert fused[0].launches < plain[0].launches
    assert fused[1][-1] < fused[1][0]
    _same(fused, plain)


def test_adam_steps_match_the_unfused_build():
    """Adam's state (step count, the betas' powers, two moments per parameter) is carried between
    steps: three steps under TVM's stock fusion follow the unfused build."""
    fused, plain = _steps("tvm", Adam(1e-2)), _steps("none", Adam(1e-2))
    assert fused[1][-1] < fused[1][0]
    _same(fused, plain)


def test_adam_steps_fuse_under_tvmfuse():
    """Adam's shared beta-power update joins one parameter's group while another parameter's update
    joins the backward chain feeding it: the planner's cycle check must follow paths through fused
    groups (plan_fusion.group_order), and the fused steps follow the unfused build."""
    _same(_steps("tvmfuse", Adam(1e-2)), _steps("none", Adam(1e-2)))


def test_group_order_stays_topological_while_planning_adam(monkeypatch):
    """The planner keeps a topological order of its groups as they merge (fusion.group_order): at
    every cycle check of Adam's step, each group comes after every group it reads."""
    import tvmfuse.pipeline as pipeline
    from tvmfuse.fusion import plan_fusion
    from tvmfuse.fusion.group_order import successors

    checked = []
    real = plan_fusion._creates_cycle

    def checking(g, group_of, ga, gb, members, order=None):
        if order is not None and len(checked) % 7 == 0:  # every 7th check: a full check is O(graph)
            for gid in members:
                assert all(order[gid] < order[c] for c in successors(g, group_of, members, gid))
        checked.append(1)
        return real(g, group_of, ga, gb, members, order)

    monkeypatch.setattr(plan_fusion, "_creates_cycle", checking)
    step = train_step(workloads.get("mlp_block", "small").mod, 4, loss=MSELoss(), optimizer=Adam(1e-2))
    pipeline.plan(step.mod, "llvm")
    assert len(checked) > 20


def test_bad_input_is_a_clear_error():
    w = workloads.get("rmsnorm_residual", "small")  # returns two tensors
    with pytest.raises(InputError, match="one tensor"):
        train_step(w.mod, 1, loss=MSELoss(), optimizer=SGD(0.1))
    w = workloads.get("layernorm_decomposed", "small")
    with pytest.raises(InputError, match="num_params=9"):
        train_step(w.mod, 9, loss=MSELoss(), optimizer=SGD(0.1))
