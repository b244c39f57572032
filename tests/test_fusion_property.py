"""Property: random DAGs of supported ops -> fused == unfused numerically, fused launches <= stock."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op as R

import tvmfuse

from conftest import assert_matches

UNARY = [R.exp, R.abs, R.nn.relu, R.tanh, R.sigmoid, lambda x: R.multiply(x, x)]
BINARY = [R.add, R.subtract, R.multiply, R.maximum]
ROW_REDUCE = [lambda x: R.max(x, axis=-1, keepdims=True), lambda x: R.mean(x, axis=-1, keepdims=True),
              lambda x: R.sum(x, axis=-1, keepdims=True)]


@st.composite
def graphs(draw):
    rows = draw(st.sampled_from([1, 3, 8]))
    cols = draw(st.sampled_from([1, 5, 16]))
    n_ops = draw(st.integers(2, 9))
    steps = [(draw(st.integers(0, 3)), draw(st.integers(0, 99)), draw(st.integers(0, 99)), draw(st.integers(0, 99)))
             for _ in range(n_ops)]
    return rows, cols, steps


def build_graph(rows, cols, steps):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    y = relax.Var("y", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            full, small = [x, y], []  # tensors of shape (rows, cols) and (rows, 1)
            for kind, a, b, c in steps:
                if kind == 0:
                    full.append(bb.emit(UNARY[a % len(UNARY)](full[b % len(full)])))
                elif kind == 1:
                    full.append(bb.emit(BINARY[a % len(BINARY)](full[b % len(full)], full[c % len(full)])))
                elif kind == 2:
                    small.append(bb.emit(ROW_REDUCE[a % len(ROW_REDUCE)](full[b % len(full)])))
                elif small:  # broadcast a row statistic back
                    full.append(bb.emit(R.subtract(full[b % len(full)], small[c % len(small)])))
            outs = [full[-1]] + ([small[-1]] if small else [])
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_dags_fuse_correctly(g):
    rows, cols, steps = g
    mod = build_graph(rows, cols, steps)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((rows, cols)).astype("float32") for _ in range(2)]
    unfused = tvmfuse.build(mod, "llvm", "none")
    fused = tvmfuse.build(mod, "llvm", "tvmfuse")
    stock = tvmfuse.build(mod, "llvm", "tvm")
    assert_matches(fused(*inputs), unfused(*inputs), 1e-5, 1e-5)
    assert fused.launches <= stock.launches
