"""`tvmfuse.tune`: tune the PrimFuncs of a fused module with MetaSchedule (XGBoost cost model).

Contract
- Tasks come from `tasks.extract` on the module after the variant's graph passes, so any fusion
  variant works and what is tuned is exactly what `tvmfuse.build(..., tuning_logs=...)` looks up.
- Records go to the durable database in `<logs>/<target key>/` (see database.py); a workload that
  another model already tuned is reused through its structural hash.
- Budget: `trials` (total over the tasks) and/or `time_budget` seconds, split over the tasks by
  weight = call sites x the default schedule's latency, so trials go where the time is spent.
  `resume=True` tops every task up to its share (a finished task costs nothing on a rerun, a task
  cut short continues from its records); `resume=False` adds the share on top of what is logged.
- Never slower: after a task is tuned, the best record and the default schedule are measured
  together with the tuning runner; the record is applied at build only if it wins (`tasks.json`).
- CUDA without a reachable GPU and without `rpc` fails fast (DeviceUnavailableError).
- Start-up: the build and runner worker processes start side by side and are kept for the next
  tune() call in the process (`release_workers()` ends them); an llvm target registers only the CPU
  tensor intrinsics (`register_tensor_intrins`), not the ~44 s import of all of them.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib
import importlib.util
import logging
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.ir.utils import derived_object

from ..errors import DeviceUnavailableError
from ..install import install_once
from ..target import resolve
from . import decisions, measure, rpc as rpc_mod, tasks as tasks_mod
from .database import DurableDatabase, mean_secs, workload_key
from .keys import target_dir

log = logging.getLogger("tvmfuse.tuning")

MARGIN = 0.03  # a tuned record must beat the default schedule by 3% to be applied (timing noise)


@dataclass
class TaskResult:
    name: str
    key: str
    weight: int
    trials_run: int = 0  # this call
    trials_total: int = 0  # budget satisfied so far
    default_ms: float | None = None
    tuned_ms: float | None = None
    use_tuned: bool = False
    skipped: str = ""  # why no tuning happened in this call ("finished", "time budget", ...)


@dataclass
class TuneResult:
    logs: str  # the target folder
    tasks: list[TaskResult] = field(default_factory=list)
    wall_s: float = 0.0

    def __str__(self):
        lines = [f"tuning logs: {self.logs} ({self.wall_s:.0f}s)",
                 f"{'task':44} {'w':>3} {'trials':>7} {'default ms':>11} {'tuned ms':>9}  applied"]
        for t in self.tasks:
            f = lambda v: "-" if v is None else f"{v:.4f}"
            lines.append(f"{t.name[:44]:44} {t.weight:>3} {t.trials_total:>7} {f(t.default_ms):>11} "
                         f"{f(t.tuned_ms):>9}  {'tuned' if t.use_tuned else 'default'}"
                         + (f" ({t.skipped})" if t.skipped else ""))
        return "\n".join(lines)


def tune(mod: tvm.IRModule, target="llvm", fusion: str = "tvmfuse", *, trials: int | None = 32,
         time_budget: float | None = None, logs: str = "tuning_logs", resume: bool = True,
         rpc: tuple[str, str] | None = None, num_trials_per_iter: int = 8, seed: int | None = 0,
         population_size: int = 256, progress: bool = True, name: str = "", knobs: dict | None = None,
         evaluator_config=None, recheck: bool = False, buckets: dict | None = None, dtype=None) -> TuneResult:
    """Tune `mod` under `fusion` for `target`; records go to `<logs>/<target key>/`.
    `recheck`: measure tuned vs default again for tasks that are already finished.
    `buckets`: as for `tvmfuse.build` (each bucket's static kernels are tasks with their own records;
    build with the same buckets and `tuning_logs` to apply them). `dtype`: as for `tvmfuse.build`."""
    t_start = time.time()
    install_once()  # before the worker processes start: they inherit TVM's thread settings
    target = resolve(target)
    _check_device(target, rpc)
    s = _Session(target, target_dir(logs, target), rpc, evaluator_config, num_trials_per_iter, seed,
                 population_size)
    tasks = tasks_mod.extract(tasks_mod.fused_module(mod, target, fusion, knobs, buckets, dtype))
    result = TuneResult(s.folder)
    if not tasks:
        return result
    s.start_workers()
    shares = s.shares(tasks)
    deadline = t_start + time_budget if time_budget else None
    bar = _bar(len(tasks), name or fusion, progress)
    order = sorted(range(len(tasks)), key=lambda i: -shares[i])
    for n_done, i in enumerate(order):
        want = _share(trials, shares[i]) if trials else (10**6 if time_budget else 0)
        left_time = None if deadline is None else (deadline - time.time()) * shares[i] / sum(
            shares[j] for j in order[n_done:])
        res = s.tune_task(tasks[i], want, resume, left_time, bar)
        result.tasks.append(res)
        bar.update(1)
    bar.close()
    s.decide([(tasks[i], r) for i, r in zip(order, result.tasks)
              if r.trials_run or r.key in s.undecided or (recheck and r.trials_total)])
    result.wall_s = time.time() - t_start
    return result


class _Session:
    """One tune() call: the database, builder, runner and per-task state of one target folder."""

    def __init__(self, target, folder, rpc, evaluator_config, per_iter, seed, population_size):
        self.target, self.folder, self.per_iter, self.seed = target, folder, per_iter, seed
        self.population_size = population_size
        self.db = DurableDatabase(folder)
        # one set of build workers for every round and both builders (LocalBuilder starts a fresh pool
        # per round: a worker start-up, i.e. an `import tvm` of ~6 s CPU, per round), kept for the
        # next tune() call in this process like the runner (see _shared_build_pool)
        self.build_pool = _shared_build_pool()
        self.builder = rpc_mod.builder(pool=self.build_pool)
        self.exact_builder = rpc_mod.builder(exact=True, pool=self.build_pool)
        self._runner_key = (evaluator_config or rpc_mod.evaluator(), rpc)
        self._runner = None
        self.state = decisions.load(folder)
        self.unsaved: set[str] = set()
        self.undecided: set[str] = set()  # finished by a run killed before it decided

    @property
    def runner(self):
        """Created on first use: its constructor starts a worker and waits for it (~6 s), which
        `start_workers` lets overlap with the build workers' start-up."""
        if self._runner is None:
            self._runner = _shared_runner(self._runner_key)
        return self._runner

    def start_workers(self) -> None:
        """Start the build workers in the background, then the runner's worker: the three start-ups
        (each an `import tvm`) run side by side instead of one after the other."""
        self.build_pool.start()
        self.runner  # noqa: B018 - creates it

    def shares(self, tasks) -> list[float]:
        """Share of the budget per task: call sites x the default's latency, measured once and stored
        so a rerun splits the budget the same way."""
        for t in tasks:
            t.key = workload_key(t.mod)
        for t in tasks:
            d = self.state.get(t.key)
            if d is not None and d.weight_ms is None and d.default_ms is not None:
                d.weight_ms = d.default_ms  # logs written before weight_ms existed
        missing = [t for t in tasks if t.key not in self.state or self.state[t.key].weight_ms is None]
        if missing:
            secs = measure.measure([measure.default_scheduled(t.source, self.target) for t in missing], self.target,
                                   self.exact_builder, self.runner)
            for t, sec in zip(missing, secs):
                d = self.state.get(t.key) or decisions.Decision(t.key, t.name, 0, None, None, False, str(self.target))
                d.weight_ms = d.default_ms = None if sec is None else sec * 1e3
                self.state[t.key] = d
                self.unsaved.add(t.key)
        weights = [t.weight * (self.state[t.key].weight_ms or 1.0) for t in tasks]
        return [w / sum(weights) for w in weights]

    def tune_task(self, t, want, resume, left_time, bar) -> TaskResult:
        d = self.state[t.key]
        done = max(d.trials, len(self.db.records_of(t.mod)))
        goal = want if resume else done + want
        res = TaskResult(t.name, t.key, t.weight, 0, done, d.default_ms, d.tuned_ms, d.use_tuned)
        if done >= goal or (left_time is not None and left_time <= 1):
            res.skipped = "finished" if done >= goal else "time budget"
            if d.tuned_ms is None and done > 0 and _best_ms(self.db, t.mod) is not None:
                self.undecided.add(t.key)
            elif t.key in self.unsaved:
                decisions.save(self.folder, d)
            return res
        deadline = None if left_time is None else time.time() + left_time
        cb = _Progress(bar, t.name, deadline, _best_ms(self.db, t.mod), goal - done)
        try:
            self.run_ms(t, goal - done, cb)
        except Exception as err:  # noqa: BLE001 - MetaSchedule bugs on one kernel must not stop the run
            log.debug("MetaSchedule failure on %s", t.name, exc_info=True)
            msg = str(err).strip().splitlines()
            log.warning("MetaSchedule failed on %s; it keeps its default schedule: %s", t.name,
                        next((ln for ln in msg if "Error" in ln), msg[0] if msg else type(err).__name__)[:300])
            res.skipped, res.trials_run = "MetaSchedule error", cb._inst.trials
            return res
        res.trials_run = cb._inst.trials
        # cut by the clock: continue next time; otherwise the budget (or the search space) is done
        res.trials_total = done + res.trials_run if cb._inst.stopped else goal
        d.trials, d.task, d.target, d.time = res.trials_total, t.name, str(self.target), ""
        return res

    def run_ms(self, task, n_trials, cb) -> None:
        strategy = ms.search_strategy.EvolutionarySearch(population_size=self.population_size,
                                                         init_min_unmeasured=min(50, self.population_size))
        cores = int(self.target.attrs.get("num-cores", 1)) if self.target.kind.name == "llvm" else 1
        register_tensor_intrins(self.target)  # before TuneContext, which would import all of them
        ctx = ms.TuneContext(mod=task.mod, target=self.target, space_generator="post-order-apply",
                             search_strategy=strategy, task_name=task.name,
                             logger=_task_logger(self.folder, task.name),
                             rand_state=-1 if self.seed is None else self.seed, num_threads=cores)
        ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=self.folder, max_trials_global=n_trials,
                      max_trials_per_task=n_trials, num_trials_per_iter=max(1, min(self.per_iter, n_trials)),
                      builder=self.builder, runner=self.runner, database=self.db, cost_model=_cost_model(),
                      measure_callbacks=list(ms.measure_callback.MeasureCallback.create("default")) + [cb],
                      task_scheduler="round-robin")

    def decide(self, pairs) -> None:
        """Never slower: each task's best record and its default schedule, measured by the same
        runner in one batch; the record is applied at build only if it wins. Saved to tasks.json."""
        mods = []
        for task, _ in pairs:
            sch = self.db.query_schedule(task.mod, target=self.target, workload_name="main")
            mods.append(sch.mod if sch is not None and _best_ms(self.db, task.mod) is not None else None)
            mods.append(measure.default_scheduled(task.source, self.target))
        secs = measure.measure(mods, self.target, self.exact_builder, self.runner) if pairs else []
        for k, (task, res) in enumerate(pairs):
            d, (tuned_s, default_s) = self.state[task.key], secs[2 * k: 2 * k + 2]
            if default_s is not None:
                d.default_ms = default_s * 1e3
            d.tuned_ms = None if tuned_s is None else tuned_s * 1e3
            d.use_tuned = tuned_s is not None and (default_s is None or tuned_s < default_s * (1 - MARGIN))
            res.default_ms, res.tuned_ms, res.use_tuned = d.default_ms, d.tuned_ms, d.use_tuned
            decisions.save(self.folder, d)


# Worker processes outlive a tune() call, so the next call in this process (the CLI tunes every
# workload x fusion variant in turn) reuses them instead of starting three again (~6 s CPU each).
# The build pool recycles a worker after BuildPool.max_uses builds; the runner is the one of the
# latest (evaluator config, rpc) pair. release_workers() ends them; so does the end of the process.
_BUILD_POOL = None
_RUNNER = None  # (key, runner)


def _shared_build_pool():
    global _BUILD_POOL
    if _BUILD_POOL is None:
        _end_at_exit()
        _BUILD_POOL = rpc_mod.BuildPool()
    return _BUILD_POOL


def _shared_runner(key):
    global _RUNNER
    if _RUNNER is None or _RUNNER[0] != key:
        _release_runner()
        _end_at_exit()
        _RUNNER = (key, rpc_mod.runner(*key))
    return _RUNNER[1]


def _release_runner():
    global _RUNNER
    if _RUNNER is not None:
        _RUNNER[1].pool.shutdown()
        _RUNNER = None


def release_workers() -> None:
    """End the build and runner worker processes tune() keeps for its next call."""
    global _BUILD_POOL
    if _BUILD_POOL is not None:
        _BUILD_POOL.close()
        _BUILD_POOL = None
    _release_runner()


def _end_at_exit() -> None:
    """The end of the process ends the workers: registered once, with a pool, not on import."""
    atexit.unregister(release_workers)
    atexit.register(release_workers)


def _cost_model():
    """MetaSchedule's XGBoost cost model ("xgb"), trained on one thread. tune_tasks would give it
    num_threads OpenMP threads, and on a busy machine (a shared 2-core box, builders and runners of
    other tuners) every boosting round then waits for a descheduled thread: 40-170 ms a round
    instead of 0.3 ms, several seconds per tuning round for a model of a few hundred rows (it is
    retrained from scratch on every update, at most ~60 rounds each with early stopping)."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    return ms.cost_model.XGBModel(config=XGBConfig(nthread=1), tree_method="auto")


_INTRIN_PKG = "tvm.s_tir.tensor_intrin"


def register_tensor_intrins(target) -> None:
    """Register the tensor intrinsics MetaSchedule's schedule rules for `target` may use, and only those.

    `ms.TuneContext` runs `import tvm.s_tir.tensor_intrin`, whose __init__ imports the CUDA, ROCm and
    Hexagon intrinsics as well: ~44 s on a 2-core box (cuda/rules.py alone 28 s), paid by every process that
    tunes. An llvm target's rules (x86 VNNI/AVX-512, ARM NEON/dotprod, RISC-V RVV) use only the CPU
    modules (~0.3 s on x86). So for llvm the package goes into sys.modules un-executed, with the CPU
    submodules imported; TuneContext's import then finds it. Any other target, or a later call for one,
    runs the package's real __init__ (a reload of the partial one), i.e. registers everything as before."""
    pkg = sys.modules.get(_INTRIN_PKG)
    partial = pkg is not None and getattr(pkg, "_tvmfuse_partial", False)
    if pkg is not None and not partial and hasattr(pkg, "cuda"):
        return  # fully imported already
    if target.kind.name != "llvm":
        if partial:
            pkg._tvmfuse_partial = False
            importlib.reload(pkg)  # the real __init__: cuda, rocm, hexagon, ... (the CPU ones are cached)
        else:
            importlib.import_module(_INTRIN_PKG)
        return
    if pkg is None:
        import tvm.s_tir

        spec = importlib.util.find_spec(_INTRIN_PKG)
        pkg = importlib.util.module_from_spec(spec)
        pkg._tvmfuse_partial = True
        sys.modules[_INTRIN_PKG] = pkg
        tvm.s_tir.tensor_intrin = pkg
    arch = (str(target.attrs.get("mtriple", "")) or platform.machine()).lower()
    subs = ["x86", "riscv_cpu"] + (["arm_cpu"] if arch.startswith(("arm", "aarch64")) else [])
    for sub in subs:
        importlib.import_module(f"{_INTRIN_PKG}.{sub}")


def _task_logger(folder: str, task_name: str) -> logging.Logger:
    """MetaSchedule's per-task log in `<folder>/logs/` (git-ignored). Not get_loggers_from_work_dir:
    it crashes ('NoneType' has no attribute 'format') when an unnamed handler sits on its logger."""
    folder_id = hashlib.sha1(os.path.abspath(folder).encode()).hexdigest()[:12]
    logger = logging.getLogger(f"tvmfuse.tuning.ms.{folder_id}.{task_name[:100]}")
    if not logger.handlers:
        os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
        handler = logging.FileHandler(os.path.join(folder, "logs", f"task_{task_name[:100]}.log"), delay=True)
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    return logger


def _share(trials: int, share: float) -> int:
    return max(min(2, trials), int(math.ceil(trials * share)))


def _best_ms(db, task_mod) -> float | None:
    recs = [mean_secs(r) for r in db.records_of(task_mod)]
    best = min(recs, default=1e10)
    return None if best >= 1e9 else best * 1e3


def _check_device(target, rpc) -> None:
    if target.kind.name == "cuda" and rpc is None and not tvm.cuda(0).exist:
        raise DeviceUnavailableError(
            "cannot tune for cuda: no GPU is reachable from this machine, and MetaSchedule must run every "
            "candidate on the device. Start `python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY` on a "
            "GPU host and pass --rpc-tracker HOST:PORT --rpc-key KEY (tvmfuse.tune(..., rpc=(addr, key))).")
    if rpc is not None:
        if rpc_mod.check_tracker(rpc) == 0:
            log.warning("no idle RPC server under key %r at %s right now; candidates will wait for one", rpc[1],
                        rpc[0])


def _fmt(v):
    return "-" if v is None else f"{v:.4f}"


def _bar(n, desc, enabled):
    import sys

    from tqdm import tqdm

    return tqdm(total=n, desc=f"tuning {desc}", unit="task", file=sys.stderr, disable=not enabled)


@derived_object
class _Progress(PyMeasureCallback):
    """Counts trials, shows the best latency so far on the bar, stops the task at its deadline."""

    def __init__(self, bar, name, deadline, best_ms, cap):
        super().__init__()
        self.bar, self.name, self.deadline, self.best, self.cap = bar, name, deadline, best_ms, cap
        self.trials, self.stopped = 0, False

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        self.trials += len(runner_results)
        for r in runner_results:
            if r.run_secs and not r.error_msg:
                ms_ = 1e3 * sum(float(s) for s in r.run_secs) / len(r.run_secs)
                self.best = ms_ if self.best is None else min(self.best, ms_)
        self.bar.set_postfix_str(f"{self.name[:24]} trials {self.trials} best {_fmt(self.best)} ms")
        # terminate only below the trial cap: at the cap MetaSchedule terminates the task itself,
        # and terminating twice is a fatal check in TaskScheduler::TerminateTask
        if (self.deadline is not None and time.time() >= self.deadline and not self.stopped
                and self.trials < self.cap):
            self.stopped = True
            task_scheduler.terminate_task(task_id)
