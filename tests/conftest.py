import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest

import tvmfuse
from tvmfuse import workloads

_BUILDS = {}


def built(name, fusion, target="llvm", size="small"):
    """Build cache shared by the tests (a build is ~0.1-0.5 s; many tests read the same one)."""
    key = (name, fusion, target, size)
    if key not in _BUILDS:
        _BUILDS[key] = tvmfuse.build(workloads.get(name, size).mod, target, fusion)
    return _BUILDS[key]


def assert_matches(out, ref, rtol, atol):
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)


@pytest.fixture
def build_cached():
    return built
