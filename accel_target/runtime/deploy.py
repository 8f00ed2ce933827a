"""Weights beside the library: ``build(..., weights="separate")``, `save` and `load`.

By default the weights (already folded and packed for the kernels) are
constants inside the executable, and `export_library` embeds them in the .so.
Loading such a library makes TVM's loader hold several copies of them for a
moment, while it reads the constants out of the library.

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

`save` writes the model's signature to ``PATH.json``
(`write_signature`): its inputs (name, shape, dtype), its weights' shapes, the library's
SHA-256 and the report, which a loaded model has again (``Deployed.report``). `load`
needs it and checks it against the library, the weights file and the executable's own
parameter checks, so a missing, stale or edited file is a clear error, not a crash;
a `Deployed` model checks every call's inputs against it (`check_inputs`). A symbolic
dimension (an ONNX dim_param, a torch.export Dim) is recorded by its name (``["batch",
"seq", 768]``): a call may give it any size from 1, the same in every input that names it.

A `Deployed` model may be called from many threads at once: each thread runs it on a
VirtualMachine of its own (`accel_target.runtime.model`, which `build`'s executables share).

``load(path, remote=Device(host, port, key))`` runs it on a remote device through TVM's RPC
tracker (`accel_target.runtime.remote`): the library and the weights file are uploaded and
loaded there, the signature is read and checked here. A device of another CPU takes a
library built for it (``build(..., target={"tag": "accel", "mtriple": ..., "mcpu": ...})``)
and linked by its compiler (``save(..., cc="aarch64-linux-gnu-gcc")``).
"""

from __future__ import annotations

import os

import tvm
from tvm import relax

from ..reporting import Report
from . import pool
from .model import Model
from .remote import load_weights, session_of, upload_module
from .signature import (
    TensorSpec,
    executable_inputs,
    read_signature,
    signature_path,
    weights_of,
    weights_path,
    write_signature,
)


def save(
    executable: relax.VMExecutable, library: str | os.PathLike, meta: dict | None = None, *, cc: str | None = None
) -> list[str]:
    """Export `executable` to `library` (.so), its signature to ``library + ".json"``
    (`write_signature`, with `meta`) and, if it was built with ``weights="separate"``, its
    weights to ``library + ".params"``. Returns the paths of the library and the weights.

    cc: the compiler that links the library (default TVM's: $CXX or g++); for a device of
        another CPU, its cross compiler (``aarch64-linux-gnu-gcc``).
    """
    library, params = os.fspath(library), weights_path(library)
    executable.export_library(library, **({"cc": cc} if cc else {}))
    write_signature(executable, library, meta)
    weights = weights_of(executable)
    if not weights:
        if os.path.isfile(params):  # a stale file would be passed to this main
            os.remove(params)
        return [library]
    tvm.runtime.save_param_dict_to_file({f"w{i}": w for i, w in enumerate(weights)}, params)
    return [library, params]


class Deployed(Model):
    """A saved model loaded for running: ``model(*inputs)`` returns what ``main`` returns.

    inputs: one per model input, in order (`inputs` lists them): tvm.runtime.Tensor, numpy
        arrays or anything ``np.asarray`` reads (a PyTorch CPU tensor), of exactly the dtype
        and shape of the signature (no casting). A symbolic dimension (``batch`` in
        ``[batch, 3, 224, 224]``) takes any size from 1, the same in every input that names it.
        A non-contiguous array is copied; a wrong count, dtype, rank, fixed size or
        symbolic size is a ValueError naming the input, the dimension and what it takes;
        NaN or Inf in a float input is a ValueError unless ``check_finite=False``.

    Safe to call from many threads at once (`accel_target.runtime.model`): each thread gets a
    VirtualMachine of its own (`vm`), and all share the library and the weights.
    `report` is the build's accel_target.Report, as `save` wrote it (None if it wrote none).
    `pool` says whose thread pool the kernels run on: "accel" (`accel_target.runtime.pool`), or
    "tvm" with ``ACCEL_POOL=tvm`` and on a remote device.

    remote: a `accel_target.runtime.remote.Device` (a session is opened on one of its servers)
        or an RPC session: the library and its weights are uploaded and loaded there, inputs
        go there (a Tensor given must be on `device`, the session's CPU), outputs stay there
        (``.numpy()`` copies one back) and `time_ms` times main there. `session` is the
        session; the signature is read and checked here, against the local library file.
    """

    def __init__(self, library: str | os.PathLike, device=None, *, check_finite: bool = True, remote=None):
        library = os.fspath(library)
        if not os.path.isfile(library):
            raise FileNotFoundError(f"accel load: library {library!r} does not exist")
        self.library = library
        self.check_finite = check_finite
        signature = read_signature(library)
        self.signature = signature
        self.report: Report | None = signature["report"]
        self.inputs: list[TensorSpec] = signature["inputs"]
        if remote is None:
            self.device = device or tvm.cpu()
            self.module = tvm.runtime.load_module(library)
            self.pool = "accel" if pool.install(library) else "tvm"
            self.weights = self._load_weights(signature["weights"])
        else:
            self.session = session_of(remote)
            self.device = self.session.cpu() if device is None else device
            self.module = upload_module(self.session, library)
            self.pool = "tvm"
            self.weights = self._upload_weights(signature["weights"])
        self._check_against_executable()

    def _vm_module(self) -> tvm.runtime.Module:
        return self.module

    def _load_weights(self, specs: list[TensorSpec]) -> list:
        path = weights_path(self.library)
        if not self._has_weights_file(specs):
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
        if len(weights) != len(specs):
            raise ValueError(f"accel load: {path!r} holds {len(weights)} weights; the model takes {len(specs)}")
        return self._checked_weights(weights, specs)

    def _upload_weights(self, specs: list[TensorSpec]) -> list:
        """The weights file uploaded and read on the remote device (not copied tensor by tensor)."""
        if not self._has_weights_file(specs):
            return []
        return self._checked_weights(load_weights(self.session, weights_path(self.library), len(specs)), specs)

    def _has_weights_file(self, specs: list[TensorSpec]) -> bool:
        path = weights_path(self.library)
        if not os.path.isfile(path) and specs:
            raise FileNotFoundError(
                f"accel load: weights file {path!r} does not exist; the model takes {len(specs)} weights from it"
            )
        return os.path.isfile(path)

    def _checked_weights(self, weights: list, specs: list[TensorSpec]) -> list:
        # (main checks none of the weights; the kernels check their arguments, in words naming neither)
        path = weights_path(self.library)
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


def load(library: str | os.PathLike, device=None, *, check_finite: bool = True, remote=None) -> Deployed:
    """Load a library written by `save`, with its signature (``.json``) and its weights
    (``.params``, if the model has them); see `Deployed` for calling it.

    remote: run it on a remote device instead, an `accel_target.runtime.remote.Device`
        (``Device("127.0.0.1", 9190, "mybox")``: a server of that key at that RPC tracker) or
        an RPC session.
    """
    return Deployed(library, device, check_finite=check_finite, remote=remote)
