"""`torch.compile(model, backend="tvmfuse")`: a TorchDynamo backend (static and dynamic shapes).

Registered through torch's `torch_dynamo_backends` entry point (setup.cfg), so the name works once
tvmfuse is installed. For each FX graph dynamo captures, `tvmfuse_backend(gm, example_inputs)`:
  - imports it with TVM's Relax FX frontend (`from_fx`) at the example inputs' shapes and dtypes,
  - builds it through the pipeline (tvmfuse.build: fusion "tvmfuse" unless options say otherwise),
  - returns a callable that runs the compiled module on the CPU tensors dynamo passes.
Options (`torch.compile(..., options={...})`): `fusion` ("none" / "tvm" / "tvmfuse"), `target`
("llvm"), `tuning_logs`, `freeze` (default True: parameters and buffers dynamo passes as inputs are baked in as
constants, folded and pre-packed at build; a call after one was changed in place, an optimizer
step, or rebound with `.data =`, runs eagerly with a warning), `buckets` (with dynamic=True: a list of sizes for every symbolic size of the
graph, or {dynamo symbol: sizes}; static versions for those sizes inside the one build, see
tvmfuse.build), and any fusion knob (tvmfuse/config.py).

A graph TVM's FX importer cannot take goes the ATen route (frontends/torch_aten.py: torch.export,
then TVM's ExportedProgram importer). A graph that updates its inputs or attributes in place under
no_grad (an optimizer step, train-mode BatchNorm's running statistics) goes the update route
(frontends/torch_update.py). A graph none takes (a build error, inputs on a GPU) runs in eager PyTorch and the model still runs: the first such graph of a
model is a WARNING on `tvmfuse.torch`, later ones INFO, each graph's outcome is recorded
(frontends/torch_records.py, `tvmfuse.explain(compiled_model)`), and `fallback="error"` raises
BackendFallbackError instead. Recompiles on guard failures are dynamo's. `dynamic=True` graphs are built
once with symbolic sizes (docs/dynamic-shapes.md) and run at every size dynamo sends them: each
size symbol becomes a TIR var with the range dynamo's guards give it, the SymInt inputs dynamo adds
are dropped (one the graph computes with, as transformers' BERT views and slices by the sequence
length, is read from a tensor input's shape instead), and a float dynamo lifts to an input
(LayerNorm's eps) is baked in (a call with another value runs eagerly).

This module is the backend's entry; the graph's inputs are prepared in frontends/torch_inputs.py and the
gaps of TVM's FX importer are bridged in frontends/torch_converters.py (`CONVERTERS`).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import weakref

import torch
from torch._dynamo.symbolic_convert import InstructionTranslator
from torch._guards import TracingContext
from tvm.relax.frontend.torch.fx_translator import TorchFXImporter

from ..build import build
from ..errors import BackendFallbackError
from . import torch_records, torch_tensors, torch_train, torch_update
from .torch_aten import import_aten
from .torch_records import GraphRecord
from .common import finish
from ..relax_utils import GRAPH_LOCK
from .torch_converters import CONVERTERS, importing
from .torch_inputs import bound_analyzer, buckets_for, input_info, is_module_state, size_sources, symbol_ranges, without_size_inputs

log = logging.getLogger("tvmfuse.torch")

_BUILD_OPTIONS = ("fusion", "target", "tuning_logs", "buckets")


def _import_fx(gm, info, ranges):
    """The graph through TVM's FX importer (with CONVERTERS), finished; raises what the importer raises."""
    importer = TorchFXImporter()
    with importing(importer, bound_analyzer(info, ranges)):  # the converters' state, this import's alone
        mod = importer.from_fx(gm, info, False, True, False, custom_convert_map=CONVERTERS)
    return finish(mod, "constants", True, ranges=ranges)


_DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"}
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
           "normal", "randperm", "bernoulli_", "uniform_", "normal_"}


def _random_ops(gm) -> str:
    """The random ops of the graph, by name ('' if none): train-mode dropout (an active nn.Dropout or
    F.dropout with training=True and p > 0) and the random samplers. TVM's FX importer reads dropout as
    the identity, right only in eval mode."""
    found = []
    for n in gm.graph.nodes:
        name = getattr(n.target, "__name__", str(n.target)).split(".")[-1]
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            active = mod.training and getattr(mod, "p", 0) > 0 and type(mod).__name__.lower() in {
                d.replace("_", "") for d in _DROPOUTS}
            name = type(mod).__name__ if active else ""
        elif name in _DROPOUTS:
            args = list(n.args) + [None] * 3
            p = n.kwargs.get("p", args[1] if args[1] is not None else 0.5)
            training = n.kwargs.get("training", args[2] if args[2] is not None else True)
            name = name if training and p else ""
        elif name not in _RANDOM:
            name = ""
        if name and name not in found:
            found.append(name)
    return ", ".join(found)


def _first_line(err) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def compile_graph(gm, example_inputs, options: dict | None = None, record: GraphRecord | None = None):
    """The compiled callable for one FX graph; raises on anything tvmfuse cannot take. `record`
    (torch_records) gets the route taken and each call that runs eagerly."""
    options = dict(options or {})
    record = record or GraphRecord(("?", "?"), "?", 0)
    record.route = "fx"
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    freeze = bool(options.pop("freeze", True))
    got, why = input_info(gm, example_inputs)
    if got is None:
        raise NotImplementedError(why)
    random = _random_ops(gm)
    if random:
        raise NotImplementedError(f"the graph draws random numbers ({random}: e.g. train-mode dropout); a compiled "
                                  "module would not, so it runs eagerly (call model.eval() for inference)")
    info, keep, drop, scalars = got
    eager = gm.forward
    frozen = {}  # input position -> (parameter, its version at build)
    if freeze:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for k, i in enumerate(list(keep)):
            t = example_inputs[i]
            if is_module_state(placeholders[i], t) and not any(not isinstance(d, int) for d in info[keep.index(i)][0]):
                frozen[i] = (placeholders[i].name, t, (t._version, t.data_ptr()))
        info = [inf for i, inf in zip(keep, info) if i not in frozen]
        keep = [i for i in keep if i not in frozen]
    if drop or scalars or frozen:
        gm = without_size_inputs(gm, drop, scalars, size_sources(gm, drop),
                                 {name: t.detach() for name, t, _v in frozen.values()})
    with GRAPH_LOCK, torch.no_grad():
        ranges = symbol_ranges(example_inputs, info)
        try:
            mod = _import_fx(gm, info, ranges)
        except Exception as err:  # noqa: BLE001 - the FX importer raises anything; the ATen route is next
            record.fx_error = f"{type(err).__name__}: {_first_line(err)}"
            log.info("tvmfuse backend: TVM's FX importer failed (%s); tracing the graph to ATen with torch.export",
                     record.fx_error)
            mod = import_aten(gm, [example_inputs[i] for i in keep], info, ranges)
            record.route = "aten"
    compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                     tuning_logs=build_kw.get("tuning_logs"), name="torch_graph",
                     buckets=buckets_for(build_kw.get("buckets"), info), **options)

    def run(*args):
        if any(args[i].item() != v for i, (_n, v) in scalars.items()):  # a baked float changed
            log.warning("tvmfuse backend: a float input changed since the build; this call runs eagerly")
            record.calls_eager.append("a float input changed since the build")
            return eager(*args)
        if any(args[i] is not t or (t._version, t.data_ptr()) != v for i, (_n, t, v) in frozen.items()):
            log.warning("tvmfuse backend: a parameter changed since the build (it was baked in as a constant; "
                        "options={'freeze': False} keeps parameters as inputs); this call runs eagerly")
            record.calls_eager.append("a parameter changed since the build")
            return eager(*args)
        return torch_tensors.call(compiled, [args[i] for i in keep])

    run.compiled = compiled
    return run


def tvmfuse_backend(gm, example_inputs, options: dict | None = None, **kwargs):
    """The dynamo backend: the compiled graph, or `gm.forward` (eager) with a logged reason; with
    options={"fallback": "error"}, a graph tvmfuse cannot take raises BackendFallbackError instead."""
    options = {**(options or {}), **kwargs}
    fallback = options.pop("fallback", "eager")
    if fallback not in ("eager", "error"):
        raise BackendFallbackError(f"options={{'fallback': {fallback!r}}}: use 'eager' (the default: a graph "
                                   "tvmfuse cannot take runs in eager PyTorch, logged) or 'error' (it raises)")
    autograd = options.pop("autograd", "aot")
    if autograd not in ("aot", "eager"):
        raise BackendFallbackError(f"options={{'autograd': {autograd!r}}}: use 'aot' (the default: training graphs "
                                   "are built by tvmfuse through AOTAutograd) or 'eager' (they run in eager PyTorch)")
    partitioner = options.pop("partitioner", "min_cut")
    if partitioner not in torch_train.PARTITIONERS:
        raise BackendFallbackError(f"options={{'partitioner': {partitioner!r}}}: use 'min_cut' (the default, "
                                   "Inductor's: cheap ops recomputed in the backward where that saves saved "
                                   "tensors) or 'default' (AOTAutograd's: the forward saves all the backward reads)")
    record = GraphRecord(_root(), str(gm.meta.get("dynamo_compile_id", "?")),
                         sum(n.op.startswith("call_") for n in gm.graph.nodes), state=_state_ids(gm, example_inputs),
                         owner=_owner())
    if torch_train.wants_autograd(example_inputs):
        return _training(gm, example_inputs, options, fallback, autograd, partitioner, record)
    if torch_update.is_update(gm):
        return _update(gm, example_inputs, options, fallback, record)
    try:
        fn = compile_graph(gm, example_inputs, options, record)
    except Exception as err:  # noqa: BLE001 - any failure runs the graph eagerly, never breaks the model
        record.reason = f"{type(err).__name__}: {_first_line(err)}"
        if record.fx_error and record.fx_error not in record.reason:
            record.reason += f" (TVM's FX importer: {record.fx_error})"
        first = torch_records.add(record)
        if fallback == "error":
            raise BackendFallbackError(f"tvmfuse backend: graph {record.compile_id} of {record.root[1]} cannot be "
                                       f"compiled: {record.reason}") from err
        if first:
            log.warning("tvmfuse backend: graph %s of %s left to eager PyTorch: %s. tvmfuse.explain(compiled_model) "
                        "lists every graph and what ran eagerly; options={'fallback': 'error'} raises instead",
                        record.compile_id, record.root[1], record.reason)
        else:
            log.info("tvmfuse backend: graph %s of %s left to eager PyTorch: %s", record.compile_id, record.root[1],
                     record.reason)
        log.debug("the failure", exc_info=True)
        return gm.forward
    record.compiled = fn.compiled
    torch_records.add(record)
    single = _returns_single(gm)

    def call(*args):
        outs = fn(*args)
        return outs[0] if single else outs

    call.compiled = fn.compiled
    call.record = record
    return call


def _training(gm, example_inputs, options, fallback, autograd, partitioner, record):
    """A graph autograd needs (torch_train.py): AOTAutograd's forward and backward built by tvmfuse,
    or the dynamo graph in eager PyTorch (autograd intact) with the reason recorded."""
    why = torch_train.refusal(example_inputs)
    if not why and autograd == "eager":
        why = "options={'autograd': 'eager'}: training graphs run in eager PyTorch"
    backend = functools.partial(torch_train.train_backend, partitioner=partitioner)
    return _through_aot(gm, example_inputs, options, fallback, record, why, backend, kind="training",
                        what="the graph", compiled_as="for training")


def _update(gm, example_inputs, options, fallback, record):
    """A graph that updates its inputs in place, an optimizer step (torch_update.py): its functional
    ATen graph built by tvmfuse, the updates written in place; or the dynamo graph in eager PyTorch with
    the reason recorded."""
    return _through_aot(gm, example_inputs, options, fallback, record, torch_update.refusal(gm, example_inputs),
                        torch_update.update_backend, kind="update", what="the update graph",
                        compiled_as="as an update")


def _through_aot(gm, example_inputs, options, fallback, record, why, backend, *, kind, what, compiled_as):
    """The AOTAutograd routes (training, update): `backend(...)` unless `why` refuses it or AOT cannot
    trace the graph; otherwise the dynamo graph in eager PyTorch, recorded with the reason (raised
    under fallback="error")."""
    if not why:
        def new_record(k, ops):
            return dataclasses.replace(record, kind=k, ops=ops, calls_eager=[], notes=[])

        try:
            return backend(gm, example_inputs, options, fallback, new_record)
        except Exception as err:  # noqa: BLE001 - AOTAutograd could not trace it: eager, autograd/updates intact
            if fallback == "error":
                raise
            why = f"AOTAutograd could not trace {what}: {type(err).__name__}: {_first_line(err)}"
            log.debug("the failure", exc_info=True)
    record.kind, record.reason = kind, why
    first = torch_records.add(record)
    if fallback == "error":
        raise BackendFallbackError(f"tvmfuse backend: graph {record.compile_id} of {record.root[1]} cannot be "
                                   f"compiled {compiled_as}: {why}")
    (log.warning if first else log.info)("tvmfuse backend: graph %s of %s runs in eager PyTorch: %s",
                                         record.compile_id, record.root[1], why)
    return gm.forward


def _state_ids(gm, example_inputs) -> frozenset:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return frozenset(id(t) for n, t in zip(placeholders, example_inputs)
                     if isinstance(t, torch.Tensor) and is_module_state(n, t))


def _owner():
    """A weakref to the module whose frame dynamo is tracing (the `self` among its locals), or None."""
    try:
        tx = InstructionTranslator.current_tx()
    except AttributeError:  # the backend called outside dynamo (no frame being traced)
        return None
    local = getattr(tx, "f_locals", {}).values()
    mod = next((v for v in local if isinstance(v, torch.nn.Module)), None)
    if mod is None:  # an optimizer's step: its optimizer (torch_records.of_callable), `self` or in `args`
        flat = [x for v in local for x in (v if isinstance(v, tuple) else (v,))]
        mod = next((v for v in flat if isinstance(v, torch.optim.Optimizer)), None)
    return weakref.ref(mod) if mod is not None else None


def _root() -> tuple:
    """(file, function) of the frame dynamo is compiling (torch_records.root_of)."""
    tc = TracingContext.try_get()
    codes = getattr(tc, "traced_code", None) or [None]
    return torch_records.root_of(codes[0])


def _returns_single(gm) -> bool:
    """Whether the FX graph returns one tensor (dynamo graphs usually return a tuple)."""
    out = [n for n in gm.graph.nodes if n.op == "output"][0]
    return not isinstance(out.args[0], (tuple, list))
