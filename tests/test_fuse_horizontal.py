"""Golden tests of fusion/fuse_horizontal.py: independent elementwise groups joined into one kernel
(knob `horizontal`, off by default), and the cases where it must not fire."""
import logging

import numpy as np
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op as R

import tvmfuse
from tvmfuse.fusion.plan import Plan
from tvmfuse.relax_utils import call_tir_sites

from conftest import assert_matches
from test_fusion import _callees, _mod  # one Relax module from a body, its call_tir callees


def _sgd_like(bb, p1, g1, p2, g2, p3, g3):
    """Three independent parameter updates of different shapes: p - 0.1 * (g + 0.01 * p)."""
    outs = []
    for p, g in ((p1, g1), (p2, g2), (p3, g3)):
        d = bb.emit(R.add(g, bb.emit(R.multiply(p, relax.const(0.01, "float32")))))
        outs.append(bb.emit(R.subtract(p, bb.emit(R.multiply(d, relax.const(0.1, "float32"))))))
    return outs


SPECS = [("p1", (16, 8)), ("g1", (16, 8)), ("p2", (16,)), ("g2", (16,)), ("p3", (4, 16)), ("g3", (4, 16))]


def _inputs(specs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for _, s in specs]


def test_golden_independent_updates_are_one_kernel_with_their_own_nests():
    mod = _mod(SPECS, _sgd_like)
    assert len(_callees(tvmfuse.fuse(mod))) == 3  # off by default: one kernel per update
    fused = tvmfuse.fuse(mod, horizontal=True)
    (name,) = _callees(fused)
    pf = fused[name]
    assert len(pf.params) == 9  # six inputs, three outputs of three shapes
    groups = [g for g in Plan.of(fused).groups if g.fused]
    assert len(groups) == 1 and groups[0].kind.startswith("horizontal (3")
    args = _inputs(SPECS)
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert c.launches == 1
    want = [p - 0.1 * (g + 0.01 * p) for p, g in zip(args[::2], args[1::2])]
    for got, ref in zip(c(*args), want):
        assert_matches(got, ref, 1e-6, 1e-6)
    assert tvmfuse.build(mod, "llvm", "tvmfuse").launches == 3


def test_must_not_fire_dependent_groups(caplog):
    """a = exp(2x) -> c = cumsum(a) (opaque: a scan) -> b = tanh(c + 1): the two elementwise groups
    are connected through the scan; one kernel for both would have to hold the scan between them."""
    def body(bb, x):
        a = bb.emit(R.exp(bb.emit(R.multiply(x, relax.const(2.0, "float32")))))
        c = bb.emit(R.cumsum(a, axis=1))
        return [bb.emit(R.tanh(bb.emit(R.add(c, relax.const(1.0, "float32"))))), a]

    mod = _mod([("x", (8, 16))], body)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert not any(g.kind.startswith("horizontal") for g in c.plan.groups)
    assert any(r.kind == "horizontal" and r.rule == "dependent" for r in c.plan.refused)
    assert "refused horizontal" in caplog.text and "[dependent]" in caplog.text
    (x,) = _inputs([("x", (8, 16))], 1)
    a = np.exp(x * 2)
    out = c(x)
    assert_matches(out[0], np.tanh(np.cumsum(a, axis=1) + 1), 1e-5, 1e-5)
    assert_matches(out[1], a, 1e-5, 1e-6)


def test_must_not_fire_non_elementwise_groups():
    """Two independent row softmaxes (reductions) stay their own kernels; the two elementwise
    chains join the matmul's launch (an elementwise group may join a compute-heavy one), each nest
    with its own rule."""
    def body(bb, x, y, w, u, v):
        return [bb.emit(R.nn.softmax(x)), bb.emit(R.nn.softmax(y)), bb.emit(R.matmul(x, w)),
                bb.emit(R.exp(bb.emit(R.add(u, u)))), bb.emit(R.tanh(bb.emit(R.multiply(v, v))))]

    specs = [("x", (8, 16)), ("y", (4, 16)), ("w", (16, 8)), ("u", (32,)), ("v", (2, 3))]
    mod = _mod(specs, body)
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    joined = [g for g in c.plan.groups if g.kind.startswith("horizontal")]
    assert len(joined) == 1 and {op for _, op, _ in joined[0].ops} == {"matmul", "add", "exp", "multiply", "tanh"}
    assert c.launches == 3 and any(r.startswith("cpu.Nests[cpu.Matmul,cpu.Injective") for r in c.rules())
    assert not any(r.rule != "not_elementwise" and r.kind == "horizontal" for r in c.plan.refused)
    assert sum(r.rule == "not_elementwise" for r in c.plan.refused) >= 2
    x, y, w, u, v = _inputs(specs, 2)
    out = c(x, y, w, u, v)
    assert_matches(out[2], x @ w, 1e-5, 1e-5)
    assert_matches(out[3], np.exp(u + u), 1e-5, 1e-6)
    assert_matches(out[4], np.tanh(v * v), 1e-5, 1e-6)


def test_horizontal_max_ops_bounds_a_joined_group(caplog):
    mod = _mod(SPECS, _sgd_like)
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True, horizontal_max_ops=8)
    assert c.launches == 2  # 4 ops per update: two fit in 8, the third opens a second kernel
    assert "horizontal_max_ops=8" in caplog.text
    args = _inputs(SPECS)
    for got, (p, g) in zip(c(*args), zip(args[::2], args[1::2])):
        assert_matches(got, p - 0.1 * (g + 0.01 * p), 1e-6, 1e-6)


def _bias_grads(bb, dy, xhat, dz):
    """A norm's dgamma and dbeta (sums over the batch of dy * xhat and dy) and another layer's bias
    gradient (the sum of dz over the batch, reshaped): independent column sums of one space."""
    dgamma = bb.emit(R.sum(bb.emit(R.multiply(dy, xhat)), axis=[0]))
    dbeta = bb.emit(R.sum(dy, axis=[0]))
    db = bb.emit(R.reshape(bb.emit(R.sum(dz, axis=[0], keepdims=True)), (32,)))
    return [dgamma, dbeta, db]


BIAS_SPECS = [("dy", (8, 32)), ("xhat", (8, 32)), ("dz", (8, 32))]


def test_golden_independent_column_sums_of_one_space_are_one_kernel():
    mod = _mod(BIAS_SPECS, _bias_grads)
    assert tvmfuse.build(mod, "llvm", "tvmfuse").launches == 2  # the siblings on dy, and dz's sum
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert c.launches == 1
    assert c.rules() == ["cpu.ColumnReduction"]
    assert any(g.kind.startswith("horizontal") for g in c.plan.groups)
    dy, xhat, dz = _inputs(BIAS_SPECS, 3)
    out = c(dy, xhat, dz)
    assert_matches(out[0], (dy * xhat).sum(0), 1e-5, 1e-5)
    assert_matches(out[1], dy.sum(0), 1e-5, 1e-5)
    assert_matches(out[2], dz.sum(0), 1e-5, 1e-5)


def test_must_not_fire_column_sums_of_other_spaces_or_row_sums(caplog):
    """A column sum over [8, 64] stays apart from one over [8, 32]; a row sum (a trailing axis: its
    rows are another loop) is not joined at all."""
    def body(bb, a, b, r):
        return [bb.emit(R.sum(a, axis=[0])), bb.emit(R.sum(b, axis=[0])), bb.emit(R.sum(r, axis=[1]))]

    specs = [("a", (8, 32)), ("b", (8, 64)), ("r", (8, 32))]
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(_mod(specs, body), "llvm", "tvmfuse", horizontal=True)
    assert c.launches == 3
    assert any(r.kind == "horizontal" and r.rule == "reduction_space" for r in c.plan.refused)
    assert any(r.kind == "horizontal" and r.rule == "not_elementwise" and "reduction" in r.reason
               for r in c.plan.refused)
    a, b, r = _inputs(specs, 4)
    out = c(a, b, r)
    for got, want in zip(out, (a.sum(0), b.sum(0), r.sum(1))):
        assert_matches(got, want, 1e-5, 1e-5)


def _linear_grads(bb, dy, x, w):
    """A linear layer's backward: dx = dy @ w, dw = dy^T @ x, db = sum(dy, 0): three siblings on dy."""
    return [bb.emit(R.matmul(dy, w)), bb.emit(R.matmul(bb.emit(R.permute_dims(dy, [1, 0])), x)),
            bb.emit(R.sum(dy, axis=[0]))]


LINEAR_SPECS = [("dy", (16, 32)), ("x", (16, 24)), ("w", (32, 24))]


def test_golden_sibling_matmuls_and_their_bias_sum_are_one_launch_with_their_own_schedules():
    """Each nest keeps the rule it gets as a kernel of its own."""
    mod = _mod(LINEAR_SPECS, _linear_grads)
    apart = tvmfuse.build(mod, "llvm", "tvmfuse")
    assert sorted(apart.rules()) == ["cpu.ColumnReduction", "cpu.Matmul", "cpu.Matmul"]
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert c.launches == 1
    (rule,) = c.rules()
    assert rule.startswith("cpu.Nests[") and sorted(rule[len("cpu.Nests["):-1].split(",")) == sorted(apart.rules())
    dy, x, w = _inputs(LINEAR_SPECS, 5)
    out = c(dy, x, w)
    assert_matches(out[0], dy @ w, 1e-4, 1e-5)
    assert_matches(out[1], dy.T @ x, 1e-4, 1e-5)
    assert_matches(out[2], dy.sum(0), 1e-5, 1e-5)


def _conv_grads(bb, dy, x, w):
    """A 3x3 stride-1 convolution's backward: its input gradient (a transposed convolution) and its
    weight gradient (a convolution over the batch), both reading dy."""
    dx = bb.emit(R.nn.conv2d_transpose(dy, w, padding=[1, 1], kernel_layout="IOHW"))
    xt, dyt = bb.emit(R.permute_dims(x, [1, 0, 2, 3])), bb.emit(R.permute_dims(dy, [1, 0, 2, 3]))
    dw = bb.emit(R.permute_dims(bb.emit(R.nn.conv2d(xt, dyt, padding=[1, 1])), [1, 0, 2, 3]))
    return [bb.emit(R.nn.relu(dx)), dw]


CONV_SPECS = [("dy", (2, 8, 6, 6)), ("x", (2, 4, 6, 6)), ("w", (8, 4, 3, 3))]


def test_golden_a_convolutions_input_and_weight_gradients_are_one_launch():
    mod = _mod(CONV_SPECS, _conv_grads)
    apart = tvmfuse.build(mod, "llvm", "tvmfuse")
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert (apart.launches, c.launches) == (2, 1)
    (rule,) = c.rules()
    assert rule.startswith("cpu.Nests[") and "Fallback" not in rule
    args = _inputs(CONV_SPECS, 6)
    for got, want in zip(c(*args), apart(*args)):
        assert_matches(got, want, 1e-4, 1e-5)


def test_must_not_fire_compute_heavy_groups_without_a_shared_input_or_on_a_path(caplog):
    """Two matmuls over different inputs stay apart (no_shared_input), and so do two that read `a`
    when one reads the other's output too (dependent)."""
    def body(bb, a, b, c, d):
        first = bb.emit(R.matmul(a, b))
        return [first, bb.emit(R.matmul(c, d)), bb.emit(R.matmul(first, a))]

    specs = [("a", (8, 16)), ("b", (16, 8)), ("c", (8, 8)), ("d", (8, 8))]
    with caplog.at_level(logging.INFO, logger="tvmfuse.fusion"):
        c = tvmfuse.build(_mod(specs, body), "llvm", "tvmfuse", horizontal=True)
    rules = {r.rule for r in c.plan.refused if r.kind == "horizontal"}
    assert "no_shared_input" in rules and "dependent" in rules
    assert c.launches == 3
    a, b, cc, d = _inputs(specs, 7)
    out = c(a, b, cc, d)
    for got, want in zip(out, (a @ b, cc @ d, (a @ b) @ a)):
        assert_matches(got, want, 1e-4, 1e-5)


def _mask_beside_matmul(bb, x, w, g):
    """A ReLU mask of x (recomputed in a backward) read by a where, and a matmul of x."""
    mask = bb.emit(R.less_equal(x, relax.const(0.0, "float32")))
    return [bb.emit(R.matmul(x, w)), bb.emit(R.where(mask, relax.const(0.0, "float32"), g))]


MASK_SPECS = [("x", (16, 32)), ("w", (32, 16)), ("g", (16, 32))]


def test_with_horizontal_an_elementwise_sibling_is_not_merged_into_a_compute_heavy_group():
    """Merged into the matmul's group the mask would order the where after the matmul; with the
    knob on it is not a sibling merge (profitability), it goes with its consumer, and the two groups
    still share one launch. Without the knob the sibling merge stands (must not fire)."""
    mod = _mod(MASK_SPECS, _mask_beside_matmul)
    plain = tvmfuse.build(mod, "llvm", "tvmfuse")
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    (apart,), (joined,) = plain.plan.groups, c.plan.groups
    assert apart.merges[0] == "sibling"  # the mask went into the matmul's group
    assert joined.merges == ("edge", "horizontal")  # the mask with its where; the matmul beside them
    assert {op for _, op, _ in joined.ops} == {"less_equal", "where", "matmul"}
    assert c.launches == 1
    x, w, g = _inputs(MASK_SPECS, 8)
    out = c(x, w, g)
    assert_matches(out[0], x @ w, 1e-4, 1e-5)
    assert_matches(out[1], np.where(x <= 0, 0.0, g), 1e-6, 1e-6)


@st.composite
def _sibling_graphs(draw):
    """Random DAGs over x, y [rows, 16] and w [16, 16]: elementwise ops, matmuls by w or w^T (a
    linear layer's forward and backward shapes), column sums; several of them returned."""
    rows = draw(st.sampled_from([3, 8]))
    steps = [(draw(st.integers(0, 3)), draw(st.integers(0, 99)), draw(st.integers(0, 99)))
             for _ in range(draw(st.integers(2, 8)))]
    return rows, steps, draw(st.integers(1, 3))


def _build_sibling_graph(rows, steps, n_out):
    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType((rows, 16), "float32")) for n in "xy")
    w = relax.Var("w", relax.TensorType((16, 16), "float32"))
    with bb.function("main", [x, y, w]):
        with bb.dataflow():
            full, sums = [x, y], []
            for kind, a, b in steps:
                src = full[a % len(full)]
                if kind == 0:
                    full.append(bb.emit(R.matmul(src, w if b % 2 else bb.emit(R.permute_dims(w, [1, 0])))))
                elif kind == 1:
                    full.append(bb.emit(R.add(src, full[b % len(full)])))
                elif kind == 2:
                    full.append(bb.emit(R.nn.relu(src)))
                else:
                    sums.append(bb.emit(R.sum(src, axis=[0])))
            outs = (full[2:] or full)[-n_out:] + sums[-1:]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_sibling_graphs())
def test_property_horizontal_joins_keep_the_math_and_never_add_launches(g):
    mod = _build_sibling_graph(*g)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((g[0], 16)).astype("float32") for _ in range(2)] + \
        [rng.standard_normal((16, 16)).astype("float32")]
    unfused = tvmfuse.build(mod, "llvm", "none")
    fused = tvmfuse.build(mod, "llvm", "tvmfuse")
    joined = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert joined.launches <= fused.launches
    want = unfused(*inputs)
    got = joined(*inputs)
    for a, b in zip(got if isinstance(got, (list, tuple)) else [got], want if isinstance(want, (list, tuple)) else [want]):
        assert_matches(a, b, 1e-4, 1e-4)


def test_sibling_anchors_with_constant_weights_keep_their_prepacked_schedules():
    """Matmuls and convs of one input by constant weights (packed at build time): joined in pairs,
    each nest still its own rule's, the results the unfused graph's."""
    rng = np.random.default_rng(9)
    w1, w2 = (rng.standard_normal(s).astype("float32") for s in ((64, 48), (64, 32)))
    k1, k2 = (rng.standard_normal((16, 8, 3, 3)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    im = relax.Var("im", relax.TensorType((2, 8, 12, 12), "float32"))
    with bb.function("main", [x, im]):
        with bb.dataflow():
            outs = [bb.emit(R.matmul(x, relax.const(w1))), bb.emit(R.nn.relu(bb.emit(R.matmul(x, relax.const(w2))))),
                    bb.emit(R.nn.conv2d(im, relax.const(k1), padding=[1, 1])),
                    bb.emit(R.nn.conv2d(im, relax.const(k2), padding=[1, 1]))]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    c = tvmfuse.build(mod, "llvm", "tvmfuse", horizontal=True)
    assert sorted(c.rules()) == ["cpu.Nests[cpu.Conv2D,cpu.Conv2D]", "cpu.Nests[cpu.Matmul,cpu.Matmul]"]
    args = (rng.standard_normal((16, 64)).astype("float32"), rng.standard_normal((2, 8, 12, 12)).astype("float32"))
    for got, want in zip(c(*args), tvmfuse.build(mod, "llvm", "none")(*args)):
        assert_matches(got, want, 1e-4, 1e-4)
