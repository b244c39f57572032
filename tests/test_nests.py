"""schedules/nests.py: a horizontal kernel's independent nests cut apart, scheduled by the rules,
joined into one function; and where it must not fire. The joined kernels' numerics are checked in
tests/test_fuse_horizontal.py (against numpy and against the nests built apart)."""
import tvm
from tvm import te

from schedules.cpu.rules import RULES
from schedules.nests import Nests, split


def _func(kind=None):
    """A matmul C, and beside it D = 2A, E = D + 1 (linked by D): two parts."""
    a, b = te.placeholder((8, 16), name="A"), te.placeholder((16, 8), name="B")
    k = te.reduce_axis((0, 16), "k")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    d = te.compute((8, 16), lambda i, j: a[i, j] * 2.0, name="D")
    e = te.compute((8, 16), lambda i, j: d[i, j] + 1.0, name="E")
    f = te.create_prim_func([a, b, c, e])
    return f if kind is None else f.with_attr("tvmfuse.group", {"kind": kind})


def _stmts(f):
    body = f.body.block.body
    return list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]


def test_split_links_statements_by_an_intermediate_not_by_a_shared_input():
    f = _func()
    assert split(_stmts(f)) == [[0], [1, 2]]  # C alone; D and E through D (all three read A)


def test_golden_a_horizontal_kernel_is_scheduled_nest_by_nest():
    out = Nests(lambda: RULES[1:]).apply(_func("horizontal (2 independent nests)"), tvm.target.Target({"kind": "llvm"}))
    assert out is not None
    assert str(out.attrs["tvmfuse.rule"]) == "cpu.Nests[cpu.Matmul,cpu.Injective]"
    assert [p.name for p in out.params] == ["A", "B", "C", "E"]
    lib = tvm.compile(tvm.IRModule({"main": out}), target="llvm")
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)).astype("float32"), rng.standard_normal((16, 8)).astype("float32")
    c, e = tvm.runtime.tensor(np.zeros((8, 8), "float32")), tvm.runtime.tensor(np.zeros((8, 16), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c, e)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), 2 * a + 1, rtol=1e-6)


def test_must_not_fire_outside_a_horizontal_group_or_without_a_compute_heavy_nest():
    target = tvm.target.Target({"kind": "llvm"})
    rule = Nests(lambda: RULES[1:])
    assert rule.apply(_func(), target) is None
    assert rule.apply(_func("elementwise"), target) is None
    a = te.placeholder((8, 16), name="A")
    d = te.compute((8, 16), lambda i, j: a[i, j] * 2.0, name="D")
    e = te.compute((8, 16), lambda i, j: a[i, j] + 1.0, name="E")
    plain = te.create_prim_func([a, d, e]).with_attr("tvmfuse.group", {"kind": "horizontal (2 independent nests)"})
    assert rule.apply(plain, target) is None  # the rules below schedule such nests side by side
