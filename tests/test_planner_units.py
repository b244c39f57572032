"""Direct unit tests of the fusion planner's three parts on small hand-built graphs (issue 17, item 8):

- legality.check(g, members, knobs) -> None or (rule, reason)
- profitability.score(g, a, b, knobs, shared) -> (bytes saved, None) or (None, reason)
- plan_fusion.plan(block, outputs, knobs).groups -> sorted lists of node indices (block positions)

Every graph is one dataflow block built with relax.BlockBuilder; every op binding is a node, so node
i is the i-th binding. Shapes are float32: an (8, 16) tensor is 512 bytes.
"""
import dataclasses

import numpy as np

import pytest
from tvm import relax

from tvmfuse.fusion import legality, plan_fusion, profitability
from tvmfuse.fusion.graph import BlockGraph
from tvmfuse.fusion.plan_fusion import plan

try:
    from tvmfuse.config import default_knobs as _dk

    KNOBS = _dk()
except ImportError:
    try:
        from tvmfuse.fusion.plan_fusion import DEFAULT_KNOBS as KNOBS
    except ImportError:  # the defaults moved to tvmfuse.config.Knobs
        from tvmfuse.config import Knobs

        KNOBS = Knobs()
KNOBS = dataclasses.asdict(KNOBS) if dataclasses.is_dataclass(KNOBS) else dict(KNOBS)

F32 = "float32"
X_BYTES = 8 * 16 * 4  # one (8, 16) float32 tensor
MM_BYTES = 8 * 32 * 4  # one (8, 32) float32 tensor


def knobs(**over):
    assert set(over) <= set(KNOBS), f"unknown knob in {over}: known {sorted(KNOBS)}"
    return {**KNOBS, **over}


def _ty(*shape):
    return relax.TensorType(shape, F32)


def graph(body):
    """body(bb, x, w, b) -> the output expr; x (8, 16), w (16, 32), b (32,). Returns (block, outputs)."""
    bb = relax.BlockBuilder()
    x, w, b = relax.Var("x", _ty(8, 16)), relax.Var("w", _ty(16, 32)), relax.Var("b", _ty(32))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x, w, b))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    (block,) = func.body.blocks
    return block, set(relax.analysis.free_vars(func.body.body))


def block_graph(body):
    return BlockGraph(*graph(body))


def refusal(r):
    """(a, b, kind, rule, reason) of a refusal: a tuple today, a dataclass / named record soon."""
    if hasattr(r, "rule"):
        return tuple(r.a), tuple(r.b), r.kind, r.rule, r.reason
    a, b, kind, rule, reason = tuple(r)[-5:]
    return tuple(a), tuple(b), kind, rule, reason


def assert_refused(res, rule):
    """A legality.check result: (rule, reason) with a non-empty reason."""
    assert res is not None, f"expected a '{rule}' refusal, got a legal merge"
    assert res[0] == rule, res
    assert isinstance(res[1], str) and res[1].strip(), res


def rules(p):
    return sorted({refusal(r)[3] for r in p.refused})


# ------------------------------------------------------------------ graphs
def ew_chain(bb, x, w, b):  # add -> relu -> exp
    a = bb.emit(relax.op.add(x, x))
    r = bb.emit(relax.op.nn.relu(a))
    return relax.op.exp(r)


def matmul_epilogue(bb, x, w, b):  # matmul -> bias add -> relu
    m = bb.emit(relax.op.matmul(x, w))
    a = bb.emit(relax.op.add(m, b))
    return relax.op.nn.relu(a)


def matmul_softmax(bb, x, w, b):
    m = bb.emit(relax.op.matmul(x, w))
    return relax.op.nn.softmax(m, axis=-1)


def two_matmuls(bb, x, w, b):
    m = bb.emit(relax.op.matmul(x, w))
    t = bb.emit(relax.op.permute_dims(w))
    return relax.op.matmul(m, t)


def opaque_middle(bb, x, w, b):  # exp -> external kernel -> relu
    a = bb.emit(relax.op.exp(x))
    c = bb.emit(relax.call_dps_packed("my_ext", [a], out_ty=_ty(8, 16)))
    return relax.op.nn.relu(c)


def no_legalizer(bb, x, w, b):  # exp -> unique (an op without FLegalize)
    a = bb.emit(relax.op.exp(x))
    return relax.op.unique(a)


def around_opaque(bb, x, w, b):  # a -> ext -> c and a -> c: a and c may only merge through ext
    a = bb.emit(relax.op.exp(x))
    c = bb.emit(relax.call_dps_packed("my_ext", [a], out_ty=_ty(8, 16)))
    return relax.op.add(a, c)


def relu_into_matmul(bb, x, w, b):
    r = bb.emit(relax.op.nn.relu(x))
    return relax.op.matmul(r, w)


def siblings(bb, x, w, b):  # exp(x), relu(x): two readers of x, no edge between them
    a = bb.emit(relax.op.exp(x))
    c = bb.emit(relax.op.nn.relu(x))
    return relax.Tuple([a, c])


def two_outputs(bb, x, w, b):  # exp -> relu, both returned
    a = bb.emit(relax.op.exp(x))
    c = bb.emit(relax.op.nn.relu(a))
    return relax.Tuple([a, c])


def softmax_decomposed(bb, x, w, b):  # max, sub, exp, sum, div over the rows of x
    m = bb.emit(relax.op.max(x, axis=[1], keepdims=True))
    s = bb.emit(relax.op.subtract(x, m))
    e = bb.emit(relax.op.exp(s))
    t = bb.emit(relax.op.sum(e, axis=[1], keepdims=True))
    return relax.op.divide(e, t)


def crossed_reductions(bb, x, w, b):  # sum over rows and over columns of the same x
    r = bb.emit(relax.op.sum(x, axis=[1]))
    c = bb.emit(relax.op.sum(x, axis=[0]))
    return relax.Tuple([r, c])


def loss_and_bias_grad(bb, x, w, b):  # a scalar loss beside a bias gradient (a column sum) of x
    loss = bb.emit(relax.op.mean(x))
    grad = bb.emit(relax.op.collapse_sum_to(x, relax.ShapeExpr([16])))
    return relax.Tuple([loss, grad])


def swiglu(bb, x, w, b):  # matmul -> split -> silu(first half) * second half: two slices meet
    m = bb.emit(relax.op.matmul(x, w))
    parts = bb.emit(relax.op.split(m, 2, axis=-1))
    g = bb.emit(relax.TupleGetItem(parts, 0))
    u = bb.emit(relax.TupleGetItem(parts, 1))
    s = bb.emit(relax.op.nn.silu(g))
    return relax.op.multiply(s, u)


def silu_epilogue(bb, x, w, b):  # matmul -> x * sigmoid(x): one position of the output per element
    m = bb.emit(relax.op.matmul(x, w))
    s = bb.emit(relax.op.sigmoid(m))
    return relax.op.multiply(m, s)


def tuple_escapes(bb, x, w, b):  # split's tuple returned whole, one field used by exp
    t = bb.emit(relax.op.split(x, 2, axis=1))
    h = bb.emit(relax.TupleGetItem(t, 0))
    e = bb.emit(relax.op.exp(h))
    return relax.Tuple([t, e])


# ====================================================================== legality.check
@pytest.mark.parametrize("body,members", [(ew_chain, {0, 1, 2}), (matmul_epilogue, {0, 1, 2}),
                                          (softmax_decomposed, {0, 1, 2, 3, 4}), (two_outputs, {0, 1})])
def test_legal_merges(body, members):
    assert legality.check(block_graph(body), members, knobs()) is None


def test_graph_classes_the_tests_rely_on():
    g = block_graph(matmul_epilogue)
    assert [n.cls for n in g.nodes] == ["compute-heavy", "broadcast", "elementwise"]
    assert [n.idx for n in g.nodes] == [0, 1, 2]
    assert g.users == {0: {1}, 1: {2}, 2: set()}


def test_reduction_next_to_a_matmul_anchor_is_refused():
    assert_refused(legality.check(block_graph(matmul_softmax), {0, 1}, knobs()), "anchor")


def test_an_epilogue_combining_two_slices_of_the_anchor_is_refused():
    g = block_graph(swiglu)
    split, silu, mul = (n.idx for n in g.nodes if n.op in ("split", "nn.silu", "multiply"))
    mm = next(n.idx for n in g.nodes if n.op == "matmul")
    assert legality.check(g, {mm, split, silu}, knobs()) is None  # one path from the anchor: a tile carries it
    assert_refused(legality.check(g, {mm, split, silu, mul}, knobs()), "gathering_epilogue")
    assert legality.check(g, {split, silu, mul}, knobs()) is None  # without the anchor: an injective kernel


def test_an_epilogue_reading_the_anchor_twice_at_one_position_stays_legal():
    g = block_graph(silu_epilogue)
    assert legality.check(g, {n.idx for n in g.nodes}, knobs()) is None


def test_two_anchors_in_one_group_are_refused():
    g = block_graph(two_matmuls)
    assert legality.check(g, {1, 2}, knobs()) is None  # the transpose may join its matmul
    assert_refused(legality.check(g, {0, 1, 2}, knobs()), "anchor")


@pytest.mark.parametrize("body,members", [(opaque_middle, {0, 1}), (opaque_middle, {1, 2}),
                                          (no_legalizer, {0, 1})])
def test_opaque_ops_are_refused(body, members):
    assert_refused(legality.check(block_graph(body), members, knobs()), "opaque")


def test_tuple_used_whole_outside_the_group_is_refused():
    assert_refused(legality.check(block_graph(tuple_escapes), {0, 2}, knobs()), "opaque")


@pytest.mark.parametrize("limit,legal", [(1, False), (2, False), (3, True)])
def test_max_group_size_is_an_upper_bound(limit, legal):
    res = legality.check(block_graph(ew_chain), {0, 1, 2}, knobs(max_group_size=limit))
    if legal:
        assert res is None
    else:
        assert_refused(res, "max_group_size")


def test_rules_are_checked_in_order_opaque_first():
    res = legality.check(block_graph(opaque_middle), {0, 1}, knobs(max_group_size=1))
    assert_refused(res, "opaque")


def test_reductions_over_different_spaces_are_refused():
    assert_refused(legality.check(block_graph(crossed_reductions), {0, 1}, knobs()), "reduction_space")


def test_collapse_sum_to_reduces_the_axes_its_target_lacks():
    """collapse_sum_to has no axis attribute: its reduced axes come from its target shape. Read as
    a reduction over every axis, it stitched with a scalar loss into one kernel no row schedule
    could take (a serial loop: 35 ms on a layer norm's training step that takes 2 ms)."""
    g = block_graph(loss_and_bias_grad)
    loss, grad = g.nodes
    assert loss.row_space() == ((), True)
    assert grad.row_space() == ((8, 16), False)  # axis 0 folded: a column reduction
    assert_refused(legality.check(g, {0, 1}, knobs()), "reduction_space")


def test_stitching_two_reductions_can_be_disabled():
    g = block_graph(softmax_decomposed)
    assert legality.check(g, {0, 1, 2, 3, 4}, knobs(stitch_reductions=True)) is None
    assert_refused(legality.check(g, {0, 1, 2, 3, 4}, knobs(stitch_reductions=False)), "reduction_space")
    assert legality.check(g, {1, 2, 3, 4}, knobs(stitch_reductions=False)) is None  # one reduction only


def test_multi_output_groups_can_be_disabled():
    g = block_graph(two_outputs)
    assert legality.check(g, {0, 1}, knobs(multi_output=True)) is None
    assert_refused(legality.check(g, {0, 1}, knobs(multi_output=False)), "multi_output")
    assert legality.check(block_graph(ew_chain), {0, 1, 2}, knobs(multi_output=False)) is None


# ====================================================================== profitability.score
def test_internal_edge_saves_the_read_and_the_write():
    g = block_graph(ew_chain)
    assert profitability.score(g, {0}, {1}, knobs()) == (2 * X_BYTES, None)


def test_edge_whose_producer_is_also_an_output_saves_only_the_read():
    g = block_graph(two_outputs)
    assert profitability.score(g, {0}, {1}, knobs()) == (X_BYTES, None)


def test_matmul_epilogue_saves_the_matmul_output_round_trip():
    g = block_graph(matmul_epilogue)
    assert profitability.score(g, {0}, {1}, knobs()) == (2 * MM_BYTES, None)


def test_elementwise_producer_of_an_anchor_is_recompute():
    g = block_graph(relu_into_matmul)
    saved, why = profitability.score(g, {0}, {1}, knobs(allow_recompute=False))
    assert saved is None and isinstance(why, str) and why.strip()
    # allowed: the read and write of relu's output are saved, its recomputation costs one read back
    assert profitability.score(g, {0}, {1}, knobs(allow_recompute=True)) == (X_BYTES, None)


def test_siblings_save_their_shared_input():
    block, outputs = graph(siblings)
    g = BlockGraph(block, outputs)
    x = block.bindings[0].value.args[0]
    assert profitability.score(g, {0}, {1}, knobs(), (x,)) == (X_BYTES, None)
    saved, why = profitability.score(g, {0}, {1}, knobs(), ())  # nothing shared, no edge
    assert saved is None and isinstance(why, str) and why.strip()


# ====================================================================== plan
def test_plan_elementwise_chain_is_one_group():
    p = plan(*graph(ew_chain), knobs())
    assert p.groups == [[0, 1, 2]]
    assert list(p.refused) == []


def test_plan_matmul_bias_relu_epilogue_is_one_group():
    p = plan(*graph(matmul_epilogue), knobs())
    assert p.groups == [[0, 1, 2]]


def test_plan_refuses_softmax_into_matmul_with_a_reason():
    p = plan(*graph(matmul_softmax), knobs())
    assert p.groups == [[0], [1]]
    ((a, b, kind, rule, reason),) = [refusal(r) for r in p.refused]
    assert (a, b, kind, rule) == (("lv",), ("gv",), "edge", "anchor")
    assert isinstance(reason, str) and reason.strip()


@pytest.mark.parametrize("body,groups", [(opaque_middle, [[0], [1], [2]]), (no_legalizer, [[0], [1]])])
def test_plan_leaves_an_opaque_op_alone(body, groups):
    p = plan(*graph(body), knobs())
    assert p.groups == groups
    assert rules(p) == ["opaque"]


def test_plan_refuses_a_merge_that_would_make_a_cycle():
    p = plan(*graph(around_opaque), knobs())
    assert p.groups == [[0], [1], [2]]
    assert rules(p) == ["cycle", "opaque"]
    (cyc,) = [refusal(r) for r in p.refused if refusal(r)[3] == "cycle"]
    assert cyc[:3] == (("lv",), ("gv",), "edge") and cyc[4].strip()


@pytest.mark.parametrize("body", [ew_chain, matmul_epilogue, siblings, softmax_decomposed])
def test_plan_max_group_size_1_refuses_everything(body):
    p = plan(*graph(body), knobs(max_group_size=1))
    n = len(block_graph(body).nodes)
    assert p.groups == [[i] for i in range(n)]
    assert rules(p) == ["max_group_size"]


def test_plan_recompute_knob():
    assert plan(*graph(relu_into_matmul), knobs()).groups == [[0], [1]]
    assert rules(plan(*graph(relu_into_matmul), knobs())) == ["profitability"]
    assert plan(*graph(relu_into_matmul), knobs(allow_recompute=True)).groups == [[0, 1]]


def test_plan_sibling_knob():
    assert plan(*graph(siblings), knobs(sibling=True)).groups == [[0, 1]]
    p = plan(*graph(siblings), knobs(sibling=False))
    assert p.groups == [[0], [1]] and list(p.refused) == []  # not a candidate at all


def test_plan_stitches_the_reductions_of_a_softmax():
    assert plan(*graph(softmax_decomposed), knobs()).groups == [[0, 1, 2, 3, 4]]
    p = plan(*graph(softmax_decomposed), knobs(stitch_reductions=False))
    assert p.groups == [[0], [1, 2, 3, 4]]
    assert rules(p) == ["reduction_space"]


def test_plan_multi_output_knob():
    assert plan(*graph(two_outputs), knobs()).groups == [[0, 1]]
    p = plan(*graph(two_outputs), knobs(multi_output=False))
    assert p.groups == [[0], [1]] and rules(p) == ["multi_output"]


def test_plan_crossed_reductions_stay_apart():
    p = plan(*graph(crossed_reductions), knobs())
    assert p.groups == [[0], [1]]
    ((a, b, kind, rule, reason),) = [refusal(r) for r in p.refused]
    assert (kind, rule) == ("sibling", "reduction_space") and reason.strip()


def test_plan_tuple_alias_belongs_to_its_node():
    """A TupleGetItem is no node: node indices skip its block position."""
    p = plan(*graph(tuple_escapes), knobs())
    assert p.groups == [[0], [2]]
    assert rules(p) == ["opaque"]


def enter_late_leave_early(bb, x, w, b):
    """s = exp(x); a = neg(x); d = sqrt(a); t = tanh(s); h = a + t: with a and h one group, a path
    s -> t -> {a, h} -> d enters {a, h} at h (after d) and leaves it from a (before d)."""
    s = bb.emit(relax.op.exp(x))
    a = bb.emit(relax.op.negative(x))
    d = bb.emit(relax.op.sqrt(a))
    t = bb.emit(relax.op.tanh(s))
    h = bb.emit(relax.op.add(a, t))
    return relax.Tuple([d, h])


def test_cycle_check_follows_a_path_that_enters_a_group_late_and_leaves_early():
    """Must not fire: merging s (node 0) with d (node 2) while {a, h} (nodes 1 and 4) is one group
    is cyclic (s -> t -> {a, h} -> d), though every node on the path after s comes after d. A search
    bounded by d's last node index missed it."""
    g = block_graph(enter_late_leave_early)
    assert len(g.nodes) == 5
    group_of = {0: 0, 1: 1, 2: 2, 3: 3, 4: 1}
    members = {0: {0}, 1: {1, 4}, 2: {2}, 3: {3}}
    order = plan_fusion.group_order(g, group_of, members)
    assert order[0] < order[3] < order[1] < order[2]
    assert plan_fusion._creates_cycle(g, group_of, 0, 2, members)
    assert plan_fusion._creates_cycle(g, group_of, 2, 0, members)
    # the same merges without the group {a, h}: no third group in between, so s and d may merge
    split = {0: {0}, 1: {1}, 2: {2}, 3: {3}, 4: {4}}
    assert not plan_fusion._creates_cycle(g, {i: i for i in range(5)}, 0, 2, split)
    # and the planner never builds such a cycle: every plan's groups keep a topological order
    p = plan(*graph(enter_late_leave_early), knobs())
    gof = {i: min(m) for m in map(set, p.groups) for i in m}
    plan_fusion.group_order(p.graph, gof, {min(m): set(m) for m in p.groups})


def saved_transpose(bb, x, w, b):  # a Linear's forward in training: Wᵀ feeds the matmul AND is saved
    wt = bb.emit(relax.op.permute_dims(w))  # (32, 16)
    y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(wt)))
    return relax.Tuple([bb.emit(relax.op.add(y, b)), wt])


def test_a_prologue_used_outside_the_group_stays_a_kernel_of_its_own():
    """AOTAutograd's forward returns a Linear's transposed weight for the backward graph: fused in
    front of the matmul it would be a second output written from the matmul's operand side, which
    no matmul rule stores (the group took cpu.Fallback). Must not fire: the same transpose with no
    other user fuses (test_plan_matmul_bias_relu_epilogue_is_one_group's kind of prologue)."""
    p = plan(*graph(saved_transpose), knobs())
    assert [0] in p.groups and any(set(grp) >= {2, 3} and 0 not in grp for grp in p.groups)
    reasons = [refusal(r)[4] for r in p.refused]
    assert any("used outside the group" in why for why in reasons)
    p2 = plan(*graph(transpose_prologue), knobs())
    assert any(0 in grp and 1 in grp for grp in p2.groups)  # the transpose with one user: fused


def transpose_prologue(bb, x, w, b):  # xᵀ read in place by the matmul: the prologue that must stay
    xt = bb.emit(relax.op.permute_dims(relax.op.permute_dims(x)))
    return relax.op.matmul(xt, w)


def take_epilogue(bb, x, w, b):  # BLOOM's fused QKV split by take after the matmul
    m = bb.emit(relax.op.matmul(x, w))  # (8, 32)
    return relax.op.take(m, relax.const(np.array([0, 2, 4, 6], "int64")), axis=1)


def test_a_gather_after_a_matmul_is_refused():
    """BLOOM's QKV: matmul then take. Fused, no matmul rule took the group and cpu.Fallback ran a
    naive matmul (1007 ms a call against 90); the take stays a kernel of its own."""
    p = plan(*graph(take_epilogue), knobs())
    assert p.groups == [[0], [1]]
    assert any("gathered after compute-heavy" in refusal(r)[4] for r in p.refused)


def bias_grad_reshape(bb, x, w, b):
    """A bias gradient as AOTAutograd writes it: sum over the batch keeping the axis, then a reshape
    of the [1, 16] result to [16]."""
    s = bb.emit(relax.op.sum(x, axis=[0], keepdims=True))
    return relax.op.reshape(s, (16,))


def column_sum_beside_a_reshape_of_its_input(bb, x, w, b):
    """Must not fire: a reshape of the reduction's input rows ([8, 16] -> [128]) next to a column sum."""
    s = bb.emit(relax.op.sum(x, axis=[0]))
    r = bb.emit(relax.op.reshape(x, (128,)))
    return relax.Tuple([s, r])


def test_a_reshape_of_a_column_sum_joins_it_and_a_reshape_of_its_rows_does_not():
    """Renaming the axes of a column reduction's output ([1, 16] -> [16]) is an epilogue on the
    reduced values: one kernel (the MLP's backward: 9 kernels -> 7). A reshape of the rows the
    reduction reads is not, and stays refused."""
    g = block_graph(bias_grad_reshape)
    assert [n.op for n in g.nodes] == ["sum", "reshape"]
    assert legality.check(g, {0, 1}, knobs()) is None
    assert plan(*graph(bias_grad_reshape), knobs()).groups == [[0, 1]]
    g = block_graph(column_sum_beside_a_reshape_of_its_input)
    assert_refused(legality.check(g, {0, 1}, knobs()), "reduction_space")
