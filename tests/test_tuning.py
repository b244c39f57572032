"""tvmfuse.tune and tuning_logs/: records, resume, reuse, apply at build (trace checked), never slower,
corrupt/truncated files, merge, curves, CUDA without a GPU. Tiny shapes (16x32), 4 trials, llvm.
SIGKILL and concurrent writers: tests/test_tuning_durability.py. RPC: tests/test_rpc_tuning.py."""
import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import op as R
from tvm.script import tirx as T

import schedules
import tvmfuse
from tvmfuse.errors import DeviceUnavailableError
from tvmfuse.target import resolve
from tvmfuse.tuning import curves, decisions, merge, target_key, tune
from tvmfuse.tuning.database import DurableDatabase, mean_secs
from tvmfuse.tuning.keys import target_dir
from tvmfuse.tuning.tasks import extract, fused_module
from tvmfuse.tuning.autotune import MARGIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIALS = 4
FAST = dict(num_trials_per_iter=4, population_size=32, progress=False)


def tiny_model(names=("x", "y"), m=16, n=32):
    """add -> relu -> softmax -> multiply on (16, 32): one tvmfuse kernel, one tuning task."""
    bb = relax.BlockBuilder()
    x, y = (relax.Var(nm, relax.TensorType((m, n), "float32")) for nm in names)
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(R.nn.relu(bb.emit(R.add(x, y))))
            out = bb.emit_output(R.multiply(bb.emit(R.nn.softmax(a, axis=-1)), y))
        bb.emit_func_output(out)
    return bb.get()


def tiny_inputs(m=16, n=32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal((m, n)).astype("float32") for _ in range(2)]


def tiny_reference(x, y):
    a = np.maximum(x + y, 0)
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) * y


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    logs = str(tmp_path_factory.mktemp("logs"))
    result = tune(tiny_model(), "llvm", "tvmfuse", trials=TRIALS, logs=logs, **FAST)
    return logs, result


def _folder(logs):
    return target_dir(logs, resolve("llvm"), create=False)


def _copy(logs, tmp_path):
    dst = str(tmp_path / "logs")
    shutil.copytree(logs, dst, ignore=shutil.ignore_patterns("logs", ".lock"))
    return dst


def test_target_key_names_kind_and_arch():
    assert target_key(resolve("llvm")).startswith("llvm-")
    assert target_key(resolve("cuda")) == "cuda-sm_90"


def test_tuning_writes_records_per_target_folder(tuned):
    logs, result = tuned
    folder = _folder(logs)
    assert os.path.basename(folder) == target_key(resolve("llvm"))
    for f in ("database_workload.json", "database_tuning_record.json", "tasks.json"):
        assert os.path.getsize(os.path.join(folder, f)) > 0
    (task,) = result.tasks
    assert task.trials_run == TRIALS and task.trials_total == TRIALS
    assert task.default_ms and task.default_ms > 0 and task.tuned_ms and task.tuned_ms > 0
    assert task.use_tuned == (task.tuned_ms < task.default_ms * (1 - MARGIN))  # never slower, beyond noise
    db = DurableDatabase(folder)
    assert len(db.workloads()) == 1 and len(db) == TRIALS
    # the stock MetaSchedule JSONDatabase reads our folder too (same format)
    from tvm.s_tir import meta_schedule as ms

    assert len(ms.database.JSONDatabase(work_dir=folder, allow_missing=False)) == TRIALS
    line = json.loads(open(os.path.join(folder, "tasks.json")).readline())
    assert line["task"] == "fused_add_relu_softmax_multiply" and line["trials"] == TRIALS


def test_rerun_resumes_without_duplicate_work(tuned, tmp_path):
    logs = _copy(tuned[0], tmp_path)
    before = open(os.path.join(_folder(logs), "database_tuning_record.json")).read()
    again = tune(tiny_model(), "llvm", "tvmfuse", trials=TRIALS, logs=logs, **FAST)
    (task,) = again.tasks
    assert task.skipped == "finished" and task.trials_run == 0
    assert open(os.path.join(_folder(logs), "database_tuning_record.json")).read() == before


def test_same_workload_in_another_model_reuses_the_record(tuned, tmp_path):
    logs = _copy(tuned[0], tmp_path)
    other = tiny_model(names=("lhs", "rhs"))  # another model, other names, same kernel
    (a,), (b,) = extract(fused_module(tiny_model(), resolve("llvm"), "tvmfuse")), \
        extract(fused_module(other, resolve("llvm"), "tvmfuse"))
    assert tvm_ffi.structural_equal(a.mod, b.mod)
    res = tune(other, "llvm", "tvmfuse", trials=TRIALS, logs=logs, **FAST)
    assert [t.skipped for t in res.tasks] == ["finished"] and res.tasks[0].trials_run == 0


def _force(logs, use_tuned):
    folder = _folder(logs)
    (d,) = decisions.load(folder).values()
    d.use_tuned, d.time = use_tuned, ""
    decisions.save(folder, d)
    return folder


def _kernel(compiled):
    (name,) = compiled.call_sites()
    return compiled.mod[name]


def test_build_applies_the_tuned_trace(tuned, tmp_path):
    folder = _force(_copy(tuned[0], tmp_path), use_tuned=True)
    logs = os.path.dirname(folder)
    c = tvmfuse.build(tiny_model(), "llvm", "tvmfuse", tuning_logs=logs)
    f = _kernel(c)
    assert f.attrs["tirx.is_scheduled"] and "tvmfuse.tuned" in f.attrs
    # the PrimFunc is the best record's trace replayed on the workload, not the default schedule
    db = DurableDatabase(folder)
    (wl,) = db.workloads()
    best = db.get_top_k(wl, 1)[0]
    assert mean_secs(best) == min(mean_secs(r) for r in db.get_all_tuning_records())
    sch = tvm.s_tir.Schedule(wl.mod)
    best.trace.apply_to_schedule(sch, remove_postproc=False)
    replayed = schedules.lower_math(sch.mod, c.target)["main"]  # the math lowering every kernel gets
    assert tvm_ffi.structural_equal(f.body, replayed.body, map_free_vars=True)
    default = _kernel(tvmfuse.build(tiny_model(), "llvm", "tvmfuse"))
    assert not tvm_ffi.structural_equal(f.body, default.body, map_free_vars=True)
    np.testing.assert_allclose(c(*tiny_inputs()), tiny_reference(*tiny_inputs()), rtol=1e-5, atol=1e-6)


def test_record_that_loses_to_the_default_is_not_applied(tuned, tmp_path):
    logs = os.path.dirname(_force(_copy(tuned[0], tmp_path), use_tuned=False))
    f = _kernel(tvmfuse.build(tiny_model(), "llvm", "tvmfuse", tuning_logs=logs))
    default = _kernel(tvmfuse.build(tiny_model(), "llvm", "tvmfuse"))
    assert "tvmfuse.tuned" not in f.attrs
    assert tvm_ffi.structural_equal(f.body, default.body, map_free_vars=True)


def test_corrupt_line_and_truncated_file_still_load(tuned, tmp_path, caplog):
    folder = _folder(_copy(tuned[0], tmp_path))
    rec_path = os.path.join(folder, "database_tuning_record.json")
    lines = open(rec_path).read().splitlines()
    lines.insert(1, '[0, ["not a trace"')  # corrupt line 2
    text = "\n".join(lines) + "\n"
    open(rec_path, "w").write(text[: len(text) - len(lines[-1]) // 2 - 1])  # last line cut in half
    with caplog.at_level(logging.WARNING, logger="tvmfuse.tuning"):
        db = DurableDatabase(folder)
    assert len(db) == TRIALS - 1  # the corrupt and the truncated lines are skipped, the rest loads
    msgs = [r.getMessage() for r in caplog.records]
    assert any(f"{rec_path}:2:" in m for m in msgs), msgs
    assert any(f"{rec_path}:{TRIALS + 1}:" in m for m in msgs), msgs
    # the next append ends the torn line first; a fresh load then sees every good record
    rec = db.get_all_tuning_records()[0]
    db.commit_tuning_record(rec)
    assert len(DurableDatabase(folder)) == TRIALS
    # a truncated workload file (torn last line) loads too
    wl_path = os.path.join(folder, "database_workload.json")
    open(wl_path, "a").write('["123", "abc')
    assert len(DurableDatabase(folder).workloads()) == 1


def test_merge_keeps_the_best_record_per_workload(tuned, tmp_path):
    a = _folder(tuned[0])
    b = str(tmp_path / "b" / os.path.basename(a))
    db_a, db_b = DurableDatabase(a), DurableDatabase(b)
    (wl,) = db_a.workloads()
    best_a = db_a.get_top_k(wl, 1)[0]
    from tvm.s_tir import meta_schedule as ms

    worse = ms.database.TuningRecord(best_a.trace, db_b.commit_workload(wl.mod), [1.0], best_a.target,
                                     best_a.args_info)
    better = ms.database.TuningRecord(best_a.trace, db_b.commit_workload(wl.mod), [1e-9], best_a.target,
                                      best_a.args_info)
    db_b.commit_tuning_record(worse)
    db_b.commit_tuning_record(better)
    out = str(tmp_path / "merged")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tune.py"), "merge", os.path.dirname(a),
                        str(tmp_path / "b"), "-o", out], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    merged = DurableDatabase(os.path.join(out, os.path.basename(a)))
    assert len(merged) == 1 and mean_secs(merged.get_all_tuning_records()[0]) == pytest.approx(1e-9)
    # merging again changes nothing; the API gives the same answer
    assert list(merge([os.path.dirname(a)], out).values()) == [0]


def test_curves_are_running_bests(tuned):
    cv = curves(tuned[0], "llvm")
    (pts,) = cv.values()
    assert list(cv) == ["fused_add_relu_softmax_multiply"]
    assert [i for i, _ in pts] == sorted(i for i, _ in pts) and pts[-1][0] <= TRIALS
    assert all(b <= a for (_, a), (_, b) in zip(pts, pts[1:]))


def test_time_budget_spent_skips_the_rest(tmp_path):
    res = tune(tiny_model(), "llvm", "tvmfuse", trials=TRIALS, time_budget=1e-3, logs=str(tmp_path), **FAST)
    assert [t.skipped for t in res.tasks] == ["time budget"] and res.tasks[0].trials_run == 0


def test_cuda_without_gpu_fails_fast_and_names_rpc(tmp_path):
    if tvm.cuda(0).exist:
        pytest.skip("a GPU is present: CUDA tuning would run locally")
    with pytest.raises(DeviceUnavailableError, match="--rpc-tracker"):
        tune(tiny_model(), "cuda", trials=2, logs=str(tmp_path))


@pytest.mark.parametrize("fusion", ["tvm", "tvmfuse"])
def test_every_zoo_task_has_a_design_space_and_a_default(fusion):
    """MetaSchedule can tune every kernel of the zoo (its design space generates: the conv group with
    its batch-norm epilogue used to fail in reverse_compute_at; and a matmul or conv keeps its
    multi-level tiling, which a StmtSimplify'd form lost), and the never-slower rule has a
    default schedule to measure each task against (the default rules schedule its source form)."""
    from tvm.s_tir import meta_schedule as ms

    from tvmfuse.zoo import workloads
    from tvmfuse.tuning.measure import default_scheduled

    target = resolve("llvm")
    for name in workloads.names():
        for t in extract(fused_module(workloads.get(name, "small").mod, target, fusion)):
            ctx = ms.TuneContext(mod=t.mod, target=target, space_generator="post-order-apply",
                                 search_strategy="evolutionary", num_threads=1)
            spaces = ctx.generate_design_space()
            assert len(spaces) >= 1, (name, t.name)
            if "conv2d" in t.name or "matmul" in t.name:  # the multi-level tiling is in the space
                assert any("sample_perfect_tile" in str(s.trace) for s in spaces), (name, t.name)
            assert default_scheduled(t.source, target) is not None, (name, t.name)


def test_tuning_form_leaves_blockless_tir_alone():
    """Hand-written TIR with no blocks (the cumsum scan a GPT-2 import carries) has nothing to
    inline: tuning_form returns it as it is instead of failing the build that applies the logs."""
    from tvmfuse.tuning.tasks import tuning_form

    @T.prim_func
    def scan(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
        b[0] = a[0]
        for i in range(7):
            b[i + 1] = b[i] + a[i + 1]

    assert tvm_ffi.structural_equal(tuning_form(scan), scan)
