"""Weights beside the library: ``build(..., weights="separate")``, `save` and `load`.

By default the weights (already folded and packed for the kernels) are
constants inside the executable, and `export_library` embeds them in the .so.
Loading such a library makes TVM's loader hold several copies of them for a
moment (ResNet-50's 103 MB library peaks ~390 MB above the import).

With ``weights="separate"`` they become trailing inputs of ``main``, after the
model's own inputs, and `save` writes them next to the library in TVM's
parameter format (``PATH.params``: ``w0``, ``w1``, ... in ``main``'s order).
The library then holds code only, and loading costs one copy of the weights.
A machine with TVM's runtime alone (no accel_target) runs it with::

    from tvm.runtime.vm import VirtualMachine
    lib = tvm.runtime.load_module("model.so")
    params = tvm.runtime.load_param_dict_from_file("model.so.params")
    weights = [params[f"w{i}"] for i in range(len(params))]
    vm = VirtualMachine(lib, tvm.cpu())
    out = vm["main"](x, *weights)

`load` does the same and binds the weights: ``load("model.so")(x)``.

`build` returns an `AccelExecutable`: TVM's VMExecutable with the build's report and,
with separate weights, their values. `save` writes the model's signature to ``PATH.json``
(`write_signature`): its inputs (name, shape, dtype), its weights' shapes, the library's
SHA-256 and the report, which a loaded model has again (``Deployed.report``). `load`
needs it and checks it against the library, the weights file and the executable's own
parameter checks, so a missing, stale or edited file is a clear error, not a crash;
a `Deployed` model checks every call's inputs against it (`check_inputs`). A symbolic
dimension (an ONNX dim_param, a torch.export Dim) is recorded by its name (``["batch",
"seq", 768]``): a call may give it any size from 1, the same in every input that names it.

A `Deployed` model may be called from many threads at once: each thread runs it on a
VirtualMachine of its own (TVM's VirtualMachine keeps its registers and program
counter in the object, so two threads calling one VM corrupt each other: wrong
results, errors from inside the VM, segfaults). Plain `relax.VirtualMachine` users
must do the same: one VM per thread, or a lock around the calls.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from . import pool
from .reporting import Report
from .transforms import num_inputs, with_function

WEIGHTS_SUFFIX = ".params"
SIGNATURE_SUFFIX = ".json"
SIGNATURE_FORMAT = "accel-signature/1"
WEIGHT_MODES = ("embedded", "separate")


_JIT_LOCK = threading.Lock()


class AccelExecutable(relax.VMExecutable):
    """What `accel_target.build` returns: a VMExecutable (for relax.VirtualMachine,
    export_library, `save`) that keeps what the build knows about it.

    report: the build's accel_target.Report (`accel_target.report(executable)`).
    weights: with ``build(weights="separate")``, the values of main's trailing weight
        parameters, in order (`save` writes them beside the library); None otherwise.

    relax.VirtualMachine runs what `jit` returns: the library exported to a temporary
    directory and loaded, on accel's thread pool (`accel_target.pool`), as `load` runs a
    saved one (TVM's jit, which runs the module in place on TVM's pool, with ``ACCEL_POOL=tvm``,
    where pool.c does not compile, or with jit's own arguments, fcompile and addons).
    """

    def __init__(self, executable: relax.VMExecutable, report: Report, weights: list | None = None):
        super().__init__(executable.mod)
        self.report = report
        self.weights = weights

    def jit(self, *, force_recompile: bool = False, **kwargs) -> tvm.runtime.Module:
        if kwargs or not pool.available():
            return super().jit(force_recompile=force_recompile, **kwargs)
        with _JIT_LOCK:  # threads that each make a VirtualMachine of one executable
            if self._jitted_mod is None or force_recompile:
                # the file goes once loaded: the process keeps the library mapped
                with tempfile.TemporaryDirectory(prefix="accel_") as scratch:
                    library = os.path.join(scratch, "model.so")
                    self.export_library(library)
                    module = tvm.runtime.load_module(library)
                    pool.install(library)
                self._jitted_mod = module
            return self._jitted_mod


def _weights_of(executable) -> list:
    return (executable.weights or []) if isinstance(executable, AccelExecutable) else []


@mutator
class _ConstantLifter(PyExprMutator):
    """Each distinct tensor constant of a function becomes a new parameter w0, w1, ...
    (scalar constants, which hold a Python number, stay)."""

    def __init__(self, mod=None):
        super().__init__(mod)
        self.params: list[relax.Var] = []
        self.values: list[tvm.runtime.Tensor] = []
        self._index: dict = {}

    def visit_generic_const_(self, const):
        if not isinstance(const.value, tvm.runtime.Tensor):
            return const
        if const not in self._index:  # a constant used twice is one weight
            self._index[const] = len(self.params)
            self.params.append(relax.Var(f"w{len(self.params)}", const.ty))
            self.values.append(const.value)
        return self.params[self._index[const]]


def lift_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]]:
    """`mod` with the constants of ``main`` made trailing parameters, and their values in order.

    ``main``'s "num_input" attribute says how many leading parameters are the model's inputs.
    """
    main = mod["main"]
    lifter = _ConstantLifter(mod)
    body = lifter.visit_expr(main.body)
    if not lifter.params:
        return mod, []
    lifted = relax.Function(list(main.params) + lifter.params, body, main.ret_ty, main.is_pure, main.attrs, main.span)
    return with_function(mod, "main", lifted.with_attr("num_input", num_inputs(main))), lifter.values


def weights_path(library: str | os.PathLike) -> str:
    return os.fspath(library) + WEIGHTS_SUFFIX


def signature_path(library: str | os.PathLike) -> str:
    return os.fspath(library) + SIGNATURE_SUFFIX


@dataclass(frozen=True)
class TensorSpec:
    """What one parameter of ``main`` takes. `shape` holds per dimension an int (a fixed size),
    a str (a symbolic dimension: its name, ``"batch"``, any size from 1 and the same wherever
    the name appears; or an expression of names, ``"n * 2"``) or None (any size, as older
    signatures recorded a symbolic one); `shape` None altogether: any shape."""

    name: str
    shape: tuple | None
    dtype: str

    def shape_text(self) -> str:
        """The shape as a reader writes it: ``[batch, seq, 768]``, ``?`` for a None dimension."""
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.dtype} any shape"
        return f"{self.name}: {self.dtype} {self.shape_text()}"

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": None if self.shape is None else list(self.shape), "dtype": self.dtype}


# the check the VM runs on each tensor input of main: "ErrorContext(fn=main, loc=param[0],
# param=x, annotation=R.Tensor((1, 3, 32, 32), dtype="float32"))", a constant of the executable
_PARAM_CHECK = re.compile(
    r'ErrorContext\(fn=main, loc=param\[(\d+)\], param=([^,]+), annotation=R\.Tensor\((.*?)dtype="(\w+)"'
)


def _split_dims(text: str) -> list[str]:
    """The dimensions of a printed shape's inside (``"n, n * 2, 16"``), split at the commas
    outside brackets."""
    dims, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += (char in "([") - (char in ")]")
        if char == "," and depth == 0:
            dims.append(text[start:i].strip())
            start = i + 1
    return [d for d in dims if d]


def _spec_of_check(name: str, annotation: str, dtype: str) -> TensorSpec:
    shape = re.match(r"\s*\((.*)\),\s*$", annotation)
    if shape is None:
        return TensorSpec(name, None, dtype)
    dims = _split_dims(shape.group(1))
    return TensorSpec(name, tuple(int(d) if d.isdigit() else d for d in dims), dtype)


def executable_inputs(executable) -> list[TensorSpec]:
    """The tensor inputs of ``main`` that `executable` (a VMExecutable, or a module loaded from
    its library) checks when called, in order: its own record of the signature."""
    if not isinstance(executable, relax.VMExecutable):
        executable = relax.VMExecutable(executable)
    found = {
        int(m.group(1)): _spec_of_check(m.group(2), m.group(3), m.group(4))
        for m in _PARAM_CHECK.finditer(executable.stats())
    }
    return [found[i] for i in sorted(found)]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_signature(executable, library: str | os.PathLike, meta: dict | None = None) -> str:
    """Write ``library + ".json"``: main's inputs, the weights' shapes, the library's SHA-256,
    the report of an AccelExecutable and `meta` (e.g. the model file and input layout the CLI
    records). Returns its path."""
    library = os.fspath(library)
    weights = _weights_of(executable)
    signature = dict(meta or {})
    if isinstance(executable, AccelExecutable):
        signature["report"] = executable.report.to_dict()
    signature.update(
        {
            "format": SIGNATURE_FORMAT,
            "inputs": [spec.to_dict() for spec in executable_inputs(executable)],
            "weights": [TensorSpec(f"w{i}", tuple(w.shape), str(w.dtype)).to_dict() for i, w in enumerate(weights)],
            "library_sha256": _sha256(library),
        }
    )
    path = signature_path(library)
    with open(path, "w") as f:
        json.dump(signature, f, indent=2)
    return path


def save(executable: relax.VMExecutable, library: str | os.PathLike, meta: dict | None = None) -> list[str]:
    """Export `executable` to `library` (.so), its signature to ``library + ".json"``
    (`write_signature`, with `meta`) and, if it was built with ``weights="separate"``, its
    weights to ``library + ".params"``. Returns the paths of the library and the weights."""
    library, params = os.fspath(library), weights_path(library)
    executable.export_library(library)
    write_signature(executable, library, meta)
    weights = _weights_of(executable)
    if not weights:
        if os.path.isfile(params):  # a stale file would be passed to this main
            os.remove(params)
        return [library]
    tvm.runtime.save_param_dict_to_file({f"w{i}": w for i, w in enumerate(weights)}, params)
    return [library, params]


def _spec_from_json(entry, where: str) -> TensorSpec:
    if not (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and isinstance(entry.get("name", ""), str)):
        raise ValueError(f"{where} is {entry!r}; expected {{'name': ..., 'shape': [...], 'dtype': ...}}")
    shape = entry.get("shape")
    dims = isinstance(shape, list) and all(
        d is None or (isinstance(d, int) and d >= 0) or (isinstance(d, str) and d) for d in shape
    )
    if shape is not None and not dims:
        raise ValueError(
            f"{where} has shape {shape!r}; expected a list of sizes and names of symbolic dimensions (null for any)"
        )
    return TensorSpec(entry.get("name", ""), None if shape is None else tuple(shape), entry["dtype"])


def _report_from_json(entry) -> Report | None:
    if entry is None:
        return None
    try:
        return Report.from_dict(entry)
    except (TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"its report is not one that Report.to_dict writes ({type(err).__name__}: {err})") from None


def read_signature(library: str | os.PathLike) -> dict:
    """The signature `save` wrote beside `library`, checked for form and against the library's
    SHA-256: {"inputs": [TensorSpec], "weights": [TensorSpec], "report": Report or None,
    ...the rest as written}."""
    library, path = os.fspath(library), signature_path(library)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"accel load: signature file {path!r} does not exist; accel_target.save and "
            f"'accel-tvm compile' write it beside the library: save the model again"
        )
    try:
        with open(path) as f:
            signature = json.load(f)
        if not isinstance(signature, dict) or signature.get("format") != SIGNATURE_FORMAT:
            raise ValueError(f"it is not an {SIGNATURE_FORMAT!r} file")
        for key in ("inputs", "weights"):
            if not isinstance(signature.get(key), list):
                raise ValueError(f"its {key!r} is {signature.get(key)!r}, not a list")
        signature["inputs"] = [_spec_from_json(e, f"input {i}") for i, e in enumerate(signature["inputs"])]
        signature["weights"] = [_spec_from_json(e, f"weight {i}") for i, e in enumerate(signature["weights"])]
        signature["report"] = _report_from_json(signature.get("report"))
    except ValueError as err:  # json.JSONDecodeError included
        raise ValueError(f"accel load: signature file {path!r} is malformed: {err}; save the model again") from None
    if signature.get("library_sha256") != _sha256(library):
        raise ValueError(
            f"accel load: signature file {path!r} was not written for {library!r} (its "
            f"library_sha256 differs from the library's): the library was rebuilt or the file "
            f"edited; save the model again"
        )
    return signature


def _as_array(value, spec: TensorSpec, index: int):
    """`value` as a tvm Tensor or a numpy array, without copying when it is one already."""
    if isinstance(value, tvm.runtime.Tensor):
        return value
    try:
        return np.asarray(value)
    except Exception as err:
        raise TypeError(
            f"accel model: input {index} ({spec.name}): expected a tvm.runtime.Tensor or an array "
            f"(numpy, PyTorch CPU tensor), given {type(value).__name__}: {err}"
        ) from None


_OPERATORS = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
_OPERATORS.update({ast.FloorDiv: int.__floordiv__, ast.Mod: int.__mod__})


def _expression(dim: str) -> ast.expr | None:
    """A symbolic dimension that is an expression (``"n * 2"``, as TVM prints it), parsed."""
    try:
        return ast.parse(dim, mode="eval").body
    except SyntaxError:
        return None


def _evaluate(node: ast.expr, sizes: dict[str, int]) -> int | None:
    """An `_expression` at `sizes`; None when it holds anything but known names, ints, + - * // %."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return sizes.get(node.id)
    if not (isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS):
        return None
    left, right = _evaluate(node.left, sizes), _evaluate(node.right, sizes)
    if left is None or right is None or (right == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod))):
        return None
    return _OPERATORS[type(node.op)](left, right)


def _layout_hint(given: tuple, spec: TensorSpec) -> str:
    """The hint for a given shape whose sizes hold the fixed ones in another order."""
    fixed = Counter(d for d in spec.shape if isinstance(d, int))
    if len(given) != len(spec.shape) or fixed - Counter(given):
        return ""
    return (
        " (the same sizes in another order: a layout mismatch? transpose the input, e.g. NHWC to NCHW, "
        "or build the model for the layout you have, e.g. input_layout='NHWC')"
    )


def _shape_problem(given: tuple, spec: TensorSpec, index: int, sizes: dict, setters: dict) -> str | None:
    """What is wrong with input `index`'s shape, or None; binds its symbolic dimensions in
    `sizes` (name -> size), `setters` recording where each was first given."""
    if len(given) != len(spec.shape):
        return f"{len(given)} dimensions, the model takes {len(spec.shape)}"
    for axis, (size, dim) in enumerate(zip(given, spec.shape)):
        if isinstance(dim, int) and size != dim:
            return f"dimension {axis} is {size}; the model fixes it at {dim}" + _layout_hint(given, spec)
        if not isinstance(dim, str) or not dim.isidentifier():
            continue
        if size < 1:
            return f"dimension {axis} ({dim}) is {size}: a symbolic dimension takes sizes from 1"
        if dim not in sizes:
            sizes[dim], setters[dim] = size, (index, spec.name, axis)
        elif sizes[dim] != size:
            where, name, at = setters[dim]
            first = f"its dimension {at}" if where == index else f"input {where} ({name}) dimension {at}"
            return (
                f"dimension {axis} ({dim}) is {size}, but {first} gave {dim} = {sizes[dim]}: "
                f"every dimension named {dim} takes the same size"
            )
    return None


def _expression_problem(given: tuple, spec: TensorSpec, sizes: dict) -> str | None:
    """What is wrong with the dimensions of `spec` that are expressions of symbolic ones
    (``n * 2``) at the `sizes` the inputs gave, or None."""
    for axis, (size, dim) in enumerate(zip(given, spec.shape)):
        tree = _expression(dim) if isinstance(dim, str) and not dim.isidentifier() else None
        expected = None if tree is None else _evaluate(tree, sizes)
        if expected is not None and size != expected:
            names = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)})
            known = ", ".join(f"{name} = {sizes[name]}" for name in names)
            return f"dimension {axis} ({dim}) is {size}; with {known} it must be {expected}"
    return None


def _check_shapes(shapes: list[tuple], specs: list[TensorSpec]) -> None:
    """Every input's shape against its spec: rank, fixed sizes, and each symbolic dimension of
    one size (from 1) in every input that names it."""
    sizes: dict[str, int] = {}
    setters: dict[str, tuple[int, str, int]] = {}
    for index, (given, spec) in enumerate(zip(shapes, specs)):
        problem = spec.shape is not None and _shape_problem(given, spec, index, sizes, setters)
        if problem:
            _raise_shape(given, spec, index, problem)
    for index, (given, spec) in enumerate(zip(shapes, specs)):
        problem = spec.shape is not None and _expression_problem(given, spec, sizes)
        if problem:
            _raise_shape(given, spec, index, problem)


def symbolic_dims(specs: list[TensorSpec]) -> list[str]:
    """The names of the symbolic dimensions of `specs`, in order of first appearance."""
    dims = (d for spec in specs for d in spec.shape or ())
    return list(dict.fromkeys(d for d in dims if isinstance(d, str) and d.isidentifier()))


def _raise_shape(given: tuple, spec: TensorSpec, index: int, problem: str):
    names = symbolic_dims([spec])
    legend = f" ({', '.join(names)}: any size from 1)" if names else ""
    raise ValueError(
        f"accel model: input {index} ({spec.name}): expected shape {spec.shape_text()}{legend}, "
        f"given {list(given)}: {problem}"
    )


def _check_finite(array: np.ndarray, spec: TensorSpec, index: int) -> None:
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    raise ValueError(
        f"accel model: input {index} ({spec.name}) holds {nan} NaN and {inf} Inf values; expected finite "
        f"numbers (the kernels' ReLU, max and pooling turn NaN into numbers, so the output would look "
        f"valid): clean the input, or load with check_finite=False to pass it through unchecked"
    )


class Deployed:
    """A saved model loaded for running: ``model(*inputs)`` returns what ``main`` returns.

    inputs: one per model input, in order (`inputs` lists them): tvm.runtime.Tensor, numpy
        arrays or anything ``np.asarray`` reads (a PyTorch CPU tensor), of exactly the dtype
        and shape of the signature (no casting). A symbolic dimension (``batch`` in
        ``[batch, 3, 224, 224]``) takes any size from 1, the same in every input that names it.
        A non-contiguous array is copied; a wrong count, dtype, rank, fixed size or
        symbolic size is a ValueError naming the input, the dimension and what it takes;
        NaN or Inf in a float input is a ValueError unless ``check_finite=False``.

    Safe to call from many threads at once: each thread gets a VirtualMachine of its own
    (`vm`), and all share the library and the weights, which the kernels only read.
    `report` is the build's accel_target.Report, as `save` wrote it (None if it wrote none).
    `pool` says whose thread pool the kernels run on: "accel" (`accel_target.pool`), or
    "tvm" with ``ACCEL_POOL=tvm``.
    """

    def __init__(self, library: str | os.PathLike, device=None, *, check_finite: bool = True):
        library = os.fspath(library)
        if not os.path.isfile(library):
            raise FileNotFoundError(f"accel load: library {library!r} does not exist")
        self.library = library
        self.device = device or tvm.cpu()
        self.check_finite = check_finite
        signature = read_signature(library)
        self.signature = signature
        self.report: Report | None = signature["report"]
        self.inputs: list[TensorSpec] = signature["inputs"]
        self.module = tvm.runtime.load_module(library)
        self.pool = "accel" if pool.install(library) else "tvm"
        self.weights = self._load_weights(signature["weights"])
        self._local = threading.local()
        self._check_against_executable()

    def _load_weights(self, specs: list[TensorSpec]) -> list:
        path = weights_path(self.library)
        if not os.path.isfile(path):
            if specs:
                raise FileNotFoundError(
                    f"accel load: weights file {path!r} does not exist; the model takes {len(specs)} weights from it"
                )
            return []
        params = tvm.runtime.load_param_dict_from_file(path)
        expected = [f"w{i}" for i in range(len(params))]
        names = sorted(params.keys())
        if set(names) != set(expected):
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise ValueError(
                f"accel load: {path!r} holds {shown}; expected the weights "
                f"w0..w{len(params) - 1} that accel_target.save writes"
            )
        weights = [params[name] for name in expected]
        # (main checks none of the weights; the kernels check their arguments, in words naming neither)
        if len(weights) != len(specs):
            raise ValueError(f"accel load: {path!r} holds {len(weights)} weights; the model takes {len(specs)}")
        for spec, weight in zip(specs, weights, strict=True):
            if tuple(weight.shape) != spec.shape or str(weight.dtype) != spec.dtype:
                raise ValueError(
                    f"accel load: weight {spec.name} in {path!r} is {weight.dtype} {list(weight.shape)}; "
                    f"the model takes {spec.describe()}"
                )
        return weights

    def _check_against_executable(self) -> None:
        """The signature file agrees with the checks the executable itself runs on its inputs."""
        own = executable_inputs(self.module)
        arity = int(self.vm._get_function_arity("main"))
        if own != self.inputs or arity != len(self.inputs) + len(self.weights):
            listed = ", ".join(s.describe() for s in self.inputs)
            actual = ", ".join(s.describe() for s in own)
            raise ValueError(
                f"accel load: signature file {signature_path(self.library)!r} lists inputs ({listed}) and "
                f"{len(self.weights)} weights; the library's main takes ({actual}) and "
                f"{arity - len(own)} weights: save the model again"
            )

    @property
    def vm(self) -> relax.VirtualMachine:
        """The calling thread's VirtualMachine (made on its first use, dropped with the thread)."""
        return self._thread_state().vm

    def _thread_state(self):
        """The calling thread's VM and its main function, made on first use."""
        local = self._local
        if not hasattr(local, "vm"):
            local.vm = relax.VirtualMachine(self.module, self.device)
            local.main = local.vm["main"]
        return local

    def check_inputs(self, inputs) -> list:
        """`inputs` checked against the signature and converted to tvm Tensors on the device."""
        if len(inputs) != len(self.inputs):
            listed = ", ".join(s.describe() for s in self.inputs)
            raise ValueError(f"accel model: takes {len(self.inputs)} input(s) ({listed}), given {len(inputs)}")
        values = [_as_array(value, spec, index) for index, (value, spec) in enumerate(zip(inputs, self.inputs))]
        for index, (value, spec) in enumerate(zip(values, self.inputs)):
            if str(value.dtype) != spec.dtype:
                raise ValueError(
                    f"accel model: input {index} ({spec.name}): expected dtype {spec.dtype}, given {value.dtype}"
                )
        _check_shapes([tuple(int(d) for d in value.shape) for value in values], self.inputs)
        tensors = []
        for index, (value, spec) in enumerate(zip(values, self.inputs)):
            if isinstance(value, tvm.runtime.Tensor):
                if value.device != self.device:
                    raise ValueError(
                        f"accel model: input {index} ({spec.name}): "
                        f"expected a tensor on {self.device}, given one on {value.device}"
                    )
                if self.check_finite:
                    _check_finite(np.from_dlpack(value), spec, index)
                tensors.append(value)
                continue
            if self.check_finite:
                _check_finite(value, spec, index)
            tensors.append(tvm.runtime.tensor(np.asarray(value, order="C"), device=self.device))  # (0-d stays 0-d)
        return tensors

    def __call__(self, *inputs):
        return self._thread_state().main(*self.check_inputs(inputs), *self.weights)

    def time_ms(self, *inputs, number: int = 10) -> float:
        """Mean time of `number` runs on `inputs`, in ms (TVM's time_evaluator)."""
        tensors = self.check_inputs(inputs)
        return self.vm.time_evaluator("main", self.device, number=number, repeat=1)(*tensors, *self.weights).mean * 1e3


def load(library: str | os.PathLike, device=None, *, check_finite: bool = True) -> Deployed:
    """Load a library written by `save`, with its signature (``.json``) and its weights
    (``.params``, if the model has them); see `Deployed` for calling it."""
    return Deployed(library, device, check_finite=check_finite)
