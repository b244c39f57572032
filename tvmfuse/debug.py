"""Debug dumps, like TORCH_COMPILE_DEBUG: one folder per build, fixed file names.

`TVMFUSE_DEBUG_DIR=path` (or `build(..., debug_dir=path)`) makes every build write
`path/<NNN>-<name>-<variant>/`:

  00_input.py        the module as given (TVMScript)
  10_classified.txt  every op of the planned graph with its class and why (tvmfuse.classify)
  20_plan.json       tvmfuse's fusion plan: groups, refusals, TE refusals (plan.Plan)
  30_fused.py        after the fuse phase: one call_tir per kernel
  40_scheduled.py    after schedule + prepack: the PrimFuncs as they are compiled
  50_source.ll|.cu   the generated code (LLVM IR, or CUDA C)
  pass_timing.txt    TVM's PassTimingInstrument table: every phase and pass, nested

The dumps are written by a TVM PassInstrument (`DebugDump`) at the boundaries of the pipeline's
phases (pipeline.py names each phase `tvmfuse.<phase>`); nothing else in the build knows of them.
"""
from __future__ import annotations

import itertools
import json
import os
import re

import tvm
from tvm.ir.instrument import PassTimingInstrument, pass_instrument

from .fusion.classify import classify
from .kernel_source import generated_source
from .fusion.plan import Plan


def _script(mod) -> str:
    try:
        return mod.script(show_meta=False)
    except Exception as err:  # noqa: BLE001 - a module TVMScript cannot print must not fail the build
        return f"# TVMScript could not print this module: {type(err).__name__}: {err}\n{mod}"


def _write(folder: str, filename: str, text: str) -> None:
    with open(os.path.join(folder, filename), "w") as f:
        f.write(text)


def new_folder(root: str, name: str, fusion: str) -> str:
    """root/<NNN>-<name>-<fusion>, NNN the next free number (safe from several threads/processes)."""
    os.makedirs(root, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.+-]+", "_", f"{name}-{fusion}")[:80]
    taken = [int(m.group(1)) for m in (re.match(r"(\d+)-", d) for d in os.listdir(root)) if m]
    for n in itertools.count(max(taken, default=0) + 1):
        path = os.path.join(root, f"{n:03d}-{slug}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


@pass_instrument
class DebugDump:
    """Writes the phase-boundary files of one build into `folder`."""

    def __init__(self, folder: str):
        self.folder = folder

    def write(self, filename: str, text: str) -> None:
        _write(self.folder, filename, text)

    def run_before_pass(self, mod, info):
        if info.name == "tvmfuse.normalize":
            self.write("00_input.py", _script(mod))
        elif info.name == "tvmfuse.fuse":  # the graph fusion plans on (after fold_constants, precision)
            try:
                with tvm.transform.PassContext(opt_level=3):  # its passes stay out of the timing table
                    text = str(classify(mod))
            except Exception as err:  # noqa: BLE001
                text = f"classification failed: {type(err).__name__}: {err}"
            self.write("10_classified.txt", text + "\n")

    def run_after_pass(self, mod, info):
        if info.name == "tvmfuse.fuse":
            p = Plan.of(mod)
            self.write("20_plan.json", p.to_json() if p is not None else json.dumps(
                {"plan": None, "why": "this variant is not tvmfuse: TVM's own passes fused (or did not)"}))
            self.write("30_fused.py", _script(mod))
        elif info.name == "tvmfuse.prepack":
            self.write("40_scheduled.py", _script(mod))


class Session:
    """The instruments of one build: the user's, plus the dump and the timing table when a debug
    folder is asked for. `finish(compiled)` writes the source and timing (inside the PassContext)."""

    def __init__(self, root: str | None, name: str, fusion: str, user_instruments=()):
        self.folder = new_folder(root, name, fusion) if root else None
        self.timing = PassTimingInstrument() if self.folder else None
        self.instruments = list(user_instruments)
        if self.folder:
            self.instruments += [DebugDump(self.folder), self.timing]

    def write(self, filename: str, text: str) -> None:
        _write(self.folder, filename, text)

    def finish(self, executable, target) -> None:
        if not self.folder:
            return
        self.write("pass_timing.txt", self.timing.render())
        name = "50_source.cu" if target.kind.name == "cuda" else "50_source.ll"
        self.write(name, generated_source(executable.mod, target))
