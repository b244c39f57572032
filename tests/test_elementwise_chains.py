"""schedules/elementwise_chains.py: SGD with momentum's new moment and new parameter in one loop
nest (not one each), still written in place, against numpy. Must not fire: weight decay (the
moment reads the parameter that is written in place after it), a row the vector does not divide."""
import numpy as np
import pytest
import tvm

import tvmfuse
from tvmfuse.passes.update_in_place import IN_PLACE

from test_update_in_place import F32, _momentum_step  # m' = 0.9 m + g (+ decay p); p' = p - 0.1 m'


def _loop_nests(built) -> int:
    """The kernel's top-level loops (parallel or not: that depends on the host's thresholds)."""
    (name,) = built.call_sites()
    return sum(line.startswith("    for ") for line in built.mod[name].script().splitlines())


@pytest.mark.parametrize("shape, decay, loops", [
    ((512, 256), 0.0, 1),    # joined: one loop nest for both updates
    ((512, 256), 0.01, 2),   # must not fire: the moment reads p, which p' is written over
    ((512, 100), 0.0, 2),    # must not fire: 100 is no multiple of the vector
])
def test_moment_and_parameter_share_one_loop(shape, decay, loops):
    built = tvmfuse.build(_momentum_step(shape, decay=decay), "llvm", "tvmfuse")
    assert built.launches == 1 and _loop_nests(built) == loops
    assert [int(i) for i in built.mod["main"].attrs[IN_PLACE]] == [0, 1]  # both still in place
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(shape).astype(F32) for _ in range(3))
    args = [tvm.runtime.tensor(a) for a in (p, g, m)]
    outs = built.vm()["main"](*args)
    want_m = 0.9 * m + g + decay * p
    want_p = p - 0.1 * want_m
    np.testing.assert_allclose(outs[0].numpy(), want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), want_m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(args[0].numpy(), want_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(args[2].numpy(), want_m, rtol=1e-5, atol=1e-6)
