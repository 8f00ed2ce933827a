"""Tuning in the model: each conv's candidate schedules judged by the time of the whole model.

`tune` grid-searches the schedule of every distinct conv2d_nhwc_ohwi conv of a model
(`topi_accel.conv2d_candidates`: the heuristic's config first). A kernel timed alone, called
again and again, finds its input, weights and output in caches the model does not leave them
in, and the winners of such timing made whole models slower (README, Tuning); a kernel timed
inside the model misses what its config costs the kernels after it (which core wrote which
part of its output, what it left in the caches). So a candidate is judged by the time of the
whole model, the one thing TVM's time_evaluator measures on a remote device too:

- the baseline is the model as the database stands when the tune starts (the heuristic's
  config for every conv it does not hold); candidate k of conv g is the baseline with g's
  config replaced by its k-th: one build each;
- a measurement loads the baseline and one candidate on one device and times them in turns,
  ROUNDS turns of `number` runs of main each (`timing.time_libraries`); it gives the
  candidate's time over the baseline's as the median of the turns' ratios
  (`timing.speedups`): two turns back to back meet the device in the same state, and the
  servers of one key need not be equally fast;
- a conv keeps its fastest candidate if that made the whole model MARGIN faster, else the
  heuristic's config. The database records the decision, and the model's time with it, as
  soon as the last of the conv's candidates is measured: an interrupted tune, run again,
  goes on with the convs the database does not hold, against a baseline that has the
  configs decided before.

Every candidate is judged against the same baseline, not against other convs' winners, so
the candidates are independent: they are built in `parallel` processes (a build is Python
and LLVM on one core) and, on a remote device, measured on every server of its key at once,
one measurement per server (`_Farm`). A server that dies or does not answer within
`timeout` seconds costs that measurement another try on the next server the tracker gives
(ATTEMPTS tries in all). On the host, each conv's candidates are measured after they are
all built, one at a time, so that no build runs while the host times.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import queue
import tempfile
import threading
from functools import partial

import numpy as np
import tvm
from tvm import relax

import strategy.conv2d
import topi_accel
from strategy import select
from strategy.layout import static_shape

from ..compiler import build, graph_module
from ..reporting import calls_of
from ..runtime.deploy import save
from ..runtime.executable import lift_weights
from ..runtime.remote import Device, NoFreeDevice
from .timing import speedups, time_libraries

# turns the baseline and a candidate each take in a measurement; the fraction of the whole
# model's time a candidate must save to be kept
ROUNDS = 5
MARGIN = 0.01
# seconds a measurement on a remote device may take (session included) before it is tried
# again on another server, and the tries it gets
TIMEOUT = 300.0
ATTEMPTS = 3


def _family(geo: topi_accel.Conv2DGeometry) -> str:
    if geo.groups > 1:
        return "grouped"
    return "pointwise" if geo.kh == geo.kw == 1 else "spatial"


def _describe(geo: topi_accel.Conv2DGeometry) -> str:
    grouped = f", {geo.groups} groups" if geo.groups > 1 else ""
    return f"{geo.in_h}x{geo.in_w}x{geo.in_c}->{geo.out_c} {geo.kh}x{geo.kw}/{geo.stride[0]}{grouped}"


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"


def _direct_convs_of(graph: tvm.IRModule, target: tvm.target.Target) -> list:
    with target:
        direct = [
            c
            for c in calls_of(graph, ("relax.nn.conv2d",))
            if getattr(select(c, target.keys)[0], "name", None) == "conv2d_nhwc_ohwi.accel"
        ]
        return list(dict.fromkeys(strategy.conv2d.geometry_of(c) for c in direct))


def direct_convs(mod: tvm.IRModule, params, target: tvm.target.Target, input_layout=None) -> list:
    """The distinct geometries of the convs of `mod` that conv2d_nhwc_ohwi runs, in the
    model's order (conv2d_winograd's have nothing to tune)."""
    return _direct_convs_of(graph_module(mod, params, target, input_layout), target)


def choose(ratios: dict[int, float], margin: float = MARGIN) -> int:
    """The candidate to keep from {candidate index: the model's time with it / the
    baseline's}: the fastest, if it saves `margin` of the time; else 0, the heuristic's."""
    best = min(ratios, key=ratios.get, default=0)
    return best if ratios.get(best, 1.0) < 1 - margin else 0


def _plan(mod, target, input_layout, database, limit) -> tuple[list, dict, dict]:
    """(convs to tune, {conv: database key}, {conv: its candidates}); a ValueError for a model
    of symbolic input shapes (the measurements run it on random inputs)."""
    graph = graph_module(mod, None, target, input_layout)
    symbolic = [p.name for p in graph["main"].params if static_shape(p) is None]
    if symbolic:
        raise ValueError(f"tune times the model on random inputs: inputs {symbolic} have symbolic shapes")
    geometries = _direct_convs_of(graph, target)
    with target:
        key = {g: topi_accel.conv2d_key(g, target) for g in geometries}
        todo = [g for g in geometries if database.get(key[g]) is None]
        candidates = {g: topi_accel.conv2d_candidates(g, target)[: max(limit, 1) if limit else None] for g in todo}
    return todo, key, candidates


# --- builds --------------------------------------------------------------------------------

# in a build process only: (module, target, input_layout, cc), set once by _start_worker
_WORKER: dict = {}


def _build_library(mod, target, input_layout, cc, directory: str, name: str, entries: dict) -> str:
    """The model built with the tuning database `entries`, saved as DIRECTORY/NAME.so (with
    its weights beside it); returns the library's path."""
    db = os.path.join(directory, f"{name}.tuning.json")
    with open(db, "w") as f:
        json.dump(entries, f)
    executable = build(mod, target=target, input_layout=input_layout, tuning_db=db, weights="separate")
    library = os.path.join(directory, f"{name}.so")
    save(executable, library, cc=cc)
    return library


def _read_back(script: str, weights, num_input: bool) -> tvm.IRModule:
    """The module `_portable` wrote: `script` parsed, its weight parameters bound to `weights`
    (a dict, or the file of them), main's "num_input" kept only if the module had it."""
    if isinstance(weights, str):
        weights = dict(tvm.runtime.load_param_dict_from_file(weights))
    mod = relax.transform.BindParams("main", weights)(tvm.script.from_source(script))
    if not num_input:
        mod["main"] = mod["main"].without_attr("num_input")
    return mod


def _start_worker(script: str, weights: str, num_input: bool, target: str, input_layout, cc) -> None:
    _WORKER["args"] = (_read_back(script, weights, num_input), target, input_layout, cc)


def _build_in_worker(directory: str, name: str, entries: dict) -> str:
    return _build_library(*_WORKER["args"], directory, name, entries)


def _portable(mod: tvm.IRModule, directory: str) -> tuple[str, str, bool] | None:
    """(TVMScript of `mod` with its constants made parameters, the file of their values,
    whether main has "num_input"): the model as a build process reads it back (`_read_back`;
    not tvm.ir.save_json, which crashes in the TVM release this builds on). None when it does
    not read back as the same module."""
    lifted, values = lift_weights(mod)
    weights = {f"w{i}": v for i, v in enumerate(values)}
    script = lifted.script(show_meta=False)
    num_input = mod["main"].attrs is not None and "num_input" in mod["main"].attrs
    if "metadata[" in script or set(weights) & {p.name for p in mod["main"].params}:
        return None
    try:
        tvm.ir.assert_structural_equal(_read_back(script, weights, num_input), mod)
    except Exception:  # noqa: BLE001 - any way the text fails to read back
        return None
    path = os.path.join(directory, "model.params")
    tvm.runtime.save_param_dict_to_file(weights, path)
    return script, path, num_input


def _bound(mod: tvm.IRModule, params) -> tvm.IRModule:
    """`mod` with `params` bound as constants, as `build` binds them."""
    if not params:
        return mod
    tensors = {k: v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v) for k, v in params.items()}
    mod = relax.transform.BindParams("main", tensors)(mod)
    if mod["main"].attrs is not None and "num_input" in mod["main"].attrs:  # every parameter left is an input
        mod["main"] = mod["main"].without_attr("num_input")
    return mod


def _builder(mod, target, input_layout, cc, directory: str, parallel: int, say):
    """(executor, build(name, entries) -> Future of a library path): `parallel` build
    processes, or one build at a time in a thread of this process."""
    args = (mod, str(target), input_layout, cc)
    portable = _portable(mod, directory) if parallel > 1 else None
    if parallel > 1 and portable is None:
        say("the model does not read back from TVMScript: building in this process, one build at a time")
    if portable is None:
        executor = concurrent.futures.ThreadPoolExecutor(1)
        return executor, lambda name, entries: executor.submit(_build_library, *args, directory, name, entries)
    executor = concurrent.futures.ProcessPoolExecutor(
        parallel, multiprocessing.get_context("spawn"), _start_worker, (*portable, *args[1:])
    )
    return executor, lambda name, entries: executor.submit(_build_in_worker, directory, name, entries)


def _remove_library(library: str) -> None:
    for path in (library, library + ".json", library + ".params"):
        if os.path.exists(path):
            os.remove(path)


# --- measurements --------------------------------------------------------------------------


@dataclasses.dataclass
class _Job:
    """A measurement: conv `conv`'s candidate `index` against the baseline (index 0, the
    heuristic's config: the baseline timed alone, for a conv that has no other candidate)."""

    conv: object
    index: int
    builds: dict  # {"baseline": Future, "candidate": Future} of library paths
    attempts: int = 0

    def libraries(self) -> dict[str, str]:
        return {name: future.result() for name, future in self.builds.items()}

    def __str__(self) -> str:
        return f"conv2d {_describe(self.conv)} candidate {self.index + 1}"


class _Farm:
    """Measurements on the host, one at a time, or on every server of a remote device's key at
    once, one per server: a measurement that fails, or gets no answer within `timeout` seconds,
    is tried again (ATTEMPTS tries in all) on the server the tracker gives next."""

    def __init__(self, remote: Device | None, timeout: float, say):
        if remote is not None and not isinstance(remote, Device):
            raise TypeError(f"tune: remote is an accel_target.runtime.remote.Device, not {type(remote).__name__}")
        self.say = say
        self.timeout = timeout
        self.servers = 1
        self.device = remote
        if remote is not None:  # the server ends a session at the same deadline as we give up on it
            self.device = dataclasses.replace(remote, session_timeout=timeout, wait=2 * timeout)
            self.servers = remote.status()["registered"]
            if not self.servers:
                raise NoFreeDevice(
                    f"tune: no RPC server with key '{remote.key}' is registered at {remote.host}:{remote.port}"
                )

    def run(self, jobs: list[_Job], measure, done) -> None:
        """done(job, measure(job's libraries, session) or the error it ended with), for every job."""
        if self.device is None:
            ready = [job.libraries() for job in jobs]  # every build done before the host times
            for job, libraries in zip(jobs, ready):
                done(job, measure(libraries, None))
            return
        pending, lock, errors, left = queue.Queue(), threading.Lock(), [], [len(jobs)]

        def finish(job, result):
            with lock:
                try:
                    done(job, result)
                except Exception as err:  # noqa: BLE001 - raised in the calling thread below
                    errors.append(err)
                left[0] -= 1
                if left[0] == 0 or errors:
                    for _ in range(self.servers):
                        pending.put(None)

        for job in jobs:
            pending.put(job)
        workers = [
            threading.Thread(target=self._serve, args=(pending, measure, finish), daemon=True)
            for _ in range(self.servers if jobs else 0)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]

    def _serve(self, pending: queue.Queue, measure, finish) -> None:
        """A worker thread: measurements from `pending`, one at a time, until a None."""
        while (job := pending.get()) is not None:
            try:
                libraries = job.libraries()
            except Exception as err:  # noqa: BLE001 - a build that failed: no server's fault
                finish(job, err)
                continue
            try:
                result = self._attempt(libraries, measure)
            except Exception as err:  # noqa: BLE001 - a server that died, hung or is gone
                job.attempts += 1
                if job.attempts < ATTEMPTS:
                    self.say(f"{job}: {_one_line(err)}; trying again on another server")
                    pending.put(job)
                    continue
                result = err
            finish(job, result)

    def _attempt(self, libraries: dict, measure):
        """measure(libraries, a session on a free server), given up after `timeout` seconds."""
        box: dict = {}

        def call(session):
            try:
                box["result"] = measure(libraries, session)
            except BaseException as err:  # noqa: BLE001 - handed to the worker
                box["error"] = err

        # (a thread left behind on a hung server holds the session until the server ends it)
        thread = threading.Thread(target=call, args=(self.device.session(),), daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise TimeoutError(f"no answer from a server of {self.device} within {self.timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["result"]


# --- decisions -----------------------------------------------------------------------------


class _Decisions:
    """Each conv's measured candidates; its decision goes to the database as soon as the last
    of them is in (`choose`: the fastest if it saves MARGIN of the model's time)."""

    def __init__(self, database, key: dict, candidates: dict, say):
        self.database, self.key, self.candidates, self.say = database, key, candidates, say
        self.left = {g: max(len(c) - 1, 1) for g, c in candidates.items()}
        self.times: dict = {g: {} for g in candidates}  # conv -> index -> {name: [ms of each turn]}
        self.unmeasured: list = []

    def add(self, job: _Job, result) -> None:
        """`result`: `time_libraries`' times of the job's libraries, or the error it ended with."""
        if isinstance(result, BaseException):
            self.say(f"{job}: not measured ({_one_line(result)}); it is left out")
        else:
            self.times[job.conv][job.index] = result
        self.left[job.conv] -= 1
        if self.left[job.conv] == 0:
            self._decide(job.conv)

    def _decide(self, g) -> None:
        measured = self.times[g]
        if not measured:
            self.unmeasured.append(g)
            return
        ratios = {k: speedups(t, base="baseline").get("candidate", 1.0) for k, t in measured.items()}
        kept = choose(ratios)
        baseline = float(np.median([ms for t in measured.values() for ms in t["baseline"]]))
        ms = baseline if kept == 0 else float(np.median(measured[kept]["candidate"]))
        self.database.put(self.key[g], self.candidates[g][kept], ms)
        self.database.save()
        best = min(ratios, key=ratios.get)
        if kept:
            self.say(f"conv2d {_describe(g)}: candidate {kept + 1}, the model in {ratios[kept]:.3f} of the time")
        else:
            shown = f" (the best, candidate {best + 1}: {ratios[best]:.3f} of the time)" if best else ""
            self.say(f"conv2d {_describe(g)}: the heuristic's config{shown}")

    def check(self) -> None:
        if self.unmeasured:
            names = ", ".join(_describe(g) for g in self.unmeasured)
            raise RuntimeError(
                f"tune: no measurement of conv2d {names} succeeded; the database holds the rest: run tune again"
            )


def _measure(number: int, libraries: dict, session) -> dict:
    """A measurement's times (`timing.time_libraries`): ROUNDS turns of `number` runs each."""
    return time_libraries(libraries, session, number=number, rounds=ROUNDS)


def _jobs(batch: list, candidates: dict, key: dict, base: dict, baseline, submit) -> list[_Job]:
    """The measurements of the convs of `batch`, their candidates' builds submitted."""
    jobs = []
    for g in batch:
        if len(candidates[g]) == 1:
            jobs.append(_Job(g, 0, {"baseline": baseline}))
        for k, config in enumerate(candidates[g][1:], start=1):
            entries = {**base, key[g]: {"config": dataclasses.asdict(config), "ms": 0.0}}
            name = f"conv{list(candidates).index(g)}_candidate{k}"
            jobs.append(_Job(g, k, {"baseline": baseline, "candidate": submit(name, entries)}))
    return jobs


def tune(
    mod: tvm.IRModule,
    db,
    params=None,
    *,
    target="accel",
    input_layout=None,
    limit=None,
    number=5,
    progress=None,
    remote: Device | None = None,
    parallel: int = 1,
    timeout: float = TIMEOUT,
    cc: str | None = None,
):
    """Grid-search the schedule of every distinct conv2d_nhwc_ohwi conv of `mod`, judging each
    candidate by the whole model's time (module docstring); save the configs kept in `db`.

    db: path of the JSON tuning database (created, or extended: convs it holds are skipped,
        and every build takes their configs). Written after each conv's decision.
    limit: at most this many candidates per conv (the heuristic's config is always first).
    number: runs of main in each turn of a measurement.
    remote: measure on the servers of this accel_target.runtime.remote.Device, every free
        one at once (default: on this host); `target` and `cc` then name the device's CPU
        and its compiler, when it is not this host's.
    parallel: candidates built at once, each in a process of its own (spawned: a script that
        calls tune guards its own code with ``if __name__ == "__main__":``).
    timeout: seconds a remote measurement may take before it is tried on another server.
    Use the result with ``build(mod, tuning_db=db)``. Returns the TuningDB.
    """
    say = progress or (lambda message: None)
    target, mod = tvm.target.Target(target), _bound(mod, params)
    database = topi_accel.tuning.TuningDB(db)
    todo, key, candidates = _plan(mod, target, input_layout, database, limit)
    if not todo:
        say("no conv of the model is left to tune")
        return database
    farm = _Farm(remote, timeout, say)
    decisions = _Decisions(database, key, candidates, say)
    base = dict(database.entries)  # the baseline's, for every build of this tune

    def done(job: _Job, result) -> None:
        decisions.add(job, result)
        if "candidate" in job.builds and job.builds["candidate"].exception() is None:
            _remove_library(job.builds["candidate"].result())

    with tempfile.TemporaryDirectory(prefix="accel_tune_") as tmp:
        executor, submit = _builder(mod, target, input_layout, cc, tmp, parallel, say)
        try:
            baseline = submit("baseline", base)
            where = f"the servers of {remote}" if remote else "this host"
            say(f"{len(todo)} convs, {sum(decisions.left.values())} measurements against the baseline on {where}")
            for batch in [todo] if remote is not None else [[g] for g in todo]:
                farm.run(_jobs(batch, candidates, key, base, baseline, submit), partial(_measure, number), done)
        finally:  # (interrupted: the builds not started are not waited for)
            executor.shutdown(cancel_futures=True)
    decisions.check()
    return database
