"""What the torch.compile backend did with each graph dynamo gave it: compiled by tvmfuse (through
TVM's FX importer, or the ATen route: torch.export of the graph) or left to eager PyTorch, and why.

The backend (frontends/torch_backend.py) adds one `GraphRecord` per graph (in training, one per
ATen graph AOTAutograd makes of it: its forward and its backward, frontends/torch_train.py; an
optimizer step's update graph, frontends/torch_update.py). A model's records are
the graphs whose root code is the forward of one of its modules (a graph break's resume function
counts as the forward it resumes), so `tvmfuse.explain(torch.compile(model, backend="tvmfuse"))`
reports, after a call, every graph of that model and what ran eagerly. The first graph of a model
that runs eagerly is logged once at WARNING on `tvmfuse.torch` (the reason, and how to see more or
make it an error); later ones of the same model at INFO.

Contract: no import of torch or TVM here (explain reads records without them); records are kept
for the last `KEEP` graphs of the process.
"""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

KEEP = 512
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")


@dataclass
class GraphRecord:
    """One graph dynamo captured: its root function, op count, route and outcome."""
    root: tuple  # (file, function, line) of the frame dynamo traced (root_of)
    compile_id: str
    ops: int
    route: str = ""  # "fx" | "aten" when compiled; "aot" for a training graph (frontends/torch_train.py)
    compiled: object = None  # the tvmfuse build (tvmfuse.build.Compiled), None when eager
    reason: str = ""  # why it runs eagerly
    fx_error: str = ""  # why TVM's FX importer could not take it (the ATen route took it instead)
    calls_eager: list = field(default_factory=list)  # reasons a call of a compiled graph ran eagerly
    state: frozenset = frozenset()  # id() of the parameters and buffers dynamo passed as inputs
    owner: object = None  # weakref to the module whose forward dynamo traced (its `self`), when live
    kind: str = ""  # "" for an inference graph; AOTAutograd's "forward" / "backward" / "inference" when training;
    # "update" for an in-place update graph (an optimizer step, frontends/torch_update.py)
    notes: list = field(default_factory=list)  # what a call should know (a backward under create_graph=True)
    copies: int = 0  # an update graph's mutated inputs, each copied back per call (one copy_ each; torch_update.py)

    @property
    def eager(self) -> bool:
        return self.compiled is None

    def line(self) -> str:
        kind = f"{self.kind} " if self.kind else ""
        head = f"{kind}graph {self.compile_id} ({self.root[1]}, {self.ops} ops): "
        if self.eager:
            return head + f"EAGER: {self.reason}"
        c = self.compiled
        text = head + f"tvmfuse ({c.fusion}, {c.launches} kernels"
        text += ", via torch.export: TVM's FX importer failed: " + self.fx_error if self.route == "aten" else ""
        text += ")"
        if self.copies:
            text += f" + {self.copies} copy_ of the updated tensors into place"
        if self.calls_eager:
            text += f"; {len(self.calls_eager)} call(s) ran eagerly: {self.calls_eager[-1]}"
        if self.notes:
            text += f"; {self.notes[-1]}"
        return text


RECORDS: collections.deque = collections.deque(maxlen=KEEP)
_WARNED: set = set()


def root_of(code) -> tuple:
    """(file, function, line) of a traced code object: its first line, or for a graph break's resume
    function the function it resumes and the line it resumes at."""
    if code is None:
        return ("?", "?", 0)
    m = _RESUME.match(code.co_name)
    if m:
        return (code.co_filename, m.group(1), int(code.co_name.rsplit("_", 1)[1]))
    return (code.co_filename, code.co_name, code.co_firstlineno)


def add(record: GraphRecord) -> bool:
    """Keep the record; True when it is its model's first eager graph (the one to warn about)."""
    RECORDS.append(record)
    if not record.eager:
        return False
    owner = record.owner() if record.owner is not None else None
    model = (record.root[:2], id(owner) if owner is not None else None)  # the forward, and its instance
    if model in _WARNED:
        return False
    _WARNED.add(model)
    return True


def model_roots(model) -> set:
    """(file, function, first line, last line) of the forward of every module of `model` (an
    nn.Module or what torch.compile returned for one)."""
    model = getattr(model, "_orig_mod", model)
    out = set()
    for m in model.modules():
        code = getattr(type(m).forward, "__code__", None)
        if code is not None:
            last = max((line for _a, _b, line in code.co_lines() if line is not None), default=code.co_firstlineno)
            out.add((code.co_filename, code.co_name, code.co_firstlineno, last))
    return out


def _in(root, roots) -> bool:
    file, name, line = root
    return any(f == file and n == name and lo <= line <= hi for f, n, lo, hi in roots)


def of_model(model) -> list:
    """The records of `model`: its forward's graphs (by code), and of those that read parameters,
    the ones that read this instance's (two instances of one class are told apart)."""
    roots = model_roots(model)
    model = getattr(model, "_orig_mod", model)
    mine = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}

    def belongs(r):
        if r.owner is not None:  # the traced frame's own module (dead: that instance is gone)
            return r.owner() is model
        return _in(r.root, roots) and (not r.state or bool(r.state & mine))

    return [r for r in RECORDS if belongs(r)]


def of_callable(fn) -> list:
    """The records of a compiled function (`torch.compile(opt.step)`, or a step function that calls
    it): the graphs whose root is its code, or whose traced frame's owner is the object it is bound
    to (an optimizer)."""
    orig = getattr(fn, "_torchdynamo_orig_callable", fn)
    func = getattr(orig, "__func__", orig)
    code = getattr(func, "__code__", None)
    # what the function reaches: the object it is bound to, its closure's and its named globals'
    # values (a step function's optimizer); dynamo roots a step's graph at the optimizer's own step
    reached = [getattr(orig, "__self__", None)]
    reached += [c.cell_contents for c in getattr(func, "__closure__", None) or () if _filled(c)]
    if code is not None:
        names = getattr(func, "__globals__", {})
        reached += [names[n] for n in code.co_names if n in names]
    ids = {id(x) for x in reached if x is not None}

    def belongs(r):
        owner = r.owner() if r.owner is not None else None
        if owner is not None and id(owner) in ids:
            return True
        return code is not None and tuple(r.root[:2]) == (code.co_filename, code.co_name)

    return [r for r in RECORDS if belongs(r)]


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def report(model) -> str:
    """Text: every graph of the model (or of a compiled function, `of_callable`) the backend saw,
    compiled or eager with its reason."""
    records = of_model(model) if callable(getattr(model, "modules", None)) else of_callable(model)
    if not records:
        return ("no graph of this model has reached the tvmfuse backend yet: call the compiled model once "
                "(torch.compile compiles on the first call)")
    eager = sum(r.eager for r in records)
    lines = [f"torch.compile(backend='tvmfuse'): {len(records)} graph(s), {len(records) - eager} compiled by tvmfuse, "
             f"{eager} eager"]
    lines += ["  " + r.line() for r in records]
    return "\n".join(lines)
