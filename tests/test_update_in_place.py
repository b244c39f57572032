"""UpdateInPlace (tvmfuse/passes/update_in_place.py): an update graph's new values written into its
parameters (call_tir_inplace), the cases where it must not fire, and the numbers against numpy."""
import logging

import numpy as np
import pytest
import tvm
from tvm import relax

import tvmfuse
from tvmfuse.passes.update_in_place import IN_PLACE, UPDATES

F32 = "float32"


def _momentum_step(shape=(8, 16), reuse_param=False, old_moment=False, decay=0.0):
    """SGD with momentum over one parameter: m' = 0.9 m + g (+ decay p); p' = p - 0.1 m'. Returns
    (p', m'), the new values of parameters 0 and 2. `reuse_param`: main also returns p * 2 (p read
    after the update); `old_moment`: p' = p - 0.1 m (the old moment: read after m' is stored);
    `decay`: the moment's kernel reads p too, before p' is stored (weight decay)."""
    p, g, m = (relax.Var(n, relax.TensorType(shape, F32)) for n in ("p", "g", "m"))
    bb = relax.BlockBuilder()
    with bb.function("main", [p, g, m]):
        with bb.dataflow():
            m2 = relax.op.add(relax.op.multiply(m, relax.const(0.9, F32)), g)
            m2 = bb.emit(relax.op.add(m2, relax.op.multiply(p, relax.const(decay, F32))) if decay else m2)
            step = m if old_moment else m2
            p2 = bb.emit(relax.op.subtract(p, relax.op.multiply(step, relax.const(0.1, F32))))
            outs = [p2, m2] + ([bb.emit(relax.op.multiply(p, relax.const(2.0, F32)))] if reuse_param else [])
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr(UPDATES, {0: 0, 1: 2})
    return mod


def _run(built, arrays):
    args = [tvm.runtime.tensor(a) for a in arrays]
    outs = built.vm()["main"](*args)
    return args, [outs[i] for i in range(len(outs))]


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_momentum_step_writes_the_parameter_and_the_moment_in_place(decay):
    """With weight decay the moment's loop nest reads p as well: it finishes before p' is stored."""
    built = tvmfuse.build(_momentum_step(decay=decay), "llvm", "tvmfuse")
    assert [int(i) for i in built.mod["main"].attrs[IN_PLACE]] == [0, 1]
    assert "call_tir_inplace" in built.mod["main"].script()
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal((8, 16)).astype(F32) for _ in range(3))
    args, (p2, m2) = _run(built, [p, g, m])
    want_m = 0.9 * m + g + decay * p
    np.testing.assert_allclose(m2.numpy(), want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p2.numpy(), p - 0.1 * want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(args[0].numpy(), p - 0.1 * want_m, rtol=1e-5, atol=1e-6)  # in place
    np.testing.assert_allclose(args[2].numpy(), want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(args[1].numpy(), g)  # the gradient is only read


@pytest.mark.parametrize("case, mod, served", [
    ("the parameter is read after the update", _momentum_step(reuse_param=True), [1]),
    ("the old moment is read after the new one is stored", _momentum_step(old_moment=True), [0]),
])
def test_must_not_fire_where_an_old_value_is_still_read(case, mod, served, caplog):
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        built = tvmfuse.build(mod, "llvm", "tvmfuse")
    got = built.mod["main"].attrs.get(IN_PLACE) if built.mod["main"].attrs else None
    assert [int(i) for i in got or []] == served, case
    assert "stays a copy" in caplog.text
    rng = np.random.default_rng(1)
    p, g, m = (rng.standard_normal((8, 16)).astype(F32) for _ in range(3))
    _args, outs = _run(built, [p, g, m])
    new_m = 0.9 * m + g
    np.testing.assert_allclose(outs[0].numpy(), p - 0.1 * (m if "old moment" in case else new_m), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), new_m, rtol=1e-5, atol=1e-6)
    if len(outs) > 2:
        np.testing.assert_allclose(outs[2].numpy(), 2 * p, rtol=1e-5, atol=1e-6)


def test_a_graph_without_updates_is_unchanged():
    mod = _momentum_step()
    mod["main"] = mod["main"].without_attr(UPDATES)
    built = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert "call_tir_inplace" not in built.mod["main"].script()


def test_a_scalar_counter_of_its_own_kernel_is_written_in_place():
    """BatchNorm's num_batches_tracked + 1: a 0-d int64 update that is a kernel's only output (not
    an item of a multi-output kernel's tuple), whose block stands right under the root block."""
    n, x = relax.Var("n", relax.TensorType((), "int64")), relax.Var("x", relax.TensorType((4, 8), F32))
    bb = relax.BlockBuilder()
    with bb.function("main", [n, x]):
        with bb.dataflow():
            n2 = bb.emit(relax.op.add(n, relax.const(1, "int64")))
            y = bb.emit(relax.op.sum(relax.op.exp(x), axis=[0]))  # something else beside it
            out = bb.emit_output(relax.Tuple([n2, y]))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr(UPDATES, {0: 0})
    built = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert [int(i) for i in built.mod["main"].attrs[IN_PLACE]] == [0]
    x0 = np.random.default_rng(2).standard_normal((4, 8)).astype(F32)
    args, (n_out, y) = _run(built, [np.array(41, "int64"), x0])
    assert int(n_out.numpy()) == 42 and int(args[0].numpy()) == 42  # the counter itself moved
    np.testing.assert_allclose(y.numpy(), np.exp(x0).sum(0), rtol=1e-5)
