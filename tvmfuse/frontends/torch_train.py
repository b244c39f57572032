"""Training through `torch.compile(model, backend="tvmfuse")`: forward and backward as two ATen
graphs, each built by tvmfuse.

The dispatcher (frontends/torch_backend.py) sends a graph here when autograd needs it, by the rule
AOTAutograd itself uses: grad mode is on and some graph input requires grad (the parameters do,
whether the model is in train or eval mode). Under `torch.no_grad()` the inference route (frozen
parameters) is taken as before.

The route: `torch._dynamo.backends.common.aot_autograd` with core-ATen decompositions (so the
backward's ops, threshold_backward, native_layer_norm_backward, gelu_backward, ..., arrive as the
plain arithmetic, sums and mms TVM's ExportedProgram importer converts; the normalizations whose
saved statistics TVM's converters drop are decomposed by torch too) and a partitioner
(torch_aot_config.py): by default Inductor's min-cut one (the forward saves fewer tensors, and
cheap elementwise ops are recomputed in the backward, where they fuse); with
`options={"partitioner": "default"}` AOTAutograd's (forward saves what backward reads; nothing is
recomputed). Each ATen graph (the
forward, the backward, and the inference graph AOT makes when no gradient is needed after all) goes
through `compile_aten_graph`: parameters are inputs, never frozen, so an optimizer step between
calls is correct.

Import: the ATen route of the inference backend (frontends/torch_aten.py `import_aten`: torch.export
of the graph, then `from_exported`). AOT's graphs are already functional core ATen, so export traces
them again unchanged (its decompositions have nothing left to do), and the converter check, TVM's
importer, the torch fixes and `finish` are shared with every other torch import. Driving TVM's
ExportedProgramImporter directly would need a hand-made ExportedProgram (graph signature, range
constraints) for the same result. Before export, a graph's outputs are reduced to what TVM computes:
`None` (the gradient of an input that needs none), an input returned as is and a view of one (a
weight, or its transpose, saved for the backward: torch_views.py) are handed back by the runtime
wrapper without the compiled module, and an output returned twice is computed once. AOT's
compilers get FakeTensors: export gets zeros of the same shapes and dtypes. Computed outputs keep
the strides AOT recorded where those are a permutation of contiguous ones (a saved `permute` of an
activation), so AOT's view replay and the backward see the layout they traced; an overlapping
layout (an `expand`) is returned contiguous with the same values. An input that is a permuted
dense tensor (a saved weight transpose) is taken as its base, permuted in the graph (torch_layouts.py).

What runs eagerly (a graph with symbolic sizes, a CPU-less input, an op TVM cannot convert, a
build error) is the ATen graph itself, recorded with its reason like the inference route's graphs
(frontends/torch_records.py: kind "forward" / "backward" / "inference"). A model on a GPU never
reaches AOT: its dynamo graph runs eagerly. `create_graph=True` gets first-order gradients from the
compiled backward and a WARNING: AOTAutograd (Inductor's route too) refuses a second backward
through them with its RuntimeError; `options={"autograd": "eager"}` runs such models' graphs in
eager PyTorch instead.

For benchmarks: `compile_training(model, *inputs)` compiles a model and runs one step, and returns
the forward and backward `Compiled` builds of its graphs (launch counts, plans, kernel profiles).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import sys

import torch

from ..build import build
from ..passes.update_in_place import aliased_outputs, offer_updates
from . import torch_layouts, torch_records, torch_tensors, torch_views
from .torch_aot_config import PARTITIONERS, decompositions
from .torch_aten import import_aten
from .torch_grad_converters import GRAD_CONVERTERS
from .torch_records import GraphRecord

log = logging.getLogger("tvmfuse.torch")

_BUILD_OPTIONS = ("fusion", "target", "tuning_logs")
_NOT_FOR_TRAINING = ("freeze", "buckets")  # inference options a training graph ignores (nothing frozen, static)


def wants_autograd(example_inputs) -> bool:
    """AOTAutograd's rule: grad mode on and some tensor input requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def refusal(example_inputs) -> str:
    """Why a graph cannot go the training route at all ('' when it can): an input off the CPU."""
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and t.device.type != "cpu":
            return (f"input {i} is on {t.device}; the tvmfuse backend trains on the CPU (move the model and "
                    "inputs with .cpu(), or compile for the GPU with another backend)")
    return ""


def _plan_outputs(gm):
    """(how each output is produced: ("none",), ("input", i), ("view", i, steps) or ("computed", k,
    strides or None); the computed nodes in order): None, inputs, views of inputs (torch_views.py)
    and duplicates are not computed."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    specs, computed = [], []
    for v in values:
        if v is None:
            specs.append(("none",))
        elif not isinstance(v, torch.fx.Node):
            raise NotImplementedError(f"the graph returns a {type(v).__name__} ({v!r}), not a tensor")
        elif v.op == "placeholder":
            specs.append(("input", placeholders.index(v)))
        elif (view := torch_views.input_view(v, placeholders)) is not None:  # a saved weight transpose
            specs.append(("view", *view))
        else:
            if v not in computed:
                computed.append(v)
            val = v.meta.get("val")
            strides = None
            if isinstance(val, torch.Tensor) and not val.is_contiguous() and _dense(val):
                strides = tuple(int(s) for s in val.stride())
            specs.append(("computed", computed.index(v), strides))
    return specs, computed


def _dense(t) -> bool:
    """Whether the tensor's strides are a permutation of contiguous ones (a transpose, not an expand:
    an overlapping layout is returned contiguous, with the same values)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return bool(is_non_overlapping_and_dense_or_false(t))


def _computing_graph(gm, computed):
    """A copy of `gm` that returns the computed outputs only (a tuple)."""
    graph = copy.deepcopy(gm.graph)
    names = [n.name for n in computed]
    nodes = {n.name: n for n in graph.nodes}
    out = next(n for n in graph.nodes if n.op == "output")
    out.args = (tuple(nodes[n] for n in names),)
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)


def _info(example_inputs):
    """[(shape, dtype)] of the inputs; NotImplementedError for what this route does not take."""
    info = []
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            raise NotImplementedError(f"input {i} is a {type(t).__name__} (a symbolic size: training graphs are "
                                      "compiled with static shapes only)")
        if t.device.type != "cpu":
            raise NotImplementedError(f"input {i} is on {t.device}; the tvmfuse backend trains on the CPU")
        if any(not isinstance(d, int) for d in t.shape):
            raise NotImplementedError(f"input {i} has symbolic sizes {list(t.shape)} (training graphs are compiled "
                                      "with static shapes only)")
        info.append((tuple(int(d) for d in t.shape), str(t.dtype).replace("torch.", "")))
    return info


def compile_aten_graph(gm, example_inputs, options: dict | None = None, updates: dict | None = None):
    """(boxed callable, Compiled or None) for one ATen graph AOTAutograd made; raises on anything
    tvmfuse cannot take (the caller runs the graph eagerly). `updates` ({output index: input
    index}: that output is the input's new value, torch_update.py) asks the build to write those
    outputs into the inputs' memory (passes/update_in_place.py); the callable then returns the
    input tensors' memory for them."""
    options = {k: v for k, v in (options or {}).items() if k not in _NOT_FOR_TRAINING}
    build_kw = {k: options.pop(k) for k in _BUILD_OPTIONS if k in options}
    info = _info(example_inputs)
    _refuse_random(gm)
    specs, computed = _plan_outputs(gm)
    compiled = None
    donated = {}
    orders = {}  # permuted inputs taken as their dense base (torch_layouts.py)
    if computed:
        graph = _computing_graph(gm, computed)
        orders = torch_layouts.take_dense_bases(graph, example_inputs)
        info = _info(torch_layouts.bases(example_inputs, orders))
        real = [torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in info]
        with torch.no_grad():
            mod = import_aten(graph, real, info, {}, custom_convert_map=GRAD_CONVERTERS)
        _check_outputs(mod, computed)
        # the new values of updated inputs (torch_update.py), offered to passes/update_in_place.py; not an
        # input the graph also returns as it is (written in place, that output would read the new value)
        returned = {s[1] for s in specs if s[0] in ("input", "view")}
        marks = {specs[o][1]: i for o, i in (updates or {}).items() if specs[o][0] == "computed" and i not in returned}
        mod = offer_updates(mod, marks)
        compiled = build(mod, build_kw.get("target", "llvm"), build_kw.get("fusion", "tvmfuse"),
                         tuning_logs=build_kw.get("tuning_logs"), name="torch_train_graph", **options)
        donated = {k: marks[k] for k in aliased_outputs(compiled.mod)}  # written in place: returned as the input

    def run(args):
        args = list(args)
        outs = torch_tensors.call(compiled, torch_layouts.bases(args, orders), donated) if compiled is not None else ()
        results = []
        for spec in specs:
            if spec[0] == "none":
                results.append(None)
            elif spec[0] == "input":
                results.append(args[spec[1]])
            elif spec[0] == "view":
                results.append(torch_views.replay(args[spec[1]], spec[2]))
            else:
                t = outs[spec[1]]
                if spec[2] is not None:  # the layout AOT traced (a saved transpose)
                    t = torch.empty_strided(t.shape, spec[2], dtype=t.dtype).copy_(t)
                results.append(t)
        return results

    return run, compiled


def _refuse_random(gm) -> None:
    """NotImplementedError for a graph that draws random numbers (train-mode dropout): TVM's
    converters treat dropout as the identity, and the mask must be torch's own draw."""
    for node in gm.graph.nodes:
        tags = getattr(node.target, "tags", ()) if node.op == "call_function" else ()
        if torch.Tag.nondeterministic_seeded in tags:
            raise NotImplementedError(f"the graph draws random numbers ({node.target}, e.g. train-mode dropout), "
                                      "which the compiled module cannot reproduce")


def _check_outputs(mod, computed) -> None:
    """NotImplementedError unless main returns what AOT traced for each computed output (its shape
    and dtype): a converter that returns something else (a mask of the wrong dtype) is caught here,
    at build, instead of as a wrong result."""
    from tvm import relax

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(computed):
        raise NotImplementedError(f"the imported graph returns {len(fields)} values for {len(computed)} outputs")
    for node, ty in zip(computed, fields):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(ty, relax.TensorType):
            continue
        want = (tuple(int(d) for d in val.shape), str(val.dtype).replace("torch.", ""))
        got_shape = tuple(int(d) for d in ty.shape.values) if ty.shape is not None else None
        if (got_shape, str(ty.dtype)) != want:
            raise NotImplementedError(f"output {node.name} imports as {list(got_shape or [])}:{ty.dtype}, "
                                      f"AOTAutograd traced {list(want[0])}:{want[1]}")


def _boxed(fn):
    """AOTAutograd's calling convention: one list of arguments, which the callee may free."""
    def call(args):
        items = list(args)
        args.clear()
        return fn(items)

    call._boxed_call = True
    return call


def _eager(gm):
    return _boxed(lambda items: gm(*items))


def _compiler(kind: str, options: dict, fallback: str, new_record, functional=None):
    """AOTAutograd's compiler for one kind of graph ("forward", "backward", "inference", "update"):
    the tvmfuse build, or on failure the graph itself (eager), recorded either way. `functional`
    (gm -> (the graph tvmfuse builds, {output: input it updates}, run(fn) -> the graph's callable)):
    an update graph's in-place copies taken out before the build and done by `run` (torch_update.py);
    the eager fallback runs the graph as AOTAutograd gave it."""
    def compile_one(gm, example_inputs):
        record = new_record(kind, sum(n.op == "call_function" for n in gm.graph.nodes))
        record.route = "aot"
        try:
            built, updates, wrap = functional(gm) if functional else (gm, None, None)
            fn, compiled = compile_aten_graph(built, example_inputs, options, updates)
            fn = wrap(fn, compiled) if wrap else fn
            record.copies = getattr(fn, "copies", 0)
        except Exception as err:  # noqa: BLE001 - never break training: the ATen graph runs eagerly
            return _refused(gm, record, err, fallback)
        record.compiled = compiled
        torch_records.add(record)
        fn = _eager_on_error(fn, gm, record)
        if kind == "backward":
            fn = _warn_on_create_graph(fn, record)
        call = _boxed(fn)
        call.compiled, call.record = compiled, record
        return call

    return compile_one


def _eager_on_error(fn, gm, record):
    """The compiled graph, or on an error at run time (a bug: the build was checked against AOT's
    trace) the ATen graph in eager PyTorch, with a WARNING and the reason recorded."""
    def run(items):
        try:
            return fn(items)
        except Exception as err:  # noqa: BLE001 - never raise where eager PyTorch would not
            why = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
            log.warning("tvmfuse backend: the compiled %s graph %s failed (%s); this call runs eagerly",
                        record.kind, record.compile_id, why, exc_info=err)
            record.calls_eager.append(why)
            return list(gm(*items))

    return run


def _refused(gm, record, err, fallback):
    from ..errors import BackendFallbackError

    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    record.reason = f"{type(err).__name__}: {first}"
    first_of_model = torch_records.add(record)
    if fallback == "error":
        raise BackendFallbackError(f"tvmfuse backend: the {record.kind} graph {record.compile_id} of {record.root[1]} "
                                   f"cannot be compiled: {record.reason}") from err
    (log.warning if first_of_model else log.info)(
        "tvmfuse backend: the %s graph %s of %s runs in eager PyTorch: %s. tvmfuse.explain(compiled_model) lists "
        "every graph", record.kind, record.compile_id, record.root[1], record.reason)
    log.debug("the failure", exc_info=err)
    call = _eager(gm)
    call.compiled, call.record = None, record
    return call


def _under_create_graph() -> bool:
    """Whether AOTAutograd runs this backward under create_graph=True: it then calls it from its
    `_double_backward` (inside an autograd.Function's forward, where grad mode is off, so
    torch.is_grad_enabled() cannot tell). create_graph=True keeps the graph, so a backward that
    does not keep it (the usual one) is answered without walking the stack (about 3.5 us a call)."""
    if not torch._C._autograd._get_current_graph_task_keep_graph():
        return False
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "_double_backward" and "_aot_autograd" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _warn_on_create_graph(fn, record):
    """The backward, with a WARNING when it runs under create_graph=True."""
    def run(items):
        if _under_create_graph():
            note = ("create_graph=True: the gradients come from the compiled backward, but a second backward "
                    "through them raises (AOTAutograd does not support double backward); compile with "
                    "options={'autograd': 'eager'} to run this model's training graphs in eager PyTorch")
            if note not in record.notes:
                log.warning("tvmfuse backend: %s", note)
                record.notes.append(note)
        return fn(items)

    return run


def train_backend(gm, example_inputs, options: dict, fallback: str, new_record, partitioner: str = "min_cut"):
    """The training route for one dynamo graph: AOTAutograd with tvmfuse's compilers.
    `new_record(kind, ops)` makes the GraphRecord of one ATen graph. Horizontal fusion is on (the
    knob `horizontal`): a train-mode BatchNorm's running statistics are small independent updates,
    and a layer's input and weight gradients are siblings. `partitioner` (PARTITIONERS) splits the
    joint graph into forward and backward."""
    from torch._dynamo.backends.common import aot_autograd

    options = {"horizontal": True, **options}
    return aot_autograd(fw_compiler=_compiler("forward", options, fallback, new_record),
                        bw_compiler=_compiler("backward", options, fallback, new_record),
                        inference_compiler=_compiler("inference", options, fallback, new_record),
                        partition_fn=PARTITIONERS[partitioner](),
                        decompositions=decompositions())(gm, example_inputs)


@dataclasses.dataclass
class TrainingBuild:
    """What compile_training built: the compiled model and, per graph dynamo captured, the forward
    and backward tvmfuse builds (`Compiled`, None where that graph runs eagerly) and their records."""
    model: object  # what torch.compile returned
    records: list  # GraphRecord of each ATen graph, in the order they were built

    def of_kind(self, kind: str) -> list:
        return [r.compiled for r in self.records if r.kind == kind]

    forward = property(lambda self: self.of_kind("forward"))
    backward = property(lambda self: self.of_kind("backward"))

    def launches(self) -> int:
        """Kernel launches of one training step's compiled graphs (forward and backward)."""
        return sum(c.launches for c in self.forward + self.backward if c is not None)


def compile_training(model, *inputs, options: dict | None = None, loss=None) -> TrainingBuild:
    """`torch.compile(model, backend="tvmfuse")`, built by one forward and backward on `inputs`
    (`loss(output)`, default the sum of the output) whose gradients are then dropped; for benchmarks
    and tests that count the launches of the forward and backward builds."""
    ids = {id(r) for r in torch_records.RECORDS}
    compiled = torch.compile(model, backend="tvmfuse", options=options)
    with torch.enable_grad():
        out = compiled(*inputs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        (loss(out) if loss is not None else out.float().sum()).backward()
    for p in model.parameters():
        p.grad = None
    return TrainingBuild(compiled, [r for r in torch_records.RECORDS if id(r) not in ids and r.kind])
