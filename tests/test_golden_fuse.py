"""Golden Before/Expected IR for FuseGroupsTE (fusion/fuse_groups_te.py), with the cases where it
must not fire. The plan it stamps (`tvmfuse.plan`) is checked apart from the IR."""
import json

import tvm
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tvmfuse.fusion.fuse_groups_te import FuseGroupsTE
from tvmfuse.fusion.plan import Plan


def _fused(mod, **knobs):
    out = FuseGroupsTE(**knobs)(mod)
    return out.without_attr("tvmfuse.plan"), Plan.of(out)


@I.ir_module
class ChainAndSibling:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), b: R.Tensor((8,), "float32")):
        with R.dataflow():
            lv = R.add(x, b)
            lv1 = R.nn.relu(lv)
            lv2 = R.exp(x)
            R.output(lv1, lv2)
        return (lv1, lv2)


@I.ir_module
class ChainAndSiblingFused:
    @T.prim_func(s_tir=True)
    def fused_add_relu_exp(x: T.Buffer((T.int64(4), T.int64(8)), "float32"), b: T.Buffer((T.int64(8),), "float32"),
                           compute: T.Buffer((T.int64(4), T.int64(8)), "float32"),
                           compute_1: T.Buffer((T.int64(4), T.int64(8)), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True,
                     "tvmfuse.group": {"classes": "broadcast,elementwise,elementwise", "id": "b0g0",
                                       "kind": "pointwise chain", "ops": "add,nn.relu,exp",
                                       "rule": "producer-consumer+sibling"}})
        T_add = T.sblock_alloc_buffer((T.int64(4), T.int64(8)))
        # topi's relu/exp computes come out of TE with an int32 lower bound and int64 extents
        for ax0, ax1 in T.grid(T.int64(4), T.int64(8)):
            with T.sblock("T_add"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(x[v_ax0, v_ax1], b[v_ax1])
                T.writes(T_add[v_ax0, v_ax1])
                T_add[v_ax0, v_ax1] = x[v_ax0, v_ax1] + b[v_ax1]
        for i0, i1 in T.grid(T.int64(4), T.int64(8)):
            with T.sblock("compute"):
                v_i0 = T.axis.spatial((0, T.int64(4)), i0)
                v_i1 = T.axis.spatial((0, T.int64(8)), i1)
                T.reads(T_add[v_i0, v_i1])
                T.writes(compute[v_i0, v_i1])
                compute[v_i0, v_i1] = T.max(T_add[v_i0, v_i1], T.float32(0.0))
        for i0, i1 in T.grid(T.int64(4), T.int64(8)):
            with T.sblock("compute_1"):
                v_i0 = T.axis.spatial((0, T.int64(4)), i0)
                v_i1 = T.axis.spatial((0, T.int64(8)), i1)
                T.reads(x[v_i0, v_i1])
                T.writes(compute_1[v_i0, v_i1])
                compute_1[v_i0, v_i1] = T.exp(x[v_i0, v_i1])

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), b: R.Tensor((8,), "float32")):
        cls = ChainAndSiblingFused
        with R.dataflow():
            fused_add_relu_exp = R.call_tir(cls.fused_add_relu_exp, (x, b),
                                            out_ty=[R.Tensor((4, 8), "float32"), R.Tensor((4, 8), "float32")])
            lv1: R.Tensor((4, 8), "float32") = fused_add_relu_exp[0]
            lv2: R.Tensor((4, 8), "float32") = fused_add_relu_exp[1]
            R.output(lv1, lv2)
        return (lv1, lv2)


def test_a_chain_and_its_sibling_become_one_prim_func():
    got, plan = _fused(ChainAndSibling)
    tvm.ir.assert_structural_equal(got, ChainAndSiblingFused)
    (g,) = plan.groups
    assert g.kernel == "fused_add_relu_exp" and g.merges == ("edge", "sibling") and not plan.refused
    assert json.loads(plan.to_json())["groups"][0]["ops"] == [["lv", "add", "broadcast"], ["lv1", "nn.relu", "elementwise"],
                                                             ["lv2", "exp", "elementwise"]]


@I.ir_module
class OneOp:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            lv = R.exp(x)
            R.output(lv)
        return lv


@I.ir_module
class TwoMatmuls:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w1: R.Tensor((8, 8), "float32"),
             w2: R.Tensor((8, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            lv = R.matmul(x, w1)
            lv1 = R.matmul(lv, w2)
            R.output(lv1)
        return lv1


def test_must_not_fire_on_a_single_op():
    got, plan = _fused(OneOp)
    tvm.ir.assert_structural_equal(got, OneOp)
    assert [g.kernel for g in plan.groups] == [None] and not plan.refused


def test_must_not_fire_on_two_compute_heavy_ops():
    got, plan = _fused(TwoMatmuls)
    tvm.ir.assert_structural_equal(got, TwoMatmuls)
    (r,) = plan.refused
    assert (r.a, r.b, r.kind, r.rule) == (("lv",), ("lv1",), "edge", "anchor")


def test_must_not_fire_under_a_one_op_limit():
    got, plan = _fused(ChainAndSibling, max_group_size=1)
    tvm.ir.assert_structural_equal(got, ChainAndSibling)
    assert {r.rule for r in plan.refused} == {"max_group_size"} and len(plan.groups) == 3
