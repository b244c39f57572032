"""The build half of the two-phase GPU check (`scripts/gpu_check.py prepare`).

A GPU machine lent for a few minutes has no compiler TVM (the wheel's libtvm_compiler.so is 253 MB)
but can run TVM's runtime. So the cases are built here, each exported as a shared library, and
`scripts/gpu_device.py` (the run half, runtime-only, no tvmfuse import) loads and checks them there.

`prepare(out_dir, ...)` writes into out_dir:
  <case>.so           the executable (tvm.compile + export_library), one per workload x system
  <workload>.ref.npz  the numpy reference outputs, where they are small (else the run phase computes
                      them in float64 with the workload's torch form on the GPU)
  manifest.json       how each case was built and how to feed and check it: input specs, seed and
                      sha256 of the inputs (the run phase regenerates them with numpy), tolerances,
                      FLOPs/bytes, the static launches and the __global__ kernels per PrimFunc
Inputs are never stored: Workload.inputs() is numpy's default_rng(seed).standard_normal per input,
which the run phase repeats and checks against the sha256.

For target "cuda" this machine must produce CUDA binaries, not CUDA source: TVM's codegen calls
nvcc only when its CUDA runtime (libtvm_runtime_cuda.so) loads, which needs libcuda.so.1; where the
driver is missing, scripts/gpu_check.py preloads a stub of the few driver symbols before importing
TVM (its preload_cuda_stub()). `check_binary()` asserts each exported CUDA library holds a fatbin.
"""
from __future__ import annotations

import datetime
import contextlib
import json
import os
import platform
import subprocess
import time

import numpy as np

from .gpu_portable import inputs_digest
from ..zoo.workload import Workload

FATBIN_MAGIC = (0xBA55ED50).to_bytes(4, "little")
MANIFEST = "manifest.json"
ATTENTION_SYSTEMS = (("tvmfuse", "tvmfuse", {}), ("tvmfuse-unfused", "tvmfuse", {"attention": False}),
                     ("tvm", "tvm", {}))
# attention systems built with a CUDA-table entry changed (the kernel variant they time)
TABLE_VARIANTS = {"tvmfuse-rowthread": {"attn_key_split": 1}}

@contextlib.contextmanager
def _cuda_table(changes):
    """Within: schedules.targets.CUDA with `changes` applied (a kernel variant to time)."""
    from schedules.targets import CUDA

    saved = {k: CUDA[k] for k in changes}
    CUDA.update(changes)
    try:
        yield
    finally:
        CUDA.update(saved)


def check_binary(path: str) -> bool:
    """True when an exported library holds a CUDA fatbin (not only CUDA source, which the device's
    loader cannot run)."""
    with open(path, "rb") as f:
        return FATBIN_MAGIC in f.read()


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _git(root, *args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def build_case(w, system, fusion, knobs, target, out_dir, case_id, group, ref_file, extra=None) -> dict:
    """Build workload w under (fusion, knobs) for target, export <case_id>.so, and describe it."""
    from ..runtime import roofline
    from ..build import build, cuda_kernels
    from ..runtime.metrics import kernel_names
    from ..target import is_gpu

    t0 = time.perf_counter()
    c = build(w.mod, target, fusion, **knobs)
    build_s = time.perf_counter() - t0
    path = os.path.join(out_dir, case_id + ".so")
    c.executable.export_library(path)
    gpu = is_gpu(c.target)
    if gpu and not check_binary(path):
        raise RuntimeError(f"{path}: the CUDA module holds source, not a fatbin (TVM's CUDA runtime did not "
                           "load at build time, so codegen skipped nvcc); see gpu_check.py prepare")
    per = c.kernels_per_func() if gpu else None
    ret = w.mod["main"].ret_ty
    outs = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t in (ret.fields if hasattr(ret, "fields") else [ret])]
    case = {"id": case_id, "group": group, "workload": w.name, "size": w.size, "system": system, "fusion": fusion,
            "knobs": knobs, "file": os.path.basename(path), "file_bytes": os.path.getsize(path),
            "inputs": [[n, list(s), d] for n, s, d in w.input_specs], "positive": list(w.positive),
            "seed": w.seed, "outputs": [[list(s), d] for s, d in outs],
            "rtol": max(w.rtol, 1e-3) if gpu else w.rtol, "atol": max(w.atol, 1e-4) if gpu else w.atol,
            "flops": w.flops, "min_bytes": roofline.minimal_bytes(w), "meta": dict(w.meta),
            "launches": c.launches, "kernel_funcs": sorted(kernel_names(c)), "kernels_per_func": per,
            "kernels": cuda_kernels(c.source()) if gpu else [],
            "host_fallbacks": c.host_fallbacks() if gpu else [], "build_s": round(build_s, 2), "ref": ref_file}
    case.update(extra or {})
    return case


def _short_error(err) -> str:
    """One line for a failed build: ptxas/nvcc error lines when there are any (TVM's message holds
    the whole CUDA source before them), else the last line of the message."""
    text = str(err)
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower() and ("ptxas" in ln or ".cu(" in ln)]
    if not lines:
        lines = [ln.strip() for ln in text.strip().splitlines()[-1:]]
    return f"{type(err).__name__}: " + " | ".join(lines)[:500]


def _try_build(cases, failed, log, *a, **kw):
    """build_case, or on failure an entry in `failed` (the other cases still get built)."""
    case_id = a[6]
    try:
        cases.append(build_case(*a, **kw))
        c = cases[-1]
        log(f"{c['id']}: {c['launches']} launches, {c['file_bytes'] / 1024:.0f} KiB, {c['build_s']}s")
    except Exception as err:  # noqa: BLE001  a build that fails here is a finding, not the end of prepare
        failed.append({"id": case_id, "group": a[7], "system": a[1], "error": _short_error(err)})
        log(f"{case_id}: BUILD FAILED: {failed[-1]['error']}")


def _write_ref(w, out_dir, max_ref_bytes) -> tuple[str | None, str]:
    """(npz file name or None, sha256 of the inputs): the numpy reference outputs, when small."""
    x = w.inputs()
    digest = inputs_digest(x)
    ret = w.mod["main"].ret_ty
    nbytes = sum(int(np.prod([int(d) for d in t.shape])) * 4 for t in (ret.fields if hasattr(ret, "fields") else [ret]))
    if nbytes > max_ref_bytes:
        return None, digest
    ref = _as_tuple(w.reference(*x))
    name = f"{w.name}-{w.size}.ref.npz"
    np.savez_compressed(os.path.join(out_dir, name), **{f"out{i}": np.asarray(r) for i, r in enumerate(ref)})
    return name, digest


MODEL_WEIGHT_SCALE = 0.02  # BERT's initializer_range: the generated weights are N(0, 0.02)
MODEL_MIN_GENERATED = 4096  # weights with fewer elements (biases, LayerNorm) are stored as they are


def generated_weight(seed: int, shape, scale: float = MODEL_WEIGHT_SCALE) -> np.ndarray:
    """A model weight both phases make alike: numpy default_rng(seed) float32 normals x scale."""
    return np.random.default_rng(seed).standard_normal(tuple(shape), dtype=np.float32) * np.float32(scale)


# transformers BertConfig keyword arguments of the models with a two-phase form (bert-tiny: the one
# of tvmfuse.zoo.models, for the CPU self-test)
BERT_CONFIGS = {
    "bert-base": {"attn_implementation": "eager"},
    "bert-tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                  "vocab_size": 100, "max_position_embeddings": 256, "attn_implementation": "eager"},
}


def bert_case(out_dir, target, systems, model="bert-base", size="bench", log=print):
    """A BERT (transformers BertModel(BertConfig(**BERT_CONFIGS[model])), eager attention, batch 1,
    seq 128 at bench size) with its weights as parameters of main (from_torch(params="inputs")), so
    each library stays small (BERT-base: ~3 MB instead of ~440 MB). The run phase cannot get the
    weights from transformers, so the big ones are replaced by generated_weight(1000 + i) (a rule
    both phases know); the small ones and the input ids travel in <model>-<size>.inputs.npz. The
    reference is torch eager (here, CPU, float32) with those weights. Returns (cases, failed)."""
    import torch
    from transformers import BertConfig

    from ..zoo import models
    from ..frontends.from_torch import from_torch
    from ..runtime.roofline import graph_flops

    kwargs = BERT_CONFIGS[model]
    cfg = BertConfig(**kwargs)
    module = models._bert_module(cfg).eval()
    ids = models._ids(size, cfg.vocab_size)
    mod, params = from_torch(module, (torch.from_numpy(ids),), params="inputs")
    main_params = [p.name for p in mod["main"].params]
    n_in = len(main_params) - len(params)
    # torch.export names a weight "p_" + its module path with dots as underscores, lower-cased
    owners = {("p_" + n.replace(".", "_")).lower(): n for n, _ in module.named_parameters()}
    owners.update({("b_" + n.replace(".", "_")).lower(): n for n, _ in module.named_buffers()})
    stored, gen, arrays, names = {"in0": ids}, [{"rule": "stored", "key": "in0"}], [ids], []
    for i, (pname, w) in enumerate(zip(main_params[n_in:], params)):
        if pname.lower() not in owners:
            raise RuntimeError(f"{model}: parameter {pname} of main matches no weight of the torch module")
        names.append(owners[pname.lower()])
        if w.dtype == np.float32 and w.size >= MODEL_MIN_GENERATED:
            a = generated_weight(1000 + i, w.shape)
            gen.append({"rule": "normal", "seed": 1000 + i, "scale": MODEL_WEIGHT_SCALE})
        else:
            a = np.asarray(w)
            stored[f"w{i}"] = a
            gen.append({"rule": "stored", "key": f"w{i}"})
        arrays.append(a)
    with torch.no_grad():
        for n, a in zip(names, arrays[1:]):
            t = module.get_parameter(n) if n in dict(module.named_parameters()) else module.get_buffer(n)
            t.copy_(torch.from_numpy(a))
        ref = module(torch.from_numpy(ids)).numpy()
    name = f"{model}-{size}"
    np.savez_compressed(os.path.join(out_dir, name + ".inputs.npz"), **stored)
    np.savez_compressed(os.path.join(out_dir, name + ".ref.npz"), out0=ref)
    specs = [(p.name, tuple(int(d) for d in p.ty.shape), str(p.ty.dtype)) for p in mod["main"].params]
    w = Workload(model, mod, specs, size=size, rtol=1e-3, atol=1e-3, flops=graph_flops(mod))
    extra = {"input_gen": gen, "inputs_file": name + ".inputs.npz", "input_sha256": inputs_digest(arrays),
             "module_names": names, "model": {"name": model, "bert_config": kwargs, "seq": int(ids.shape[1])}}
    cases, failed = [], []
    for s in systems:
        _try_build(cases, failed, log, w, s, s, {}, target, out_dir, f"{model}.{s}", model, name + ".ref.npz",
                   extra)
    return cases, failed


def prepare(out_dir, target="cuda", arch="sm_90", size="bench", names=None, systems=("tvm", "tvmfuse"),
            attention_seqs=(128, 512, 2048), causal_seqs=(128, 512, 2048), heads=12, head_dim=64,
            max_ref_bytes=2 << 20, command="", log=print, models=()) -> dict:
    """Build every case into out_dir and write manifest.json; returns the manifest."""
    import tvm

    from ..zoo import workloads
    from ..target import is_gpu, resolve

    t = resolve(target, arch=arch)
    if is_gpu(t):
        from .gpu import use_nvcc_without_nvrtc

        use_nvcc_without_nvrtc()
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):  # a fresh set: stale cases must not travel
        if f.endswith((".so", ".npz")) or f == MANIFEST:
            os.remove(os.path.join(out_dir, f))
    cases, failed, t0 = [], [], time.perf_counter()
    for name in workloads.names() if names is None else names:
        w = workloads.get(name, size)
        ref, digest = _write_ref(w, out_dir, max_ref_bytes)
        for s in systems:
            _try_build(cases, failed, log, w, s, s, {}, t, out_dir, f"{name}.{s}", name, ref,
                       {"input_sha256": digest, "torch_form": name})
    for mask, seqs in ((None, attention_seqs), ("causal", causal_seqs)):
        for s in seqs:
            w = workloads.attention_workload(1, s, heads, head_dim, mask=mask)
            group = f"{w.name}-s{s}"
            ref, digest = _write_ref(w, out_dir, max_ref_bytes) if s <= 128 else (None, inputs_digest(w.inputs()))
            variants = [(n, "tvmfuse", {}) for n in TABLE_VARIANTS] if t.kind.name == "cuda" else []
            for sysname, fusion, knobs in [*ATTENTION_SYSTEMS, *variants]:
                extra = {"input_sha256": digest, "attention": {"batch": 1, "seq": s, "heads": heads,
                                                               "head_dim": head_dim, "mask": mask}}
                with _cuda_table(TABLE_VARIANTS.get(sysname, {})):
                    _try_build(cases, failed, log, w, sysname, fusion, knobs, t, out_dir, f"{group}.{sysname}",
                               group, ref, extra)
    for model in models:
        if model not in BERT_CONFIGS:
            raise ValueError(f"model {model!r}: the models with a two-phase form are {', '.join(BERT_CONFIGS)}")
        try:
            more, bad = bert_case(out_dir, t, systems, model, size, log=log)
        except Exception as err:  # noqa: BLE001  transformers missing, an import that fails: reported
            more, bad = [], [{"id": model, "group": model, "system": "all", "error": _short_error(err)}]
            log(f"{model}: NOT PREPARED: {bad[0]['error']}")
        cases += more
        failed += bad
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    manifest = {"prepared": {"date": datetime.datetime.now().isoformat(timespec="seconds"), "target": str(t),
                             "target_kind": t.kind.name, "arch": arch if is_gpu(t) else None, "size": size,
                             "tvm": tvm.__version__, "git": _git(root, "rev-parse", "HEAD"),
                             # tracked files that differed from that commit when the cases were built
                             "git_modified": _git(root, "diff", "--name-only", "HEAD").split(),
                             "host": platform.node(), "command": command,
                             "build_s": round(time.perf_counter() - t0, 1)},
                "cases": cases, "failed": failed}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
