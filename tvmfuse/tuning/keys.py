"""Where a target's records live: `<logs>/<kind>-<arch or cpu>/`, e.g. `llvm-znver5`, `cuda-sm_90`.

Records tuned for one CPU or GPU arch are not reused for another: the key separates them.
"""
from __future__ import annotations

import os
import re

import tvm


def target_key(target: tvm.target.Target) -> str:
    kind = target.kind.name
    attrs = target.attrs
    detail = attrs.get("arch") if kind == "cuda" else attrs.get("mcpu")
    key = f"{kind}-{detail}" if detail else kind
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(key))


def target_dir(logs: str, target: tvm.target.Target, create: bool = True) -> str:
    folder = os.path.join(logs, target_key(target))
    if create:
        os.makedirs(folder, exist_ok=True)
    return folder
