"""Every place accel relies on a part of TVM that TVM does not publish as API, each checked
against the TVM release it was written for (`TESTED`).

- `point_pool_at`: a library TVM builds calls its CPU thread pool through two function
  pointers it exports, ``__TVMBackendParallelLaunch`` and ``__TVMBackendParallelBarrier``,
  which TVM's loader sets when it opens the library; the launch takes TVM's
  ``TVMParallelGroupEnv`` (its layout is declared again in runtime/pool.c). accel's pool
  takes the launch pointer's place (runtime/pool.py).
- `onnx_converters`: TVM's ONNX importer takes no custom converters; it reads its table from
  ``onnx_frontend._get_convert_map``, which is swapped, under a lock, while accel imports.
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
import os
import threading
import warnings

import tvm
from tvm import relax
from tvm.relax import vm_build

TESTED = "0.27."
LAUNCH, BARRIER = "__TVMBackendParallelLaunch", "__TVMBackendParallelBarrier"
_ONNX_LOCK = threading.Lock()


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
