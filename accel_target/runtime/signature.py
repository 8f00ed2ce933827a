"""A saved model's signature (``PATH.json`` beside the library): its inputs, weights, the
library's SHA-256 and the build's report; and the checks of a call's inputs against it.

A symbolic dimension (an ONNX dim_param, a torch.export Dim) is recorded by its name
(``["batch", "seq", 768]``): a call may give it any size from 1, the same in every input that
names it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..reporting import Report

WEIGHTS_SUFFIX = ".params"
SIGNATURE_SUFFIX = ".json"
SIGNATURE_FORMAT = "accel-signature/1"


def weights_of(executable) -> list:
    """The values of an executable's lifted weights: an AccelExecutable's ``weights`` (none for
    one built with embedded weights, or for a VMExecutable built another way)."""
    return list(getattr(executable, "weights", None) or [])


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
    weights = weights_of(executable)
    signature = dict(meta or {})
    report = getattr(executable, "report", None)  # an AccelExecutable's (executable.py imports this module)
    if isinstance(report, Report):
        signature["report"] = report.to_dict()
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


def as_array(value, spec: TensorSpec, index: int):
    """`value` as a tvm Tensor or a numpy array, without copying when it is one already."""
    if isinstance(value, tvm.runtime.Tensor):
        return value
    try:
        return np.asarray(value)
    except Exception as err:
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":  # (numpy has no bfloat16)
            return tvm.runtime.from_dlpack(value.detach())
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


def check_shapes(shapes: list[tuple], specs: list[TensorSpec]) -> None:
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


def check_finite(array: np.ndarray, spec: TensorSpec, index: int) -> None:
    if (array.dtype.kind != "f" and array.dtype.name != "bfloat16") or np.isfinite(array).all():
        return
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    raise ValueError(
        f"accel model: input {index} ({spec.name}) holds {nan} NaN and {inf} Inf values; expected finite "
        f"numbers: clean the input, or load with check_finite=False to pass it through unchecked"
    )
