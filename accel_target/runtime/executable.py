"""What `accel_target.build` returns: TVM's VMExecutable with what the build knows about it.

By default the weights (already folded and packed for the kernels) are constants inside the
executable, and `export_library` embeds them in the .so. With ``build(...,
weights="separate")`` they become trailing inputs of ``main`` (`lift_weights`), after the
model's own inputs, kept in ``executable.weights`` for `save` to write beside the library:
the library then holds code only, and loading it costs one copy of the weights.

An AccelExecutable is also a model to call, as `load` gives one (`accel_target.runtime.model`):
``executable(x)`` checks `x` against main's inputs and runs main on the CPU, on a
VirtualMachine of the calling thread's own, so that any number of threads may share it.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..passes.relax_util import num_inputs, with_function
from ..reporting import Report
from . import pool
from .model import Model
from .signature import TensorSpec, executable_inputs

WEIGHT_MODES = ("embedded", "separate")
_JIT_LOCK = threading.Lock()


class AccelExecutable(Model, relax.VMExecutable):
    """What `accel_target.build` returns: a VMExecutable (for relax.VirtualMachine,
    export_library, `save`) that keeps what the build knows about it, and a `Model`:
    ``executable(*inputs)`` is main's result for `inputs` checked against `inputs` (numpy
    arrays, tvm Tensors on the CPU, anything ``np.asarray`` reads), safe from many threads.

    report: the build's accel_target.Report (`accel_target.report(executable)`).
    weights: with ``build(weights="separate")``, the values of main's trailing weight
        parameters, in order (`save` writes them beside the library); None otherwise.
    inputs: main's own inputs (TensorSpec: name, shape with symbolic dimensions by name, dtype).

    relax.VirtualMachine runs what `jit` returns: the library exported to a temporary
    directory and loaded, on accel's thread pool (`accel_target.runtime.pool`), as `load` runs a
    saved one (TVM's jit, which runs the module in place on TVM's pool, with ``ACCEL_POOL=tvm``,
    where pool.c does not compile, or with jit's own arguments, fcompile and addons).
    """

    def __init__(self, executable: relax.VMExecutable, report: Report, weights: list | None = None):
        super().__init__(executable.mod)
        self.report = report
        self.weights = weights
        self.device = tvm.cpu()
        self._loaded: tvm.runtime.Module | None = None

    @functools.cached_property
    def inputs(self) -> list[TensorSpec]:
        return executable_inputs(self)

    def _vm_module(self) -> tvm.runtime.Module:
        return self.jit()

    def jit(self, *, force_recompile: bool = False, **kwargs) -> tvm.runtime.Module:
        if kwargs or not pool.available():
            return super().jit(force_recompile=force_recompile, **kwargs)
        with _JIT_LOCK:  # threads that each make a VirtualMachine of one executable
            if self._loaded is None or force_recompile:
                # the file goes once loaded: the process keeps the library mapped
                with tempfile.TemporaryDirectory(prefix="accel_") as scratch:
                    library = os.path.join(scratch, "model.so")
                    self.export_library(library)
                    module = tvm.runtime.load_module(library)
                    pool.install(library)
                self._loaded = module
            return self._loaded


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
