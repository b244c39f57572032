"""`scripts/bench.py` and `tvmfuse bench`: the command line of the side-by-side benchmark.

Benchmark the zoo side by side: no fusion and TVM's stock FuseOps (both on tvmfuse's schedules),
vanilla TVM (relax.build with TVM's default pipeline and dlight, untouched by tvmfuse), tvmfuse
(untuned, and tuned with --logs), ONNX Runtime, PyTorch eager, torch.compile in its default mode
and with freezing, and numpy, all measured in one run with the systems interleaved round by round
and the same thread count for all. The header and the JSON carry the machine record (CPU, mcpu,
cores, caches, commit, library versions: tvmfuse/runtime/machine.py). Prints the table (median ms
per call, launches, ratios, numerics checked against numpy), the geometric means, and the
roofline: memory bandwidth and matmul throughput measured in the same run, each memory-bound
workload's latency as a multiple of its bandwidth bound, GFLOP/s of the compute-heavy ones.
--quick: small shapes, few rounds, no roofline (a smoke run).
--train: one training step per system (tvmfuse/bench/train.py).
--dtype float16|bfloat16: TVM systems built in that type (build's dtype=), torch peers run in it,
the numerics held to cast_to_half.HALF_TOLERANCE against the float32 reference.
--target cuda: the same on tvm.cuda(0) (see tvmfuse/bench/gpu.py): an L2 flush before every timed
call, medians of single calls, launches counted while running next to the static count, peers on
the GPU where their runtime has CUDA (else skipped, with the reason). Without a GPU it stops at
once with exit code 3.
"""
from __future__ import annotations

import json
import os
import sys
import time


def quiet_runtimes():
    """Several runtimes share the process and its cores: each may spin only briefly between its
    own calls, then sleep, or its idle workers steal the cores from the system timed next (PyTorch
    eager measured 40 ms instead of 0.5 ms next to TVM's default spin). TVM: tvmfuse's bounded
    spin (target.bound_spinning, set up with the thread count by install_once, which every build
    also calls; called here so the benchmark states its policy in one place).
    ONNX Runtime: allow_spinning=0 (bench/baselines.py; alone on MobileNetV2 it measured 4.63 ms so,
    6.48 ms spinning). PyTorch runs with libgomp's defaults: libgomp reads its environment when
    torch loads, which `import tvm` has done by now (tvm_ffi imports torch where it is installed;
    OMP_WAIT_POLICY=PASSIVE, set here before, never took effect; set in the shell, it made PyTorch
    eager 2.2x slower on MobileNetV2)."""
    from ..install import install_once

    install_once()


def add_arguments(ap):
    from . import core as bench
    from ..zoo import workloads

    from ..zoo import models

    ap.add_argument("--workloads", default="all",
                    help=f"comma-separated names, or all (the zoo), memory (its memory-bound part), models (the "
                         f"full-size real models), tiny-models or everything. "
                         f"Zoo: {', '.join(workloads.names())}. Models: {', '.join(models.names())}")
    ap.add_argument("--size", default="bench", choices=workloads.SIZES)
    ap.add_argument("--target", default="llvm", choices=("llvm", "cuda"),
                    help="llvm: this CPU; cuda: tvm.cuda(0) (needs a GPU)")
    ap.add_argument("--arch", default="sm_90", help="CUDA architecture to compile for (with --target cuda)")
    ap.add_argument("--systems", default=None,
                    help=f"comma-separated systems (default: {','.join(bench.SYSTEMS)}; "
                         f"{bench.BACKEND} only when a real model is among the workloads)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                    help="compute in this type: TVM systems through build(dtype=), torch in it; systems with no "
                         "such form are skipped with the reason; numerics against the float32 reference")
    ap.add_argument("--batch", default="1",
                    help="comma-separated batch sizes for the real models (e.g. 1,8): one row per model and batch")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (median reported)")
    ap.add_argument("--budget", type=float, default=0.2, help="seconds of calls per system per round")
    ap.add_argument("--logs", metavar="DIR", help="tuning logs: adds the tvm+tuned and tvmfuse+tuned systems")
    ap.add_argument("--no-roofline", action="store_true", help="skip the bandwidth/peak measurements")
    ap.add_argument("--quick", action="store_true", help="small shapes, 3 rounds of 0.02 s, no roofline")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="write the table as markdown")
    ap.add_argument("--dynamic", action="store_true",
                    help="BERT with a symbolic sequence, built once, at 16, 64, 128 and 384 tokens against "
                         "the static builds and torch.compile(dynamic=True) (tvmfuse/bench/dynamic.py; "
                         "--workloads bert-tiny for the small config)")
    ap.add_argument("--train", action="store_true",
                    help="one training step (forward, backward, optimizer) per system: eager PyTorch, torch.compile "
                         "(Inductor) and torch.compile(backend='tvmfuse') (tvmfuse/bench/train.py; workloads "
                         "mlp, bert-small, resnet-tiny; --systems torch,torch.compile,tvmfuse)")
    ap.add_argument("--optimizers", default=None, help="with --train: sgd, adamw (default both; --quick: sgd)")


def _dynamic(args):
    from . import dynamic as bench_dynamic

    argv = ["--model", "bert-tiny" if args.workloads == "bert-tiny" else "bert-base", "--rounds", str(args.rounds)]
    argv += ["--json", args.json] if args.json else []
    argv += ["--markdown", args.markdown] if args.markdown else []
    return bench_dynamic.main(argv)


def _selection(args):
    """(systems, workload names) the arguments ask for; TvmfuseError for an unknown system or
    workload or a --logs that is not a folder."""
    from . import core as bench
    from ..zoo import models, workloads
    from ..errors import TvmfuseError

    default = args.systems is None
    systems = list(bench.SYSTEMS) if default else [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.logs:
        systems += [s for s in bench.TUNED if s not in systems]
    bad = [s for s in systems if s not in bench.SYSTEMS + bench.TUNED]
    tiny = [m for m in models.names() if m not in models.FULL_SIZE]
    groups = {"all": workloads.names(), "models": list(models.FULL_SIZE), "tiny-models": tiny,
              "everything": workloads.names() + models.names(), "memory": workloads.memory_bound_names()}
    names = groups.get(args.workloads) or [n.strip() for n in args.workloads.split(",")]
    if bad:
        raise TvmfuseError(f"unknown system(s) {bad}; use some of {', '.join(bench.SYSTEMS + bench.TUNED)}")
    if args.logs and not os.path.isdir(args.logs):
        raise TvmfuseError(f"--logs {args.logs!r} is not a folder; tune first (scripts/tune.py --trials N --logs DIR)")
    for n in names:
        if n not in models.names():
            workloads.get(n, args.size)
    if default and not any(n in models.names() for n in names):  # the zoo has no torch module to compile
        systems.remove(bench.BACKEND)
    return systems, names


def _jobs(names, batches: str) -> list[tuple[int, str]]:
    """[(batch, workload)]: every workload at batch 1, and each real model at every batch asked;
    TvmfuseError for a batch that is not a whole number of 1 or more, or a batch > 1 with no real
    model to take it."""
    from ..errors import TvmfuseError
    from ..zoo import models

    try:
        sizes = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise TvmfuseError(f"--batch {batches!r}: give whole numbers of 1 or more, comma-separated (e.g. 1,8)")
    real = [n for n in names if n in models.names()]
    fixed = [n for n in names if n not in real]
    if 1 not in sizes and fixed:
        raise TvmfuseError(f"--batch {batches}: only the real models ({', '.join(models.names())}) take a batch; "
                           f"{', '.join(fixed)} bring their own shapes (add 1 to the list to run them as they are)")
    return [(b, n) for b in sizes for n in names if b == 1 or n in real]


def _write(args, header, table, target, timing, rows, record):
    """The table on stdout; --json (the rows and the machine record) and --markdown files."""
    print(header + "\n\n" + table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "target": str(target), "timing": timing, "size": args.size,
                       "rounds": args.rounds, "dtype": getattr(args, "dtype", "float32"), "machine": record, "rows": [r.as_dict() for r in rows]}, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n" + table + "\n")


def run(args):
    quiet_runtimes()
    if getattr(args, "dynamic", False):
        return _dynamic(args)
    if getattr(args, "train", False):
        from . import train

        return train.run(args)
    from tqdm import tqdm

    from . import core as bench
    from ..runtime import machine
    from ..errors import TvmfuseError
    from ..target import resolve, runtime_threads

    gpu = args.target == "cuda"
    if gpu:
        from .gpu import NO_GPU_EXIT, no_gpu_reason

        reason = no_gpu_reason()
        if reason:  # before minutes of building
            print(f"error: --target cuda: {reason}; run it on a machine with a GPU, or use --target llvm",
                  file=sys.stderr)
            return NO_GPU_EXIT
    if args.quick:
        args.size, args.rounds, args.budget, args.no_roofline = "small", 3, 0.02, True
    try:
        systems, names = _selection(args)
        jobs = _jobs(names, getattr(args, "batch", "1"))
        target = resolve(args.target, arch=args.arch)  # once, for every workload
    except TvmfuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    t0 = time.time()
    rows = []
    for batch, name in tqdm(jobs, desc="workloads", unit="wl", file=sys.stderr):
        rows.append(bench.measure_workload(name, args.size, systems, args.rounds, args.budget, target,
                                           args.logs, args.arch, getattr(args, "dtype", "float32"), batch))
    table = bench.summary(rows, systems)
    if not args.no_roofline and not gpu:  # the roofline measures this CPU
        from ..runtime import roofline

        table += "\n\n" + bench.roofline_table(rows, args.size, systems, roofline.bandwidth_gbs(),
                                               roofline.matmul_peak_gflops(), roofline.last_level_cache_bytes())
    if gpu:
        from .gpu import describe_timing

        timing = describe_timing(args.arch)
    else:
        timing = f"{runtime_threads()} threads for every system"
    record = machine.record(target)
    dtype = getattr(args, "dtype", "float32")
    header = (f"target {target}, {timing}, {args.size} shapes, {dtype}, {args.rounds} rounds x {args.budget}s per system, "
              f"{time.time() - t0:.0f}s in all\n\n{machine.describe(record)}")
    _write(args, header, table, target, timing, rows, record)
    wrong = [r.workload for r in rows if not all(r.ok.values())]
    if wrong:
        print(f"error: outputs differ from the reference on {wrong}", file=sys.stderr)
        return 1
    return 0
