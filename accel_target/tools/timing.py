"""Timing contenders each in a process of its own, taking turns.

Thread pools that share a process (TVM's, accel's, PyTorch's OpenMP, ONNX Runtime's,
OpenBLAS's) spin on the same cores after their calls and steal each other's scheduler
quanta. So every
contender is timed in a process of its own (`TimingProcess`), which builds what it runs
once and then times it on request; `take_turns` asks the contenders in turn, round after
round, so that a noisy spell on a shared machine falls on all of them alike.

What a process runs is a runner spec, a JSON-able dict:

- ``{"kind": "accel", "path": LIB, "inputs": NPZ}``: a library written by
  `accel_target.save`, loaded with `accel_target.load` (accel's thread pool);
- ``{"kind": "tvm", "path": LIB, "inputs": NPZ}``: any Relax library (`export_library`),
  loaded by plain TVM, which keeps its own pool and its defaults;
- ``{"kind": "onnxruntime", "path": ONNX, "inputs": NPZ}``;
- ``{"kind": "torch", "path": PT, "inputs": NPZ}``: a ``torch.export.save`` program (.pt2)
  or a whole module saved by ``torch.save`` (eager PyTorch);
- ``{"kind": "call", "function": "module:name", "args": [...]}``: ``name(*args)`` returns
  the callable to time (the module is imported in the timing process: `TimingProcess`'s
  ``path`` puts it on ``sys.path``).

NPZ is a file written by `save_inputs`. This file runs as a script in the timing process
(``python timing.py``): it imports accel_target only for an ``accel`` runner, so the other
contenders' processes hold their own runtime alone.

`time_libraries` times saved libraries on one device instead, the host or a remote one
(`accel_target.runtime.remote`), with TVM's time_evaluator on the device's own clock: what
the tuner and ``accel-tvm bench --rpc`` measure with.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time

# Seconds a TimingProcess waits after each turn, so that the threads of its runtime have stopped
# spinning before the next turn, whoever's: TVM's pool spins for up to 300000 yields after a
# call (TVM_THREAD_POOL_SPIN_COUNT), OpenBLAS's threads 2^28 cycles (a tenth of a second at
# 2.5 GHz); a pause of a few spins' length left the next contender's turn slower.
PAUSE_S = 0.5
WARMUP_S = 0.2


def median_ms(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls of `fn`, in ms, after warming up (at least three
    calls and WARMUP_S seconds: the first calls of a fresh runtime fault in its memory and
    wake its threads)."""
    import numpy as np

    started, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - started < WARMUP_S:
        fn()
        calls += 1
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def save_inputs(path: str, arrays) -> str:
    """Write `arrays` (in order) for runner specs' ``inputs``; returns `path`."""
    import numpy as np

    np.savez(path, *arrays)
    return path


def threads_env(threads: int) -> dict[str, str]:
    """The environment that gives every runtime `threads` threads."""
    names = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    return {name: str(threads) for name in names}


# --- in the timing process -------------------------------------------------------------


def _arrays(spec: dict) -> list:
    import numpy as np

    with np.load(spec["inputs"]) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _accel(spec: dict, threads: int):
    import accel_target

    model = accel_target.load(spec["path"])
    args = [*model.check_inputs(_arrays(spec)), *model.weights]
    main = model.vm["main"]
    return lambda: main(*args)


def vm_runner(executable, arrays):
    """A callable running `executable`'s main once on `arrays`, in a VirtualMachine of its own."""
    import tvm
    from tvm import relax

    main = relax.VirtualMachine(executable, tvm.cpu())["main"]
    args = [tvm.runtime.tensor(a) for a in arrays]
    return lambda: main(*args)


def onnxruntime_runner(model, arrays, threads: int):
    """A callable running an ONNX model (a path or its bytes) once on `arrays`, `threads` threads."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    return lambda: session.run(None, feed)


def _tvm(spec: dict, threads: int):
    import tvm

    return vm_runner(tvm.runtime.load_module(spec["path"]), _arrays(spec))


def _onnxruntime(spec: dict, threads: int):
    return onnxruntime_runner(spec["path"], _arrays(spec), threads)


def _torch(spec: dict, threads: int):
    import torch

    torch.set_num_threads(threads)
    if spec["path"].endswith(".pt2"):
        module = torch.export.load(spec["path"]).module()
    else:
        module = torch.load(spec["path"], weights_only=False)
    tensors = [torch.from_numpy(a) for a in _arrays(spec)]

    def run():
        with torch.inference_mode():
            module(*tensors)

    return run


def _call(spec: dict, threads: int):
    module, name = spec["function"].split(":")
    return getattr(importlib.import_module(module), name)(*spec.get("args", []))


RUNNERS = {"accel": _accel, "tvm": _tvm, "onnxruntime": _onnxruntime, "torch": _torch, "call": _call}


def serve(threads: int) -> None:
    """Answer requests on stdin, one JSON line each ({"runner": spec, "repeat": N}), with
    {"ms": median} or {"error": text}; a runner is built on its first request."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the libraries print goes to stderr, not into the replies
    runners = {}
    for line in sys.stdin:
        request = json.loads(line)
        spec = request["runner"]
        try:
            key = json.dumps(spec, sort_keys=True)
            if key not in runners:
                runners[key] = RUNNERS[spec["kind"]](spec, threads)
            answer = {"ms": median_ms(runners[key], int(request["repeat"]))}
        except Exception as err:  # noqa: BLE001  (reported to the parent, which names the contender)
            lines = str(err).strip().splitlines()
            answer = {"error": f"{type(err).__name__}: {lines[-1] if lines else ''}"}
        reply.write(json.dumps(answer) + "\n")


# --- in the parent ---------------------------------------------------------------------


class TimingProcess:
    """A fresh Python process that times runner specs on request, with `threads` threads for
    every runtime; `path` entries go on its sys.path, `env` over the inherited environment."""

    def __init__(self, name: str, threads: int, path=(), env: dict | None = None):
        self.name = name
        environment = {**os.environ, **threads_env(threads), **(env or {})}
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        python_path = [*path, package_root]
        environment["PYTHONPATH"] = os.pathsep.join([*python_path, environment.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment,
            text=True,
        )

    def median_ms(self, spec: dict, repeat: int) -> float:
        """Median ms of `repeat` runs of `spec` in this process (built on first use); returns
        PAUSE_S after the runs."""
        self.process.stdin.write(json.dumps({"runner": spec, "repeat": repeat}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"timing {self.name}: its process exited with code {self.process.wait()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"timing {self.name}: {answer['error']}")
        time.sleep(PAUSE_S)
        return answer["ms"]

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait()
        self.process.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def turn_order(names: list[str], number: int) -> list[str]:
    """The contenders' turns in round `number` (from 0): `names` rotated left by `number`, and
    reversed in every other block of ``len(names)`` rounds. Every block gives each contender
    the first turn once; a block and the next give each contender's neighbours in both orders
    (for three contenders, six rounds are the six orders)."""
    start = number % len(names)
    order = names[start:] + names[:start]
    return order[::-1] if number // len(names) % 2 else order


def take_turns(
    specs: dict[str, dict], threads: int, repeat: int | dict, rounds: int, path=(), env=None
) -> dict[str, list[float]]:
    """{contender: [median ms of each round]}: every contender of `specs` in a process of its
    own, the contenders taking turns `rounds` times, `repeat` timed runs a turn (a dict:
    per contender). `env` maps a contender to extra environment variables for its process.
    The order changes from round to round (`turn_order`), so that no contender always
    follows the same one or always takes the first turn."""
    env = env or {}
    repeats = repeat if isinstance(repeat, dict) else dict.fromkeys(specs, repeat)
    processes = {name: TimingProcess(name, threads, path, env.get(name)) for name in specs}
    try:
        times = {name: [] for name in specs}
        for number in range(rounds):
            for name in turn_order(list(specs), number):
                times[name].append(processes[name].median_ms(specs[name], repeats[name]))
        return times
    finally:
        for process in processes.values():
            process.close()


def speedups(rounds: dict[str, list[float]], base: str = "accel") -> dict[str, float]:
    """{contender: median over rounds of its time / `base`'s in the same round} for
    `take_turns`' result: two turns back to back meet the same state of the machine, so a slow
    spell that spoils one contender's turn spoils one round's ratio, which the median drops."""
    ours = rounds[base]
    return {name: statistics.median(t / b for t, b in zip(times, ours)) for name, times in rounds.items()}


# --- on one device, the host or a remote one -------------------------------------------


def random_inputs(specs) -> list:
    """Random arrays for main's inputs (TensorSpecs of fixed shapes): floats from a normal
    distribution, integers (token ids, indices) as zeros, an index every table takes."""
    import numpy as np

    symbolic = [s.name for s in specs if s.shape is None or not all(isinstance(d, int) for d in s.shape)]
    if symbolic:
        raise ValueError(f"timing runs the model on random inputs: inputs {symbolic} have symbolic shapes")
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal(s.shape).astype(s.dtype) if "float" in s.dtype else np.zeros(s.shape, s.dtype)
        for s in specs
    ]


def time_libraries(
    libraries: dict[str, str], remote=None, *, number: int | dict, rounds: int
) -> dict[str, list[float]]:
    """{name: [ms of each round]} of the libraries `libraries` ({name: path written by
    `accel_target.save`}, models of the same inputs) on one device: the host, or `remote` (an
    accel_target.runtime.remote.Device or an RPC session: one session for them all). Each is
    loaded there with its weights, then they take turns (`turn_order`) `rounds` times, a turn
    the mean of `number` runs of main (a dict: per library) on the same random inputs, timed
    on the device's clock."""
    from ..runtime.deploy import load
    from ..runtime.remote import session_of

    session = None if remote is None else session_of(remote)
    models = {name: load(path, remote=session) for name, path in libraries.items()}
    arrays = random_inputs(next(iter(models.values())).inputs)
    inputs = {name: model.check_inputs(arrays) for name, model in models.items()}
    numbers = number if isinstance(number, dict) else dict.fromkeys(models, number)
    times: dict[str, list[float]] = {name: [] for name in models}
    for turn in range(rounds):
        for name in turn_order(list(models), turn):
            times[name].append(models[name].time_ms(*inputs[name], number=numbers[name]))
    return times


if __name__ == "__main__":
    del sys.path[0]  # this file's folder: accel_target's modules must not pass for top-level ones
    serve(int(sys.argv[1]))
