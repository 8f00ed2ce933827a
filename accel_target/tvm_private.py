"""Every place accel relies on a part of TVM that TVM does not publish as API, each checked
against the TVM release it was written for (`TESTED`).

- `point_pool_at`: a library TVM builds calls its CPU thread pool through two function
  pointers it exports, ``__TVMBackendParallelLaunch`` and ``__TVMBackendParallelBarrier``,
  which TVM's loader sets when it opens the library; the launch takes TVM's
  ``TVMParallelGroupEnv`` (its layout is declared again in runtime/pool.c). accel's pool
  takes the launch pointer's place (runtime/pool.py).
- `onnx_converters`: TVM's ONNX importer takes no custom converters; it reads its table from
  ``onnx_frontend._get_convert_map``, which is swapped, under a lock, while accel imports.
- `torch_importer`: TVM's PyTorch importer emits every conv, matmul and linear with
  ``out_dtype="float32"``, and its norms' kernels take float32 and float16 only; the Relax op
  functions it looks up in ``relax.op`` are wrapped, under a lock, while accel imports, as is
  its conversion of weights (``ExportedProgramImporter._convert_pytorch_tensor_to_tvm``).
- `vm_codegen`, `vm_link`: ``tvm.compile``'s two ends for a Relax module, which its
  ``relax.vm_build`` keeps private (``_vmcodegen``, and ``relax.VMLink`` in ``_vmlink``):
  accel_target.codegen generates the kernels' code between them.

Another TVM release may change any of them; `supported` says whether this one is the release they
were written against, and each falls back to TVM's own behaviour on any other (with a
warning, once). tests/test_tvm_private.py fails when TVM changes what they rely on.
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import functools
import inspect
import os
import threading
import warnings

import tvm
from tvm import relax
from tvm.relax import vm_build

TESTED = "0.27."
LAUNCH, BARRIER = "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"
_ONNX_LOCK = threading.Lock()
_TORCH_LOCK = threading.Lock()


@functools.cache
def supported(feature: str) -> bool:
    """Whether this TVM is the release accel's `feature` was written against (a warning, once,
    where it is not)."""
    if tvm.__version__.startswith(TESTED):
        return True
    warnings.warn(
        f"accel: {feature} relies on TVM {TESTED}x internals; TVM {tvm.__version__} keeps TVM's own behaviour",
        stacklevel=3,
    )
    return False


def point_pool_at(library: str | os.PathLike, launch: int) -> str | None:
    """Point the parallel launch of the loaded library `library` at the C function at address
    `launch`. Returns None where it did, else why not (the library calls no thread pool, or
    meets at barriers, which accel's pool does not provide, or TVM is another release)."""
    if not supported("accel's thread pool"):
        return "TVM is not the release accel's pool was written for"
    try:
        handle = ctypes.CDLL(os.path.abspath(library), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return "the library is not loaded under this path"
    try:
        if _has_symbol(handle, BARRIER):
            return "its kernels meet at barriers"
        if not _has_symbol(handle, LAUNCH):
            return "it has no parallel loop"
        ctypes.c_void_p.in_dll(handle, LAUNCH).value = launch
        return None
    finally:  # the reference RTLD_NOLOAD took: TVM's module alone keeps the library loaded
        _ctypes.dlclose(handle._handle)


def _has_symbol(handle: ctypes.CDLL, name: str) -> bool:
    try:
        ctypes.c_void_p.in_dll(handle, name)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def onnx_converters(extra: dict):
    """Within the block, TVM's ONNX importer converts with `extra` on top of its own table."""
    from tvm.relax.frontend.onnx import onnx_frontend

    if not supported("accel's ONNX converters"):
        yield
        return
    original = onnx_frontend._get_convert_map
    with _ONNX_LOCK:
        onnx_frontend._get_convert_map = lambda: {**original(), **extra}
        try:
            yield
        finally:
            onnx_frontend._get_convert_map = original


def _typed(expr: relax.Expr) -> relax.Expr:
    """`expr` normalized by the block builder of the import, so that its type is known to the
    converter that asked for it (TVM's read ``.ty.dtype`` of what an op returned)."""
    builder = relax.BlockBuilder.current()
    return expr if builder is None else builder.normalize(expr)


def _untyped(value) -> bool:
    """Whether `value` is an expression of no tensor type yet (an op's call not yet emitted)."""
    return isinstance(value, relax.Expr) and not isinstance(getattr(value, "ty", None), relax.TensorType)


# (module, name) of the Relax ops TVM's PyTorch importer calls with out_dtype="float32"
_FLOAT32_ACCUMULATING = [
    *((relax.op.nn, f"conv{d}d{t}") for d in (1, 2, 3) for t in ("", "_transpose")),
    (relax.op.linear_algebra, "matmul"),
    (relax.op, "matmul"),
    (relax.op, "linear"),
]


def _accumulating(op):
    """`op` (a conv, matmul or linear) that, asked for float32 from data of another float
    dtype, computes as PyTorch does and gives the data's dtype: float64 data in float64 (a
    linear's bias added after); float16 / bfloat16 data widened to float32, so that the
    product and its bias run in accel's float32 kernels (the weights widened at compile time)
    and round once, where TVM's kernels of a half type run tens of times slower."""
    signature = inspect.signature(op)
    first = next(iter(signature.parameters))

    def call(*args, **kwargs):
        given = signature.bind(*args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        dtype = str(values[first].ty.dtype)
        if values.get("out_dtype") != "float32" or dtype not in ("float64", "float16", "bfloat16"):
            return op(*args, **kwargs)
        if dtype != "float64":
            for name, value in values.items():
                if isinstance(value, relax.Expr) and str(getattr(value.ty, "dtype", "")) == dtype:
                    values[name] = relax.op.astype(value, "float32")
            return _typed(relax.op.astype(op(**values), dtype))
        values["out_dtype"], bias = "float64", values.get("bias")
        if bias is not None:
            values["bias"] = None
        found = op(**values)
        return _typed(found if bias is None else relax.op.add(found, bias))

    return functools.wraps(op)(call)


def _normalizing(op):
    """`op` (layer_norm, group_norm, rms_norm: data, then its weights) computed as PyTorch does
    for data of another float dtype: float16 / bfloat16 in float32 (TVM's kernels take
    float32 and float16 only, and float16 loses what PyTorch keeps); float64 ones spelled out
    in float64 (`_spelled_out`)."""

    signature = inspect.signature(op)

    def call(data, *args, **kwargs):
        dtype = str(data.ty.dtype)
        given = signature.bind(data, *args, **kwargs)
        given.apply_defaults()
        values = given.arguments
        if dtype in ("float16", "bfloat16"):
            for name in ("data", "gamma", "beta", "weight"):
                if name in values:
                    values[name] = relax.op.astype(values[name], "float32")
            return _typed(relax.op.astype(op(**values), dtype))
        if dtype != "float64":
            return op(data, *args, **kwargs)
        return _typed(_spelled_out(op.__name__, data, values))

    return functools.wraps(op)(call)


def _spelled_out(name: str, data, values: dict):
    """A layer, group or RMS norm of `data` as means in its dtype (`values`: the op's arguments
    by name); a group norm's groups along axis 1, PyTorch's channels."""
    dtype, shape = str(data.ty.dtype), list(data.ty.shape)
    axes, grouped = values["axes"], data
    if name == "group_norm":
        grouped, axes = relax.op.reshape(data, [shape[0], values["num_groups"], -1]), [2]
    axes = [axes] if isinstance(axes, int) else list(axes)
    centred = grouped if name == "rms_norm" else relax.op.subtract(grouped, relax.op.mean(grouped, axes, True))
    spread = relax.op.mean(relax.op.multiply(centred, centred), axes, True)
    found = relax.op.divide(centred, relax.op.sqrt(relax.op.add(spread, relax.const(values["epsilon"], dtype))))
    weight, bias = values.get("gamma", values.get("weight")), values.get("beta")
    if name == "group_norm":
        found = relax.op.reshape(found, shape)
        channel = [1, -1] + [1] * (len(shape) - 2)
        weight, bias = relax.op.reshape(weight, channel), relax.op.reshape(bias, channel)
    found = relax.op.multiply(found, weight) if values.get("scale", True) else found
    return relax.op.add(found, bias) if values.get("center", False) else found


_NORMS = [(relax.op.nn, name) for name in ("layer_norm", "group_norm", "rms_norm")]


def _in_float32(widened_dtypes: tuple):
    """An op of operands of `widened_dtypes` computed in float32, as PyTorch computes them,
    the result rounded back: a reduction or softmax of float16 / bfloat16 (TVM's accumulate in
    the half type: a wav2vec-style model was 5x PyTorch's error in bfloat16), power of bfloat16
    (TVM's type check takes no bfloat16 for a float)."""

    def wrap(op):
        def call(*args, **kwargs):
            # (an operand of no type yet, an op's call not emitted, normalized to learn its dtype)
            args = [
                _typed(a) if isinstance(a, relax.Expr) and not isinstance(a.ty, relax.TensorType) else a for a in args
            ]
            dtypes = [str(getattr(getattr(a, "ty", None), "dtype", "")) for a in args]
            half = next((d for d in dtypes if d in widened_dtypes), None)
            if half is None:
                return op(*args, **kwargs)
            widened = [relax.op.astype(a, "float32") if d == half else a for a, d in zip(args, dtypes, strict=True)]
            found = _typed(op(*widened, **kwargs))
            return _typed(relax.op.astype(found, half)) if str(found.ty.dtype) == "float32" else found

        return functools.wraps(op)(call)

    return wrap


_HALF_IN_FLOAT32 = {
    **{(relax.op, name): ("float16", "bfloat16") for name in ("sum", "mean", "variance", "std", "prod", "cumsum")},
    **{(relax.op.nn, name): ("float16", "bfloat16") for name in ("softmax", "log_softmax")},
    (relax.op, "power"): ("bfloat16",),
}


_CONVERT_TENSOR = "_convert_pytorch_tensor_to_tvm"  # ExportedProgramImporter's, a staticmethod


def _compact(convert):
    """TVM's conversion of a weight or constant (a staticmethod), given it compact: DLPack
    refuses a strided one (a channels-last model's conv weights), and TVM's numpy fallback
    has no bfloat16 (a channels-last bfloat16 model did not import)."""
    import torch

    def call(tensor):
        return convert.__func__(tensor.contiguous() if tensor.layout == torch.strided else tensor)

    return staticmethod(call)


@contextlib.contextmanager
def torch_importer():
    """Within the block, the convs, matmuls and linears TVM's PyTorch importer emits give the
    dtype of their data, not float32 (a float16, bfloat16 or float64 model failed to import:
    a float32 product beside a bias of the model's dtype), its layer, group and RMS norms take
    any float dtype (`_normalizing`), reductions, softmax and power of half types run in
    float32 (`_in_float32`), and its weights are converted compact (`_compact`)."""
    if not supported("accel's float16 / bfloat16 / float64 import"):
        yield
        return
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter as importer

    with _TORCH_LOCK:
        wrappers = {
            **{where: _accumulating for where in _FLOAT32_ACCUMULATING},
            **{where: _normalizing for where in _NORMS},
            **{where: _in_float32(dtypes) for where, dtypes in _HALF_IN_FLOAT32.items()},
            (importer, _CONVERT_TENSOR): _compact,
        }
        # (the class's own attribute: a staticmethod, restored as one)
        originals = [(module, name, vars(module)[name]) for module, name in wrappers]
        for module, name, op in originals:
            setattr(module, name, wrappers[module, name](op))
        try:
            yield
        finally:
            for module, name, op in originals:
                setattr(module, name, op)


def vm_codegen(mod: tvm.IRModule) -> tuple[relax.ExecBuilder, tvm.IRModule]:
    """TVM's VM code generation of `mod`'s Relax functions (bytecode mode): the ExecBuilder
    holding their bytecode, and the kernels they call (`mod`'s PrimFuncs, with its attributes)."""
    builder = relax.ExecBuilder()
    leftover = vm_build._vmcodegen(builder, mod, "bytecode")
    kernels = {gvar: func for gvar, func in leftover.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}
    return builder, tvm.IRModule(kernels, attrs=leftover.attrs)


def vm_link(builder: relax.ExecBuilder, target: tvm.target.Target, libraries: list, params: dict) -> relax.VMExecutable:
    """The executable of `builder`'s bytecode, calling kernels from `libraries` (runtime
    modules: the first one is the executable's library, the others are imported beside it)."""
    return relax.VMExecutable(vm_build._ffi_api.VMLink(builder, target, libraries[0], libraries[1:], params))
