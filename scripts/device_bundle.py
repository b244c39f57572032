#!/usr/bin/env python3
"""Make `.devbundle/` (git-ignored): what a GPU machine WITHOUT TVM needs to run tvmfuse's prepared
CUDA cases (scripts/gpu_check.py run). The compiler TVM (libtvm_compiler.so, 253 MB) cannot travel;
TVM's runtime can: with TVM_USE_RUNTIME_LIB=1 `import tvm` loads only lib/libtvm_runtime.so, and
the run phase loads libtvm_runtime_cuda.so itself.

    python3 scripts/device_bundle.py [--tvm-wheel W] [--ffi-wheel W] [--out .devbundle]

Writes
  .devbundle/site/tvm/                 the apache-tvm wheel's Python package, runtime-only: no
                                       libtvm_compiler.so, no 3rdparty/ (CUTLASS), src/, include/, web/
  .devbundle/site/tvm_ffi/ + dist-info  the apache-tvm-ffi wheel unpacked (its cp312 build: the GPU
                                       machine runs Python 3.12), without its C++ sources/headers
  .devbundle/fallback/typing_extensions.py  (tvm_ffi imports it; torch brings it too): appended at
                                       the END of sys.path by the run phase, so the device's own wins
  .devbundle/cudart/libcudart.so.13    a copy of the CUDA runtime libtvm_runtime_cuda.so links, used
                                       on the device only when none is found there
  .devbundle/BUNDLE.json               what went in, with sizes
On the device: PYTHONPATH=.devbundle/site TVM_USE_RUNTIME_LIB=1 python3 scripts/gpu_check.py run ...
The cases themselves are written by `./dev python scripts/gpu_check.py prepare --dir .devbundle/cases`.
Standard library only (zipfile), so any python3 can run it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# path prefixes inside the wheels that the runtime never needs
TVM_SKIP = ("tvm/lib/libtvm_compiler.so", "tvm/3rdparty/", "tvm/src/", "tvm/include/", "tvm/web/",
            "tvm/cmake/", "tvm/topi/testing/", "tvm/relax/frontend/", "tvm/contrib/cutlass/",
            "tvm/contrib/hexagon/", "tvm/backend/trn/")
FFI_SKIP = ("tvm_ffi/3rdparty/", "tvm_ffi/include/", "tvm_ffi/src/", "tvm_ffi/cython/",
            "tvm_ffi/CMakeLists.txt")
CUDART_GLOBS = ("/usr/local/cuda*/lib64/libcudart.so.13", "/usr/local/cuda*/lib/libcudart.so.13",
                "/usr/local/cuda*/targets/x86_64-linux/lib/libcudart.so.13")


def _typing_extensions():
    """typing_extensions.py of this repo's venv, else of this interpreter (a pure-Python module)."""
    hit = _find([os.path.join(ROOT, ".venv/lib/python3*/site-packages/typing_extensions.py")], "te")
    if hit:
        return hit
    try:
        import typing_extensions
    except ImportError:
        return None
    return typing_extensions.__file__


def _find(pattern_list, what):
    for pattern in pattern_list:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def default_wheels():
    """(tvm wheel, ffi wheel): from /tmp/whl or the pip cache of this machine."""
    tvm = _find(["/tmp/whl/apache_tvm-0.27*.whl", os.path.expanduser("~/wheels/apache_tvm-0.27*.whl")], "tvm")
    ffi = _find(["/tmp/whl/apache_tvm_ffi-*-cp312-*.whl", os.path.expanduser("~/wheels/apache_tvm_ffi-*-cp312-*.whl")],
                "ffi")
    return tvm, ffi


def _extract(wheel, dest, keep):
    """Extract the members of `wheel` for which keep(name) into dest; returns (files, bytes)."""
    n = size = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            if name.endswith("/") or "__pycache__" in name or not keep(name):
                continue
            target = os.path.join(dest, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode)
            n += 1
            size += info.file_size
    return n, size


def tree_bytes(path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def make(out, tvm_wheel, ffi_wheel, cudart=None) -> dict:
    site = os.path.join(out, "site")
    for sub in ("site", "cudart", "fallback"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    os.makedirs(site)
    tvm_n, _ = _extract(tvm_wheel, site, lambda n: n.startswith("tvm/") and not n.startswith(TVM_SKIP))
    ffi_n, _ = _extract(ffi_wheel, site, lambda n: not n.startswith(FFI_SKIP) and ".data/" not in n)
    info = {"tvm_wheel": os.path.basename(tvm_wheel), "ffi_wheel": os.path.basename(ffi_wheel),
            "tvm_files": tvm_n, "ffi_files": ffi_n, "skipped": list(TVM_SKIP + FFI_SKIP)}
    te = _typing_extensions()
    if te:
        os.makedirs(os.path.join(out, "fallback"))
        shutil.copy2(te, os.path.join(out, "fallback", "typing_extensions.py"))
        info["typing_extensions"] = te
    cudart = cudart or _find(CUDART_GLOBS, "cudart")
    if cudart:
        os.makedirs(os.path.join(out, "cudart"))
        shutil.copy2(os.path.realpath(cudart), os.path.join(out, "cudart", "libcudart.so.13"))
        info["cudart"] = cudart
    info["bytes"] = {"site/tvm": tree_bytes(os.path.join(site, "tvm")),
                     "site/tvm_ffi": tree_bytes(os.path.join(site, "tvm_ffi")),
                     "cudart": tree_bytes(os.path.join(out, "cudart"))}
    with open(os.path.join(out, "BUNDLE.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def ensure_ignored(root=ROOT, entry="/.devbundle/") -> str:
    """Add `entry` to .git/info/exclude (created if missing) unless .gitignore already has it."""
    gi = os.path.join(root, ".gitignore")
    if os.path.exists(gi) and entry in open(gi).read().split():
        return gi
    path = os.path.join(root, ".git", "info", "exclude")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = open(path).read() if os.path.exists(path) else ""
    if entry not in text.split():
        with open(path, "a") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + entry + "\n")
    return path


def main(argv=None) -> int:
    tvm_w, ffi_w = default_wheels()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tvm-wheel", default=tvm_w, help="apache-tvm 0.27 wheel (py3-none)")
    ap.add_argument("--ffi-wheel", default=ffi_w, help="apache-tvm-ffi wheel for the device's Python (cp312)")
    ap.add_argument("--cudart", default=None, help="libcudart.so.13 to copy (default: found under /usr/local/cuda*)")
    ap.add_argument("--out", default=os.path.join(ROOT, ".devbundle"))
    args = ap.parse_args(argv)
    if not args.tvm_wheel or not args.ffi_wheel:
        print("error: give --tvm-wheel and --ffi-wheel (e.g. pip download apache-tvm==0.27.0.post1 "
              "apache-tvm-ffi==0.1.14.post1 --no-deps --python-version 3.12 --only-binary=:all: -d /tmp/whl)",
              file=sys.stderr)
        return 2
    ignored_by = ensure_ignored()
    info = make(args.out, args.tvm_wheel, args.ffi_wheel, args.cudart)
    total = tree_bytes(args.out)
    print(json.dumps(info["bytes"]), f"\n{args.out}: {total / 2**20:.1f} MiB in all (ignored via {ignored_by})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
