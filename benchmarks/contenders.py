"""What each contender runs: a benchmark case built (once, into a cache) and loaded in the
contender's own process.

A `Case` is a PyTorch model with its example inputs. Every contender runs the same model on the
same inputs:

- ``accel``: ``accel_target.from_torch`` (or ``from_onnx`` of the QDQ file for an int8 case),
  ``accel_target.build`` (a CNN fed channels-last: ``input_layout="NHWC"``, and 4-D outputs
  returned NHWC), ``save``; timed after ``accel_target.load`` (accel's thread pool);
- ``tvm``: stock TVM, ``tvm.relax.frontend.torch.from_exported_program`` and
  ``tvm.compile(mod, target="llvm")``, in a process that never imports accel_target;
- ``torch``: eager PyTorch (a CNN and its input channels-last);
- ``inductor``: ``torch.compile(model)`` (the default backend), channels-last like ``torch``;
- ``accel-dynamo``: ``torch.compile(model, backend="accel")`` (accel_target/frontends/dynamo.py;
  skipped where that module is absent);
- ``onnxruntime``: an InferenceSession of ``torch.onnx.export``'s file (the QDQ file for int8).

Builds and exports are cached under ``~/.cache/accel_bench`` (``ACCEL_BENCH_CACHE``), one folder
per case, keyed by everything that makes them: the case's name and defining source, for accel
the sources of the accel_target / topi_accel / strategy it imported and the target, for stock
TVM its version and target. So the rounds of a run (and later runs) load what the first built.
The inputs and PyTorch's outputs are cached too: a contender's timing process runs no PyTorch
op unless PyTorch is the contender (an OpenMP pool left spinning would slow the others).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.append(ROOT)  # this checkout's tests/ (the models); --accel-root's packages come first
CONTENDERS = ("accel", "tvm", "torch", "inductor", "accel-dynamo", "onnxruntime")
CACHE = os.environ.get("ACCEL_BENCH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "accel_bench")
# largest relative difference from PyTorch's output that a float32 contender may show: a sanity
# check that every contender computes the same model (tests/ check accel's accuracy)
FLOAT_TOLERANCE = 1e-3
# environment variables that set the thread count of each runtime's pool
THREAD_VARIABLES = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class NotApplicable(Exception):
    """This contender cannot run this case (the test is skipped with the reason)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """A model to time: `make()` gives (torch.nn.Module in eval mode, tuple of input tensors),
    the same on every call (seeded).

    channels_last: a CNN, fed NHWC to the contenders that take it (accel, PyTorch, inductor).
    quantize: None for float32; for int8, the op types that ONNX Runtime's quantize_static
        quantizes (() for all of them): accel and ONNX Runtime then run that QDQ file.
    source: the file that defines `make` (its text is part of the cache key).
    """

    name: str
    make: Callable[[], tuple]
    channels_last: bool = False
    quantize: tuple[str, ...] | None = None
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Settings:
    threads: int = 2
    mcpu: str | None = None
    cache: str = CACHE


@dataclasses.dataclass
class Runner:
    """`fn` runs the model once (the timed call); `outputs()` runs it and returns its outputs as
    numpy arrays in the reference's layout; `info` goes into the results (extra_info)."""

    fn: Callable[[], object]
    outputs: Callable[[], list]
    info: dict


def threads_env(threads: int) -> dict[str, str]:
    """The environment that gives every runtime's pool `threads` threads."""
    return dict.fromkeys(THREAD_VARIABLES, str(threads))


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def case_dir(case: Case, settings: Settings) -> str:
    """The case's cache folder: its name and the sources that define it."""
    sources = [__file__] + ([case.source] if case.source else [])
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in case.name)
    return os.path.join(settings.cache, f"{safe}-{_digest(case.name, case.quantize, *map(_read, sources))}")


def _cached(path: str, make: Callable[[str], None]) -> str:
    """`path`, made by `make(scratch)` into a scratch folder renamed to `path` (atomic: a
    concurrent maker's result wins, ours is dropped) unless it exists."""
    if not os.path.isdir(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        scratch = f"{path}.tmp{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        os.makedirs(scratch)
        try:
            make(scratch)
            os.rename(scratch, path)
        except OSError:
            if not os.path.isdir(path):
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return path


# --- what every contender shares: inputs, reference outputs, ONNX files ------------------


def _write_data(case: Case, folder: str) -> None:
    import torch

    model, inputs = case.make()
    with torch.inference_mode():
        out = model(*inputs)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    np.savez(os.path.join(folder, "inputs.npz"), *[x.numpy() for x in inputs])
    np.savez(os.path.join(folder, "reference.npz"), *[o.numpy() for o in outs])


def _npz(path: str) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def data(case: Case, settings: Settings) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, PyTorch's outputs) of `case`, NCHW as PyTorch takes them."""
    folder = _cached(os.path.join(case_dir(case, settings), "data"), functools.partial(_write_data, case))
    return _npz(os.path.join(folder, "inputs.npz")), _npz(os.path.join(folder, "reference.npz"))


def _write_onnx(case: Case, folder: str) -> None:
    """model.onnx (float32) and, for an int8 case, qdq.onnx, quantized as a user would
    (tests/models/quantized_onnx.py: QDQ, per-channel int8 weights, uint8 activations)."""
    import pathlib

    import torch

    model, inputs = case.make()
    if case.quantize is None:
        names = [f"x{i}" for i in range(len(inputs))] if len(inputs) > 1 else ["x"]
        with torch.no_grad():
            torch.onnx.export(model, inputs, os.path.join(folder, "model.onnx"), dynamo=False, input_names=names)
        return
    from tests.models.quantized_onnx import quantized_onnx

    ops = {"op_types_to_quantize": list(case.quantize)} if case.quantize else {}
    qdq = quantized_onnx(model, tuple(inputs[0].shape), pathlib.Path(folder), count=4, **ops)
    os.replace(qdq, os.path.join(folder, "model.onnx"))


def onnx_file(case: Case, settings: Settings) -> str:
    """The ONNX file of `case`: torch.onnx.export's, or for an int8 case the QDQ file."""
    folder = _cached(os.path.join(case_dir(case, settings), "onnx"), functools.partial(_write_onnx, case))
    return os.path.join(folder, "model.onnx")


def _nhwc(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if a.ndim == 4 else a for a in arrays]


def _like(outputs: list[np.ndarray], reference: list[np.ndarray]) -> list[np.ndarray]:
    """`outputs` with each 4-D NHWC output back in its reference's NCHW layout."""
    nchw = [o.transpose(0, 3, 1, 2) if o.ndim == 4 else o for o in outputs]
    return [o if o.shape == r.shape else back for o, back, r in zip(outputs, nchw, reference)]


def _numpy_outputs(out) -> list[np.ndarray]:
    """A VM's, PyTorch's or ONNX Runtime's outputs as a list of numpy arrays."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o if isinstance(o, np.ndarray) else o.numpy() for o in out]


def max_rel_error(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest absolute difference from the reference over all outputs, relative to the
    reference's largest magnitude."""
    worst = 0.0
    for out, ref in zip(outputs, reference):
        scale = max(float(np.abs(ref).max()), 1e-30)
        worst = max(worst, float(np.abs(out.astype("float64") - ref).max()) / scale)
    return worst


# --- the contenders --------------------------------------------------------------------


@functools.cache
def accel_sources(root: str) -> str:
    """A digest of the accel code under `root` (its accel_target, topi_accel and strategy)."""
    files = []
    for package in ("accel_target", "topi_accel", "strategy"):
        for folder, _, names in os.walk(os.path.join(root, package)):
            files += [os.path.join(folder, n) for n in names if n.endswith((".py", ".c"))]
    return _digest(*[part for f in sorted(files) for part in (os.path.relpath(f, root), _read(f))])


def accel_target_of(mcpu: str | None):
    """accel's target: the host's tag, or for `mcpu` (haswell: AVX2 code) the tag with that CPU."""
    import tvm

    return tvm.target.Target({"tag": "accel", "mcpu": mcpu} if mcpu else "accel")


def _accel(case: Case, settings: Settings) -> Runner:
    import tvm

    import accel_target

    root = os.path.dirname(os.path.dirname(os.path.abspath(accel_target.__file__)))
    target = accel_target_of(settings.mcpu)
    key = _digest(accel_sources(root), str(target), tvm.__version__)
    inputs, reference = data(case, settings)
    layout = "NHWC" if case.channels_last else None
    # a CNN's image outputs channels-last too (a single conv: no layout transform at all)
    out_layout = layout if all(r.ndim == 4 for r in reference) else None
    built = {}

    def build(folder: str) -> None:
        started = time.perf_counter()
        if case.quantize is not None:
            mod = accel_target.from_onnx(onnx_file(case, settings))
        else:
            model, inputs = case.make()
            mod = accel_target.from_torch(model, inputs)
        executable = accel_target.build(mod, target=target, input_layout=layout, output_layout=out_layout)
        built["build_s"] = round(time.perf_counter() - started, 2)
        accel_target.save(executable, os.path.join(folder, "model.so"))

    folder = _cached(os.path.join(case_dir(case, settings), f"accel-{key}"), build)
    model = accel_target.load(os.path.join(folder, "model.so"))
    args = [*model.check_inputs(_nhwc(inputs) if case.channels_last else inputs), *model.weights]
    main = model.vm["main"]
    info = {"accel_root": root, "accel_sources": key, "target": str(target), "threads": accel_target.num_threads()}
    info.update(built, pool=model.pool)
    return Runner(lambda: main(*args), lambda: _like(_numpy_outputs(main(*args)), reference), info)


def _tvm(case: Case, settings: Settings) -> Runner:
    import tvm
    from tvm import relax

    if case.quantize is not None:
        raise NotApplicable("stock TVM is not timed on int8 models (its QDQ ops run in float)")
    target = tvm.target.Target({"kind": "llvm", "mcpu": settings.mcpu} if settings.mcpu else "llvm")
    built = {}

    def build(folder: str) -> None:
        import torch
        from tvm.relax.frontend.torch import from_exported_program

        started = time.perf_counter()
        model, inputs = case.make()
        with torch.no_grad():
            program = torch.export.export(model, inputs)
        tvm.compile(from_exported_program(program), target=target).export_library(os.path.join(folder, "model.so"))
        built["build_s"] = round(time.perf_counter() - started, 2)

    inputs, reference = data(case, settings)
    folder = _cached(os.path.join(case_dir(case, settings), f"tvm-{_digest(str(target), tvm.__version__)}"), build)
    main = relax.VirtualMachine(tvm.runtime.load_module(os.path.join(folder, "model.so")), tvm.cpu())["main"]
    args = [tvm.runtime.tensor(a) for a in inputs]
    info = {"target": str(target), "threads": os.environ.get("TVM_NUM_THREADS"), **built}
    return Runner(lambda: main(*args), lambda: _numpy_outputs(main(*args)), info)


def _torch_model(case: Case, settings: Settings, backend=None) -> Runner:
    """PyTorch eager (`backend` None), or torch.compile with `backend` ("inductor": the default)."""
    import torch

    if case.quantize is not None:
        raise NotApplicable("PyTorch runs the float32 models only (the int8 suite: accel against ONNX Runtime)")
    torch.set_num_threads(settings.threads)
    inputs, reference = data(case, settings)
    model, _ = case.make()
    tensors = [torch.from_numpy(a) for a in inputs]
    if case.channels_last:
        model = model.to(memory_format=torch.channels_last)
        tensors = [t.contiguous(memory_format=torch.channels_last) if t.ndim == 4 else t for t in tensors]
    if backend is not None:
        model = torch.compile(model, **({} if backend == "inductor" else {"backend": backend}))

    def run():
        with torch.inference_mode():
            return model(*tensors)

    def outputs():
        out = run()
        return [o.contiguous().numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]

    name = backend if backend is None or isinstance(backend, str) else getattr(backend, "__name__", "accel")
    info = {"threads": torch.get_num_threads(), "backend": name or "eager"}
    return Runner(run, outputs, info)


def _accel_dynamo(case: Case, settings: Settings) -> Runner:
    from torch._dynamo import list_backends

    if "accel" not in list_backends():
        raise NotApplicable("no torch.compile backend 'accel' (pip install -e . registers its entry point)")
    if settings.mcpu:
        raise NotApplicable("torch.compile(backend='accel') builds for the host; --mcpu cannot reach it")
    return _torch_model(case, settings, "accel")


def _onnxruntime(case: Case, settings: Settings) -> Runner:
    import onnxruntime

    inputs, reference = data(case, settings)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = settings.threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(onnx_file(case, settings), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    info = {"threads": settings.threads, "onnx": "qdq" if case.quantize is not None else "float"}
    return Runner(lambda: session.run(None, feed), lambda: session.run(None, feed), info)


MAKERS = {
    "accel": _accel,
    "tvm": _tvm,
    "torch": lambda case, settings: _torch_model(case, settings, None),
    "inductor": lambda case, settings: _torch_model(case, settings, "inductor"),
    "accel-dynamo": _accel_dynamo,
    "onnxruntime": _onnxruntime,
}


def runner(contender: str, case: Case, settings: Settings) -> Runner:
    """`contender`'s Runner for `case`, built or loaded in this process (NotApplicable where the
    contender does not run such a case)."""
    if contender not in MAKERS:
        raise ValueError(f"unknown contender {contender!r}; the contenders: {', '.join(CONTENDERS)}")
    return MAKERS[contender](case, settings)


def check(run: Runner, case: Case, settings: Settings) -> float:
    """Run once, compare with PyTorch's outputs; the largest relative error (float32 cases: an
    AssertionError above FLOAT_TOLERANCE; int8 cases are compared for the record only)."""
    _, reference = data(case, settings)
    error = max_rel_error(run.outputs(), reference)
    if case.quantize is None and not error <= FLOAT_TOLERANCE:
        raise AssertionError(f"{case.name}: output differs from PyTorch's by {error:.2e} (> {FLOAT_TOLERANCE})")
    return error
