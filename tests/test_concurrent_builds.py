"""Builds from several threads at once give what serial builds give (issue 17).

Eight threads building the zoo with fusion="tvmfuse" used to crash (TVM's BlockBuilder keeps its
open function scopes on a class-level list; tvmfuse swapped BlockBuilder.call_te process-wide and
kept its kernel names on a global stack). Each thread here makes its workload's module too, so the
zoo's graph construction is exercised concurrently as well.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import tvmfuse
from tvmfuse.zoo import workloads


def _build(name):
    w = workloads.get(name)
    c = tvmfuse.build(w.mod, "llvm", "tvmfuse")
    out = c(*w.inputs())
    return c.launches, c.call_sites(), c.plan.to_json(), out if isinstance(out, tuple) else (out,)


def _same(a, b, name):
    assert a[0] == b[0], f"{name}: {a[0]} launches in a thread, {b[0]} serially"
    assert a[1] == b[1], f"{name}: kernels differ: {a[1]} vs {b[1]}"
    assert a[2] == b[2], f"{name}: the fusion plan differs"
    assert len(a[3]) == len(b[3]) and all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a[3], b[3])), name


def test_eight_threads_three_rounds_match_serial_builds():
    names = workloads.names()
    serial = {n: _build(n) for n in names}
    with ThreadPoolExecutor(max_workers=8) as pool:
        for round_ in range(3):
            order = names[round_:] + names[:round_]  # a different mix in flight each round
            for name, got in zip(order, pool.map(_build, order)):
                _same(got, serial[name], name)
