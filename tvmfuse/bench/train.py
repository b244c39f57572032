"""`scripts/bench.py --train`: one training step (forward, backward, optimizer update) per system.

Systems: "torch" (eager PyTorch, the numerics reference), "torch.compile" (Inductor, default mode)
and "tvmfuse" (torch.compile(backend="tvmfuse"): AOTAutograd's forward and backward graphs built by
tvmfuse, frontends/torch_train.py), all on tvmfuse's runtime thread count (torch.set_num_threads).
Models and optimizers: bench/train_models.py. A step is `zero_grad(set_to_none=True)`, the MSE
loss of the model's output against a fixed random target, `backward()` and the optimizer's step.

The optimizer step goes through each system's backend (OPT_BACKENDS: torch.compile of
`optimizer.step`): Inductor compiles torch.optim's step; the tvmfuse backend builds its update graph
(frontends/torch_update.py: functionalized by AOTAutograd, the per-parameter updates joined into one
kernel by fusion/fuse_horizontal.py, the new values copied into the parameters and the optimizer
state by AOT's wrapper, one copy_ each).

Every system starts from the same weights, runs WARMUP_STEPS steps (compiles and recompiles
happen there) and its parameters are checked against eager's after them (`ok`). Then the systems
are timed in interleaved rounds (order rotated each round), each sample the mean step time over
`budget_s`; the row keeps the median.

Launches per step, by part (`parts`): eager ATen ops (one kernel each on the CPU; torch.optim's CPU
default is its per-parameter loop), counted with a TorchDispatchMode; Inductor's kernel calls in
the `call()` of the code it generated for the step's graphs (its cpp_fused_* kernels and
extern_kernels such as mm; `generated_kernel_count` is Inductor's own metric, recompiles included);
tvmfuse's launches from the plans of its forward, backward and update builds, plus the update's
copy-backs (`copy_back`: one copy_ per updated tensor the build could not write in place,
passes/update_in_place.py; where an update graph ran eagerly, the
optimizer part is eager's ATen op count instead, noted). Bytes moved per step: tvmfuse's
builds' kernels' reads and writes (runtime/metrics.py bytes_moved); the peers have no such measure.

The optimizer step is also timed alone (`opt_ms`, in the same rounds) against its bound: its least
bytes (`_update_bytes`: parameters, gradients and state read, parameters and state written) over
the memory bandwidth measured in the same run (runtime/roofline.py).
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass, field

from . import train_models
from .core import _time
from .report import geomean

SYSTEMS = ("torch", "torch.compile", "tvmfuse")
BACKENDS = {"torch": None, "torch.compile": "inductor", "tvmfuse": "tvmfuse"}  # the model's
OPT_BACKENDS = {"torch": None, "torch.compile": "inductor", "tvmfuse": "tvmfuse"}  # the optimizer step's
WARMUP_STEPS = 3
RTOL, ATOL = 1e-3, 1e-5  # parameters after WARMUP_STEPS against eager's (atol: of each tensor's largest entry)
# Adam and AdamW move each parameter by about lr a step whatever its gradient's size, so a gradient
# that is rounding noise in every system moves it by up to lr in a direction no two systems agree on
# (BERT's key bias: softmax ignores it, its gradient is 0 in exact arithmetic, and Inductor's
# parameters left eager's as far as tvmfuse's). Their parameters are also allowed this share of the
# distance the warm-up steps can move them (lr * WARMUP_STEPS); SGD's steps scale with the gradient.
NORMALIZED_STEP_TOL = 1e-2


@dataclass
class TrainRow:
    workload: str
    optimizer: str
    ms: dict = field(default_factory=dict)  # system -> median ms per step
    launches: dict = field(default_factory=dict)  # system -> launches per step (forward + backward + optimizer)
    parts: dict = field(default_factory=dict)  # system -> {part: launches} (forward, backward, optimizer, ...)
    bytes: dict = field(default_factory=dict)  # system -> bytes moved per step (tvmfuse's builds)
    ok: dict = field(default_factory=dict)  # system -> parameters match eager's after the warm-up steps
    compile_s: dict = field(default_factory=dict)  # system -> seconds of the first step
    notes: dict = field(default_factory=dict)  # system -> what runs eagerly, and why
    samples: dict = field(default_factory=dict)  # system -> timing samples the median is over
    opt_ms: dict = field(default_factory=dict)  # system -> median ms of the optimizer step alone
    opt_bytes: int = 0  # the optimizer step's least bytes: parameters, gradients and state read, written
    bound_ms: float | None = None  # opt_bytes over the run's measured memory bandwidth

    def ratio(self, a, b):
        """How many times faster a is than b."""
        return self.ms[b] / self.ms[a] if a in self.ms and b in self.ms else None

    def as_dict(self):
        return asdict(self)


class Step:
    """One system's training step on its own copy of the model: `step()` runs one."""

    def __init__(self, system, name, optimizer, target=None):
        import torch

        self.torch, self.system = torch, system
        self.model, self.x = train_models.model(name)
        if target is None:
            with torch.no_grad():
                shape = copy.deepcopy(self.model).eval()(self.x).shape  # (a train-mode call updates BatchNorm)
            target = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        self.target = target
        backend, opt_backend = BACKENDS[system], OPT_BACKENDS[system]
        self.run = torch.compile(self.model, backend=backend) if backend else self.model
        self.opt = train_models.OPTIMIZERS[optimizer](torch, self.model.parameters())
        self.opt_step = torch.compile(self.opt.step, backend=opt_backend) if opt_backend else self.opt.step

    def model_part(self):
        self.opt.zero_grad(set_to_none=True)
        loss = self.torch.nn.functional.mse_loss(self.run(self.x), self.target)
        loss.backward()
        return loss

    def step(self):
        loss = self.model_part()
        self.opt_step()
        return loss


def _aten_ops(fn) -> int:
    """ATen ops `fn()` dispatches (each a kernel launch in eager PyTorch on the CPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def _inductor_calls(modules) -> int:
    """Kernel calls in the `call()` of Inductor's generated modules: its kernels and extern kernels."""
    import re

    pattern = re.compile(r"^\s*(?:\w+ = )?(cpp_fused_\w+|kernel_cpp_\w+|extern_kernels\.\w+|torch\.ops\.[\w.]+)\(",
                         re.M)  # a statement calling a kernel: `cpp_fused_0(...)`, `buf6 = extern_kernels.mm(...)`
    total = 0
    for m in modules:
        with open(m.__file__) as f:
            src = f.read()
        call = re.split(r"\n\s*(?:async )?def ", src[src.find("def call("):])[0]  # to the next def
        total += len(pattern.findall(call))
    return total


class _Watch:
    """What one part of a step (the model's forward and backward, or the optimizer step) compiled:
    tvmfuse's records, the latest per dynamo frame and kind (a recompile replaces its frame's graph),
    and the Inductor modules of the last warm-up step that created any."""

    def __init__(self):
        self.latest, self.modules, self.kernels = {}, [], 0

    @property
    def records(self) -> list:
        return list(self.latest.values())

    def __call__(self, fn):
        from torch._inductor import metrics
        from torch._inductor.codecache import PyCodeCache

        from ..frontends import torch_records

        recs, mods = {id(r) for r in torch_records.RECORDS}, {id(m) for m in PyCodeCache.modules}
        k0 = metrics.generated_kernel_count
        fn()
        for r in torch_records.RECORDS:
            if id(r) not in recs and r.kind:
                frame = r.compile_id.split("/")[0] if "/" in r.compile_id else id(r)
                self.latest[(frame, r.kind)] = r
        new_mods = [m for m in PyCodeCache.modules if id(m) not in mods]
        self.modules = new_mods or self.modules
        self.kernels += metrics.generated_kernel_count - k0


def _warm_up(step):
    """WARMUP_STEPS steps -> (seconds of the first, model part's _Watch, optimizer's _Watch)."""
    model_w, opt_w = _Watch(), _Watch()
    t0 = time.perf_counter()
    for i in range(WARMUP_STEPS):
        model_w(step.model_part)
        opt_w(step.opt_step)
        first = time.perf_counter() - t0 if i == 0 else first
    return first, model_w, opt_w


def _count(row, system, step, model_w, opt_w):
    """Launches per step by part, and bytes moved, into row."""
    from ..runtime.metrics import bytes_moved

    if system == "torch":
        parts = {"forward+backward": _aten_ops(step.model_part), "optimizer": _aten_ops(step.opt_step)}
    elif system == "torch.compile":
        parts = {"forward+backward": _inductor_calls(model_w.modules), "optimizer": _inductor_calls(opt_w.modules),
                 "generated_kernel_count": model_w.kernels + opt_w.kernels}
    else:
        builds = {k: [r.compiled for r in model_w.records if r.kind == k and r.compiled is not None]
                  for k in ("forward", "backward")}
        updates = [r for r in opt_w.records if r.kind == "update"]
        builds["update"] = [r.compiled for r in updates if r.compiled is not None]
        parts = {k: sum(c.launches for c in cs) for k, cs in builds.items() if k != "update"}
        notes = [r.line() for r in model_w.records + opt_w.records if r.compiled is None or r.calls_eager]
        if updates and all(r.compiled is not None for r in updates):
            parts["optimizer"] = sum(c.launches for c in builds["update"])
            parts["copy_back"] = sum(r.copies for r in updates)
            notes.insert(0, f"optimizer step built by tvmfuse: {parts['optimizer']} kernel(s) + "
                            f"{parts['copy_back']} copy_ into place")
        else:  # an update graph ran eagerly: count eager's ATen ops for the step
            parts["optimizer"] = _aten_ops(step.opt.step)
            notes.insert(0, "optimizer step (partly) in eager PyTorch: its launches are eager's ATen ops")
        row.bytes[system] = sum(bytes_moved(c.launched, c.kernel_function)[0] for cs in builds.values() for c in cs)
        row.notes[system] = "; ".join(notes)
    row.parts[system] = parts
    row.launches[system] = sum(v for k, v in parts.items() if k != "generated_kernel_count")


def _params_close(step, reference) -> bool:
    import torch

    moved = 0.0
    if isinstance(step.opt, (torch.optim.Adam, torch.optim.AdamW)):
        moved = NORMALIZED_STEP_TOL * step.opt.param_groups[0]["lr"] * WARMUP_STEPS
    with torch.no_grad():
        return all(torch.allclose(p, q, rtol=RTOL, atol=ATOL * float(q.abs().max()) + 1e-7 + moved)
                   for p, q in zip(step.model.parameters(), reference))


def measure(name, optimizer, systems=SYSTEMS, rounds=7, budget_s=0.2) -> TrainRow:
    """One TrainRow: every system warmed up, checked against eager, counted, then timed in rounds."""
    import torch

    from ..install import install_once
    from ..target import runtime_threads

    install_once()
    torch.set_num_threads(runtime_threads())
    torch._dynamo.reset()
    row = TrainRow(name, optimizer)
    steps, target, reference = {}, None, None
    for s in ("torch",) + tuple(x for x in systems if x != "torch"):
        steps[s] = Step(s, name, optimizer, target)
        target = steps[s].target
        row.compile_s[s], model_w, opt_w = _warm_up(steps[s])
        if reference is None:  # eager's parameters after the warm-up steps (counting runs one more)
            reference = [p.detach().clone() for p in steps[s].model.parameters()]
        row.ok[s] = _params_close(steps[s], reference)
        _count(row, s, steps[s], model_w, opt_w)
    if "torch" not in systems:
        for d in (row.compile_s, row.ok, row.parts, row.launches):
            d.pop("torch")
        steps.pop("torch")
    order = list(steps)
    row.opt_bytes = _update_bytes(steps[order[0]].opt)
    samples, opt = {s: [] for s in steps}, {s: [] for s in steps}
    for i in range(rounds):
        for s in order[i % len(order):] + order[: i % len(order)]:
            samples[s].append(_time(steps[s].step, budget_s))
            opt[s].append(_time(steps[s].opt_step, budget_s / 4))
    row.ms = {s: statistics.median(v) * 1e3 for s, v in samples.items()}
    row.opt_ms = {s: statistics.median(v) * 1e3 for s, v in opt.items()}
    row.samples = {s: len(v) for s, v in samples.items()}
    return row


def _update_bytes(opt) -> int:
    """The least bytes an optimizer step moves: each parameter with a gradient read, with its
    gradient and its state tensors of the parameter's shape (SGD's momentum, AdamW's two moments;
    not a scalar step count), and the parameter and that state written: (3 + 2k) x its bytes."""
    total = 0
    for group in opt.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            k = sum(1 for v in opt.state.get(p, {}).values() if hasattr(v, "shape") and v.shape == p.shape)
            total += (3 + 2 * k) * p.numel() * p.element_size()
    return total


def table(rows, systems) -> str:
    """The markdown table: ms per step, launches per step, tvmfuse's bytes, and the ratio to Inductor."""
    head = ["workload", "optimizer"] + [f"{s} ms" for s in systems] + [f"{s} launches" for s in systems]
    head += ["tvmfuse MB/step", "tvmfuse vs torch.compile", "optimizer step ms: " + " / ".join(systems),
             "optimizer bytes bound ms", "tvmfuse optimizer / bound", "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.workload, r.optimizer] + [f"{r.ms[s]:.3f}" if s in r.ms else "-" for s in systems]
        cells += [str(r.launches.get(s, "-")) for s in systems]
        ratio = r.ratio("tvmfuse", "torch.compile")
        cells += [f"{r.bytes['tvmfuse'] / 1e6:.2f}" if "tvmfuse" in r.bytes else "-", f"{ratio:.2f}x" if ratio else "-",
                  " / ".join(f"{r.opt_ms[s]:.3f}" if s in r.opt_ms else "-" for s in systems),
                  f"{r.bound_ms:.3f}" if r.bound_ms else "-",
                  f"{r.opt_ms['tvmfuse'] / r.bound_ms:.2f}x" if r.bound_ms and "tvmfuse" in r.opt_ms else "-",
                  "yes" if all(r.ok.values()) else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    ratios = [r.ratio("tvmfuse", "torch.compile") for r in rows]
    ratios = [x for x in ratios if x]
    if ratios:
        lines.append(f"\ngeometric mean, tvmfuse vs torch.compile (step time, >1: tvmfuse faster): "
                     f"{geomean(ratios):.2f}x over {len(ratios)} rows")
    return "\n".join(lines)


def run(args) -> int:
    """scripts/bench.py --train: --workloads (default all three), --optimizers, --systems, --rounds,
    --budget, --quick (3 rounds of 0.02 s, SGD only unless --optimizers), --json, --markdown."""
    import json
    import sys

    from ..runtime import machine
    from ..target import runtime_threads

    names = list(train_models.MODELS) if args.workloads in ("all", None) else \
        [n.strip() for n in args.workloads.split(",") if n.strip()]
    systems = list(SYSTEMS) if not args.systems else [s.strip() for s in args.systems.split(",") if s.strip()]
    optimizers = args.optimizers.split(",") if args.optimizers else (["sgd"] if args.quick else
                                                                     list(train_models.OPTIMIZERS))
    bad = ([f"workload {n!r}" for n in names if n not in train_models.MODELS]
           + [f"system {s!r}" for s in systems if s not in SYSTEMS]
           + [f"optimizer {o!r}" for o in optimizers if o not in train_models.OPTIMIZERS])
    if bad:
        print(f"error: --train: unknown {', '.join(bad)}; workloads {', '.join(train_models.MODELS)}, systems "
              f"{', '.join(SYSTEMS)}, optimizers {', '.join(train_models.OPTIMIZERS)}", file=sys.stderr)
        return 2
    if args.quick:
        args.rounds, args.budget = 3, 0.02
    t0 = time.time()
    rows = [measure(n, o, systems, args.rounds, args.budget) for n in names for o in optimizers]
    from ..runtime.roofline import bandwidth_gbs

    bandwidth = max(bandwidth_gbs().values())  # GB/s, the faster of numpy's add and a TVM triad
    for r in rows:
        r.bound_ms = r.opt_bytes / bandwidth / 1e6
    record = machine.record("llvm")
    timing = f"{runtime_threads()} threads for every system"
    header = (f"training step (forward, backward, optimizer), {timing}, {args.rounds} rounds x {args.budget}s "
              f"per system, {time.time() - t0:.0f}s in all; memory bandwidth {bandwidth:.1f} GB/s (the optimizer "
              f"step's bound: its least bytes over it)\n\n{machine.describe(record)}")
    text = table(rows, systems)
    notes = sorted({f"{s}: {n}" for r in rows for s, n in r.notes.items()})
    text += "".join(f"\n- {n}" for n in notes)
    print(header + "\n\n" + text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "mode": "train", "timing": timing, "rounds": args.rounds,
                       "budget_s": args.budget, "machine": record, "rows": [r.as_dict() for r in rows]}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n" + text + "\n")
    wrong = [f"{r.workload}/{r.optimizer}" for r in rows if not all(r.ok.values())]
    if wrong:
        print(f"error: parameters differ from eager PyTorch's on {wrong}", file=sys.stderr)
        return 1
    return 0
