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
"""

from __future__ import annotations

import os

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .transforms import num_inputs, with_function

WEIGHTS_SUFFIX = ".params"
WEIGHT_MODES = ("embedded", "separate")


@mutator
class _ConstantLifter(PyExprMutator):
    """Each distinct tensor constant of a function becomes a new parameter w0, w1, ...
    (scalar constants, which hold a Python number, stay)."""

    def __init__(self, mod=None):
        super().__init__(mod)
        self.params: list[relax.Var] = []
        self.values: list[tvm.runtime.Tensor] = []
        self._index: dict = {}

    def visit_generic_const_(self, const):  # pylint: disable=arguments-renamed
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


def save(executable: relax.VMExecutable, library: str | os.PathLike) -> list[str]:
    """Export `executable` to `library` (.so) and, if it was built with ``weights="separate"``,
    its weights to ``library + ".params"``. Returns the paths written."""
    library, params = os.fspath(library), weights_path(library)
    executable.export_library(library)
    weights = getattr(executable, "accel_weights", None)
    if not weights:
        if os.path.isfile(params):  # a stale file would be passed to this main
            os.remove(params)
        return [library]
    tvm.runtime.save_param_dict_to_file({f"w{i}": w for i, w in enumerate(weights)}, params)
    return [library, params]


class Deployed:
    """A saved model loaded for running: ``model(*inputs)`` returns what ``main`` returns."""

    def __init__(self, library: str | os.PathLike, device=None):
        if not os.path.isfile(library):
            raise FileNotFoundError(f"accel load: library {os.fspath(library)!r} does not exist")
        self.device = device or tvm.cpu()
        self.vm = relax.VirtualMachine(tvm.runtime.load_module(os.fspath(library)), self.device)
        path = weights_path(library)
        self.weights: list = []
        if os.path.isfile(path):
            params = tvm.runtime.load_param_dict_from_file(path)
            expected = [f"w{i}" for i in range(len(params))]
            names = sorted(params.keys())
            if set(names) != set(expected):
                shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
                raise ValueError(f"accel load: {path!r} holds {shown}; expected the weights "
                                 f"w0..w{len(params) - 1} that accel_target.save writes")
            self.weights = [params[name] for name in expected]
        self._main = self.vm["main"]

    def __call__(self, *inputs):
        return self._main(*inputs, *self.weights)

    def time_ms(self, *inputs, number: int = 10) -> float:
        """Mean time of `number` runs on `inputs`, in ms (TVM's time_evaluator)."""
        return self.vm.time_evaluator("main", self.device, number=number, repeat=1)(*inputs, *self.weights).mean * 1e3


def load(library: str | os.PathLike, device=None) -> Deployed:
    """Load a library written by `save` (with its weights file, if there is one)."""
    return Deployed(library, device)
