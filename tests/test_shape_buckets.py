"""Shape buckets (issue 18, item 4; passes/shape_buckets.py): one build carries a static version per
bucket and a generic symbolic one, main dispatches at run time, every size is right, bad buckets
are clear errors."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T

import tvmfuse
from tvmfuse.errors import InputError
from tvmfuse.passes.shape_buckets import add_buckets, table


@I.ir_module
class Mlp:
    @R.function
    def main(x: R.Tensor(("n", 32), "float32"), w1: R.Tensor((32, 64), "float32"),
             w2: R.Tensor((64, 32), "float32")):
        R.func_attr({"tvmfuse.ranges": {"n": [1, 512]}})
        with R.dataflow():
            h = R.nn.relu(R.matmul(x, w1))
            y = R.nn.softmax(R.add(R.matmul(h, w2), x), axis=-1)
            R.output(y)
        return y


def _ref(x, w1, w2):
    y = np.maximum(x @ w1, 0) @ w2 + x
    e = np.exp(y - y.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _static_shapes(func) -> bool:
    return all(isinstance(v, tvm.tirx.IntImm) for p in func.params for v in p.ty.shape.values)


def test_the_module_has_a_static_version_per_bucket_and_main_dispatches():
    mod = add_buckets(Mlp, {"n": [64, 16]})
    names = sorted(gv.name_hint for gv in mod.get_global_vars())
    assert names == ["main", "main__generic", "main__n_16", "main__n_64"]
    assert _static_shapes(mod["main__n_16"]) and _static_shapes(mod["main__n_64"])
    assert not _static_shapes(mod["main__generic"])
    assert table(mod["main"]) == [({"n": 16}, "main__n_16"), ({"n": 64}, "main__n_64")]
    assert [str(p.ty) for p in mod["main"].params] == [str(p.ty) for p in Mlp["main"].params]
    assert mod["main"].attrs["tvmfuse.ranges"] is not None  # the dispatcher keeps the declared ranges
    relax.analysis.well_formed(mod)


def test_every_size_is_right_and_buckets_run_their_static_kernels():
    c = tvmfuse.build(Mlp, "llvm", "tvmfuse", buckets={"n": [16, 64]})
    plain = tvmfuse.build(Mlp, "llvm", "tvmfuse")
    assert c.buckets == [({"n": 16}, "main__n_16"), ({"n": 64}, "main__n_64")]
    assert c.bucket_launches() == {"n=16": plain.launches, "n=64": plain.launches, "generic": plain.launches}
    assert c.launches == plain.launches  # the generic version's
    kernels = {fn: c.call_sites(fn) for fn in ("main__n_16", "main__n_64", "main__generic")}
    assert not set(kernels["main__n_16"]) & set(kernels["main__generic"])  # its own kernels
    for name in kernels["main__n_16"]:
        assert all(isinstance(v, tvm.tirx.IntImm) for p in c.mod[name].params for v in p.shape)
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((32, 64)) * 0.3).astype("float32")
    w2 = (rng.standard_normal((64, 32)) * 0.3).astype("float32")
    for n in (1, 15, 16, 17, 64, 301):
        x = rng.standard_normal((n, 32)).astype("float32")
        np.testing.assert_allclose(c(x, w1, w2), _ref(x, w1, w2), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="outside its declared range"):
        c(np.zeros((600, 32), "float32"), w1, w2)


def test_a_bucket_is_as_fast_a_path_as_the_static_build_its_kernels_match():
    """The bucket's kernels are the static build's, rule for rule (what makes it run at static speed)."""
    c = tvmfuse.build(Mlp, "llvm", "tvmfuse", buckets={"n": [64]})
    static = tvmfuse.build(relax.transform.BindSymbolicVars({"n": 64})(Mlp), "llvm", "tvmfuse")
    rule = lambda m, names: sorted(str(m.mod[n].attrs["tvmfuse.rule"]) for n in names)  # noqa: E731
    assert rule(c, c.call_sites("main__n_64")) == rule(static, static.call_sites())


def test_cuda_compiles_every_version_with_no_host_fallback():
    c = tvmfuse.build(Mlp, "cuda", "tvmfuse", buckets={"n": [16, 64]})
    launches = c.bucket_launches()
    assert set(launches) == {"n=16", "n=64", "generic"} and min(launches.values()) >= 1
    assert c.host_fallbacks() == []


@pytest.mark.parametrize("buckets, message", [
    ({"m": [8]}, "'m' is not a symbolic dim of main's inputs \\(they are: n\\)"),
    ({"n": [0, 8]}, "sizes \\[0\\] are outside its declared range \\[1, 512\\]"),
    ({"n": [1024]}, "outside its declared range \\[1, 512\\]"),
    ({"n": []}, "non-empty list of int sizes"),
    ({"n": ["64"]}, "non-empty list of int sizes"),
    ({"n": list(range(1, 100))}, "at most 64"),
])
def test_bad_buckets_are_clear_errors(buckets, message):
    with pytest.raises(InputError, match=message):
        tvmfuse.build(Mlp, "llvm", "tvmfuse", buckets=buckets)


def test_bert_tiny_buckets_match_torch_at_bucket_and_other_lengths():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.export import Dim

    from tvmfuse.zoo import models

    torch.manual_seed(0)
    m = models._bert_module()
    ids = torch.randint(0, 100, (1, 16))
    mod = tvmfuse.from_torch(m, (ids,), dynamic_shapes={"input_ids": {1: Dim("seq", min=2, max=256)}})
    seq = next(iter(dict(mod["main"].attrs["tvmfuse.ranges"])))  # the importer's name for the dim
    c = tvmfuse.build(mod, "llvm", "tvmfuse", buckets={str(seq): [32, 128]})
    launches = c.bucket_launches()
    assert launches[f"{seq}=32"] <= launches["generic"], launches
    for s in (7, 32, 128):
        x = torch.randint(0, 100, (1, s))
        with torch.no_grad():
            ref = m(x).numpy()
        np.testing.assert_allclose(c(x.numpy()), ref, rtol=1e-4, atol=1e-4)


def test_each_bucket_is_a_tuning_task_of_its_own():
    """Records are kept per bucket: each bucket's static kernels are distinct tasks (their own
    workloads, so their own records), weighted by their calls in that bucket's version."""
    from tvmfuse.target import resolve
    from tvmfuse.tuning import tasks as tasks_mod

    plain = tasks_mod.extract(tasks_mod.fused_module(Mlp, resolve("llvm"), "tvmfuse"))
    bucketed = tasks_mod.extract(tasks_mod.fused_module(Mlp, resolve("llvm"), "tvmfuse", buckets={"n": [16, 64]}))
    assert len(bucketed) == 3 * len(plain)  # the generic kernels, and a static copy per bucket
    static = [t for t in bucketed if all(isinstance(v, tvm.tirx.IntImm) for p in t.mod["main"].params for v in p.shape)]
    assert len(static) == 2 * len(plain) and all(t.weight >= 1 for t in bucketed)


def test_measure_and_profile_read_the_version_the_inputs_run():
    """measure / kernel_profile of a bucketed build report the kernels its inputs dispatch to: a
    bucket's static kernels (bytes as the static build's) or the generic ones."""
    from tvmfuse.runtime.metrics import kernel_profile, measure

    c = tvmfuse.build(Mlp, "llvm", "tvmfuse", buckets={"n": [64]})
    static = tvmfuse.build(relax.transform.BindSymbolicVars({"n": 64})(Mlp), "llvm", "tvmfuse")
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((32, 64)).astype("float32"), rng.standard_normal((64, 32)).astype("float32")
    at = lambda n: [rng.standard_normal((n, 32)).astype("float32"), w1, w2]  # noqa: E731
    assert c.function_for(at(64)) == "main__n_64" and c.function_for(at(9)) == "main__generic"
    m, ms = measure(c, at(64), run=False), measure(static, at(64), run=False)
    assert (m.launches, m.bytes_moved) == (ms.launches, ms.bytes_moved) and m.launches > 0
    names = {r["name"] for r in kernel_profile(c, at(64), runs=1)}
    assert names == set(c.call_sites("main__n_64"))
    assert {r["name"] for r in kernel_profile(c, at(9), runs=1)} == set(c.call_sites("main__generic"))


@I.ir_module
class TwoDims:
    @R.function
    def main(x: R.Tensor(("b", "s", 8), "float32")):
        with R.dataflow():
            y = R.nn.softmax(R.add(x, R.const(1.0, "float32")), axis=-1)
            R.output(y)
        return y


def test_bucketing_one_of_two_symbolic_dims():
    """Bucket s, leave b symbolic: the bucket's version keeps a symbolic b, the dispatcher's casts
    use main's own b (well formed), and every (b, s) is right."""
    mod = add_buckets(TwoDims, {"s": [4]})
    relax.analysis.well_formed(mod)
    c = tvmfuse.build(TwoDims, "llvm", "tvmfuse", buckets={"s": [4]})
    for b, s in ((1, 4), (3, 4), (2, 5)):
        x = np.random.default_rng(b * 10 + s).standard_normal((b, s, 8)).astype("float32")
        e = np.exp(x + 1 - (x + 1).max(-1, keepdims=True))
        np.testing.assert_allclose(c(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        assert c.function_for([x]) == ("main__s_4" if s == 4 else "main__generic")
