"""`tvmfuse.build`: compile a Relax module under a fusion variant for llvm or cuda.

Returns a `Compiled`: callable on numpy arrays, with `.launches` (static kernel launches per
inference; for CUDA counted from the generated source), `.source()` and `.mod` (the scheduled Relax
module before lowering, what the measuring runtime reads).
"""
from __future__ import annotations

import re
import threading
from functools import cached_property

import numpy as np
import tvm
from tvm import relax

from . import config, debug, pipeline
from .errors import DeviceUnavailableError, InputError
from .install import install_once
from .kernel_source import cuda_kernels, cuda_source, llvm_source
from .passes.streaming_stores import register_pipeline
from .relax_utils import call_tir_sites, static_shape


def prepare(mod: tvm.IRModule, target, fusion: str = "tvm", tuning_logs: str | None = None,
            dtype: str | None = None, **knobs) -> tvm.IRModule:
    """The pipeline's phases up to codegen (pipeline.py): the scheduled Relax module a build
    compiles, with tuned schedules from `tuning_logs` where a record beat the default."""
    check_module(mod)
    install_once()
    opts = pipeline.Options.for_target(target, fusion, tuning_logs, dtype, **knobs)
    with opts.target, tvm.transform.PassContext(opt_level=3):
        return pipeline.run(mod, opts).mod


def check_module(mod) -> None:
    """InputError unless `mod` is an IRModule with a Relax function "main" (what build compiles)."""
    if not isinstance(mod, tvm.IRModule):
        hint = " (wrap it: tvm.IRModule({'main': func}))" if isinstance(mod, relax.Function) else ""
        raise InputError(f"expected a tvm.IRModule with a Relax function 'main', got {type(mod).__name__}{hint}; "
                         "import a model with tvmfuse.load(...) or write one with relax.BlockBuilder")
    names = sorted(gv.name_hint for gv in mod.get_global_vars())
    if "main" not in names or not isinstance(mod["main"], relax.Function):
        raise InputError(f"the module has no function 'main' (a Relax function) to build; it defines {names}")


def build(mod: tvm.IRModule, target="llvm", fusion: str = "tvm", tuning_logs: str | None = None, *,
          name: str = "model", debug_dir: str | None = None, instruments=(), buckets: dict | None = None,
          dtype: str | None = None, **knobs) -> "Compiled":
    """Compile `mod` under a fusion variant: every phase of pipeline.py, then tvm.compile.

    knobs: fusion knobs (tvmfuse/config.py; unknown ones raise UnknownKnobError). debug_dir (or
    TVMFUSE_DEBUG_DIR): write this build's debug folder (tvmfuse/debug.py), `name` names it.
    instruments: TVM PassInstruments to run over every phase and pass of this build.
    buckets: {symbolic dim: [sizes]} of a symbolic model, e.g. {"seq": [32, 64, 128]}: each size gets
    static, specialized (and tunable) kernels, a generic symbolic version covers every other size,
    and main dispatches at run time (passes/shape_buckets.py).
    dtype: "float16" or "bfloat16" computes a float32 model in that type (passes/cast_to_half.py):
    weights cast once at build time, matmul/conv accumulating in float32, softmax, norms and sums
    in float32, every cast fused into a neighbouring kernel; main still takes and returns float32.
    On a CPU without native half arithmetic the result is correct, not faster. None: as imported."""
    check_module(mod)
    install_once()  # thread pool, spin and the "tvmfuse" TIR pipeline, before any kernel runs
    if buckets:
        from .passes.shape_buckets import add_buckets

        mod = add_buckets(mod, buckets)
    opts = pipeline.Options.for_target(target, fusion, tuning_logs, dtype, **knobs)
    session = debug.Session(config.debug_dir(debug_dir), name, opts.fusion, instruments)
    with opts.target, tvm.transform.PassContext(opt_level=3, instruments=session.instruments):
        stages = pipeline.run(mod, opts)
        ex = tvm.compile(stages.mod, target=opts.target, relax_pipeline=pipeline.phase("codegen", opts),
                         tir_pipeline=register_pipeline())
        session.finish(ex, opts.target)
    return Compiled(stages.mod, ex, opts.target, opts.fusion, plan=stages.plan, planned=stages.planned,
                    debug_folder=session.folder)


class Compiled:
    """A built module. `plan` is tvmfuse's fusion plan of this build (None for other variants),
    `planned` the graph it planned on; `debug_folder` where its dumps went (None: off)."""

    def __init__(self, mod, executable, target, fusion, plan=None, planned=None, debug_folder=None):
        self.mod, self.executable, self.target, self.fusion = mod, executable, target, fusion
        self.plan, self.planned, self.debug_folder = plan, planned, debug_folder
        self._local = threading.local()
        main = mod["main"]
        self.params = [(p.name, static_shape(p.ty), p.ty.dtype) for p in main.params]
        self._dims = [_dims(p.ty) for p in main.params]  # ints and symbolic names, checked before TVM
        # {symbolic dim: (min, max)} the importer declared (torch.export Dims; frontends/common.py)
        declared = main.attrs.get(RANGES_ATTR) if main.attrs is not None else None
        self.ranges = {str(k): (int(v[0]), int(v[1])) for k, v in dict(declared or {}).items()}
        from .passes.shape_buckets import table

        # [({dim: size}, function)] of a bucketed build (build(buckets=...)); main dispatches among them
        self.buckets = table(main)
        self.kernel_function = "main__generic" if self.buckets else "main"  # what launches and profiles read

    # ------------------------------------------------------------------ inspection
    def call_sites(self, function: str | None = None) -> list[str]:
        """Kernels called by `function` (default: main, or the generic version of a bucketed build):
        the call sites the VM runs, not the reshapes lowering turns into views of their input."""
        return [gv.name_hint for _, gv, _, _ in call_tir_sites(self.launched[function or self.kernel_function])]

    @cached_property
    def launched(self) -> tvm.IRModule:
        """The module as lowering will call its kernels: TVM's RewriteDataflowReshape (the first of
        its dataflow lowering passes) makes a kernel that only reshapes a view, which launches nothing."""
        return relax.transform.RewriteDataflowReshape()(self.mod)

    def rules(self, function: str | None = None) -> list[str]:
        """The schedule rule (`tvmfuse.rule`) of the kernel of each call site of `function`, in
        call order ("-" for a kernel no rule marked): a kernel that several groups share (a
        transformer's layers) counts once per call."""
        attrs = {gv.name_hint: getattr(f, "attrs", None) for gv, f in self.mod.functions_items()}
        return [str(a["tvmfuse.rule"]) if a is not None and "tvmfuse.rule" in a else "-"
                for a in (attrs.get(name) for name in self.call_sites(function))]

    def function_for(self, arrays) -> str:
        """The Relax function these inputs run: main, or in a bucketed build the version main
        dispatches them to (the bucket whose sizes they have, else main__generic)."""
        if not self.buckets:
            return "main"
        sizes = {}
        for dims, a in zip(self._dims, arrays):
            for d, n in zip(dims or (), np.shape(a)):
                if isinstance(d, str):
                    sizes.setdefault(d, int(n))
        return next((fn for combo, fn in self.buckets if all(sizes.get(d) == s for d, s in combo.items())),
                    "main__generic")

    def bucket_launches(self) -> dict[str, int]:
        """Launches per version of a bucketed build: {"seq=32": n, ..., "generic": n}; {} otherwise."""
        if not self.buckets:
            return {}
        out = {",".join(f"{d}={s}" for d, s in combo.items()): self.launches_of(fn) for combo, fn in self.buckets}
        out["generic"] = self.launches_of("main__generic")
        return out

    def source(self) -> str:
        """Generated kernel code: CUDA C for cuda, LLVM IR for llvm."""
        if self.target.kind.name == "cuda":
            return self._cuda_source
        return llvm_source(self.executable.mod)

    @cached_property
    def _cuda_source(self) -> str:
        return cuda_source(self.executable.mod)

    def kernels_per_func(self) -> dict[str, int]:
        """CUDA only: the number of __global__ kernels each PrimFunc became."""
        counts: dict[str, int] = {}
        for k in cuda_kernels(self._cuda_source):
            fn = re.sub(r"_kernel(_\d+)?$", "", k)
            counts[fn] = counts.get(fn, 0) + 1
        return counts

    def host_fallbacks(self) -> list[str]:
        """CUDA only: PrimFuncs called from main (from every version of a bucketed build) that
        produced no GPU kernel (silently on the host)."""
        per = self.kernels_per_func()
        functions = [None] + [fn for _combo, fn in self.buckets]
        return sorted({n for fn in functions for n in self.call_sites(fn) if per.get(n, 0) == 0})

    @property
    def launches(self) -> int:
        return self.launches_of(None)

    def launches_of(self, function: str | None) -> int:
        sites = self.call_sites(function)
        if self.target.kind.name == "cuda":
            per = self.kernels_per_func()
            return sum(per.get(n, 0) for n in sites)
        return len(sites)

    # ------------------------------------------------------------------ running
    @cached_property
    def device(self):
        dev = tvm.cuda(0) if self.target.kind.name == "cuda" else tvm.cpu(0)
        if not dev.exist:
            raise DeviceUnavailableError(
                f"no {self.target.kind.name} device on this machine: the module compiled, but it cannot run "
                "here. Inspect it with .source()/.launches, or run on a machine with the device."
            )
        return dev

    def vm(self):
        install_once()
        return relax.VirtualMachine(self.executable, self.device)

    def convert_inputs(self, arrays):
        """numpy arrays (or what np.asarray takes) -> tvm.runtime.Tensors on the device, each checked
        against main's parameters (InputError naming the input)."""
        arrays = [np.asarray(a) for a in arrays]
        self.check_inputs([(tuple(a.shape), str(a.dtype)) for a in arrays])
        # np.ascontiguousarray turns a 0-d array into shape (1,): keep the shape (found by fuzzing)
        return [tvm.runtime.tensor(np.ascontiguousarray(a).reshape(a.shape), self.device) for a in arrays]

    def check_inputs(self, specs):
        """[(shape, dtype)] of the inputs of one call against main's parameters: count, shapes
        (symbolic dims consistent and in range) and dtypes; InputError naming the input."""
        if len(specs) != len(self.params):
            names = ", ".join(f"{n}{list(s)}:{d}" for n, s, d in self.params)
            raise InputError(f"main takes {len(self.params)} inputs ({names}), got {len(specs)}")
        bound = {}
        for i, ((got, got_dtype), (name, shape, dtype)) in enumerate(zip(specs, self.params)):
            if shape is not None and got != shape:
                raise InputError(f"input {i} '{name}': expected shape {list(shape)}, got {list(got)}")
            dims = self._dims[i]
            if dims is not None and (len(dims) != len(got) or any(
                    isinstance(d, int) and d != n for d, n in zip(dims, got))):
                shown = "[" + ", ".join(str(d) for d in dims) + "]"
                raise InputError(f"input {i} '{name}': expected shape {shown}, got {list(got)}")
            self._check_symbolic(i, name, dims, got, bound)
            if got_dtype != dtype:
                raise InputError(
                    f"input {i} '{name}': expected dtype {dtype}, got {got_dtype} (cast with .astype('{dtype}'))"
                )

    def call_tensors(self, *tensors):
        """`__call__` on tvm.runtime.Tensors already on the device (a framework's tensors seen
        through DLPack: no copy in), checked like numpy inputs; returns the VM's output Tensor(s)
        (no copy out)."""
        self.check_inputs([(tuple(int(d) for d in t.shape), str(t.dtype)) for t in tensors])
        return self._main()(*tensors)

    def _main(self):
        main = getattr(self._local, "main", None)
        if main is None:  # one VM per thread, kept (its memory pool too): a VM is not thread-safe
            main = self._local.main = self.vm()["main"]
        return main

    def _check_symbolic(self, i, name, dims, shape, bound):
        """Each symbolic dim (a plain name such as `seq`) takes one value across the inputs, within
        its declared range: a clear error here instead of a shape assertion inside the VM."""
        for d, n in zip(dims or (), shape):
            if not isinstance(d, str) or not d.isidentifier():
                continue
            if d in bound and bound[d][0] != n:
                j, other = bound[d][1:]
                raise InputError(f"input {i} '{name}': its dim {d} is {n}, but input {j} '{other}' has {d} = "
                                 f"{bound[d][0]}; inputs that share a symbolic dim must agree on it")
            bound.setdefault(d, (n, i, name))
            if d in self.ranges and not self.ranges[d][0] <= n <= self.ranges[d][1]:
                lo, hi = self.ranges[d]
                raise InputError(f"input {i} '{name}': dim {d} = {n} is outside its declared range [{lo}, {hi}]; "
                                 f"import again with a wider torch.export Dim (min={lo}, max={hi} now) or bucket it")

    def __call__(self, *arrays):
        return _to_numpy(self._main()(*self.convert_inputs(arrays)))


RANGES_ATTR = "tvmfuse.ranges"


def _dims(ty):
    """A parameter's dims: ints where static, the symbolic names elsewhere; None when unknown."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    return [int(v) if isinstance(v, tvm.tirx.IntImm) else str(v) for v in ty.shape.values]


def _to_numpy(res):
    if hasattr(res, "numpy"):
        return res.numpy()
    return tuple(_to_numpy(r) for r in res)
