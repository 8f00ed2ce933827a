"""A model to call: ``model(*inputs)`` checks the inputs against main's signature and runs main
on a VirtualMachine of the calling thread's own. `Deployed` (what `load` gives) and
`AccelExecutable` (what `build` gives) are both a `Model`.

TVM's VirtualMachine keeps its registers and program counter in the object, so two threads
calling one VM corrupt each other (wrong results, errors from inside the VM, segfaults).
A Model gives each thread a VM of its own over the one module, made on the thread's first
call and dropped with the thread; the weights, which the kernels only read, are shared.
Plain `relax.VirtualMachine` users must do the same: one VM per thread, or a lock around
the calls.

On a remote device (`accel_target.runtime.remote`) every call goes through one RPC session,
one connection to one server process: the threads' calls take turns there, under a lock.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import tvm
from tvm import relax

from . import remote
from .signature import TensorSpec, as_array, check_finite, check_shapes


class Model:
    """Call, check and time ``main``: what `Deployed` and `AccelExecutable` share.

    A subclass provides `inputs` (main's own inputs as TensorSpecs, in order), `weights`
    (main's trailing weight arguments, on `device`; None or [] when it has none), `device`
    and `_vm_module()` (the module each thread's VirtualMachine runs). It may set
    `check_finite` (default True) and `session` (the RPC session `device` belongs to).
    """

    inputs: list[TensorSpec]
    weights: list | None
    device: tvm.runtime.Device
    check_finite: bool = True
    session = None

    def _vm_module(self) -> tvm.runtime.Module:
        raise NotImplementedError

    def _thread_state(self):
        """The calling thread's VM and its main function, made on first use."""
        local = self.__dict__.get("_threads") or self.__dict__.setdefault("_threads", threading.local())
        if not hasattr(local, "vm"):
            local.vm = relax.VirtualMachine(self._vm_module(), self.device)
            local.main = local.vm["main"]
        return local

    @property
    def vm(self) -> relax.VirtualMachine:
        """The calling thread's VirtualMachine (made on its first use, dropped with the thread)."""
        return self._thread_state().vm

    def _turn(self):
        """Local calls run at once; a remote device's take turns on its one session."""
        if self.session is None:
            return contextlib.nullcontext()
        return self.__dict__.get("_session_lock") or self.__dict__.setdefault("_session_lock", threading.Lock())

    def _check_tensor(self, value: tvm.runtime.Tensor, spec: TensorSpec, index: int) -> tvm.runtime.Tensor:
        if value.device != self.device:
            raise ValueError(
                f"accel model: input {index} ({spec.name}): "
                f"expected a tensor on {self.device}, given one on {value.device}"
            )
        if self.check_finite:  # (a copy where numpy cannot view the dtype: bfloat16, as ml_dtypes')
            local = self.session is None and spec.dtype != "bfloat16"
            check_finite(np.from_dlpack(value) if local else value.numpy(), spec, index)
        return value

    def check_inputs(self, inputs) -> list:
        """`inputs` checked against the signature (count, dtype, shape, NaN/Inf: errors name the
        input and what it takes) and converted to tvm Tensors on the device."""
        if len(inputs) != len(self.inputs):
            listed = ", ".join(s.describe() for s in self.inputs)
            raise ValueError(f"accel model: takes {len(self.inputs)} input(s) ({listed}), given {len(inputs)}")
        values = [as_array(value, spec, index) for index, (value, spec) in enumerate(zip(inputs, self.inputs))]
        for index, (value, spec) in enumerate(zip(values, self.inputs)):
            if str(value.dtype) != spec.dtype:
                raise ValueError(
                    f"accel model: input {index} ({spec.name}): expected dtype {spec.dtype}, given {value.dtype}"
                )
        check_shapes([tuple(int(d) for d in value.shape) for value in values], self.inputs)
        tensors = []
        for index, (value, spec) in enumerate(zip(values, self.inputs)):
            if isinstance(value, tvm.runtime.Tensor):
                tensors.append(self._check_tensor(value, spec, index))
                continue
            if self.check_finite:
                check_finite(value, spec, index)
            tensors.append(tvm.runtime.tensor(np.asarray(value, order="C"), device=self.device))  # (0-d stays 0-d)
        return tensors

    def __call__(self, *inputs):
        """What main returns for `inputs` (see `check_inputs`), on the device: a Tensor, or a
        tuple of them."""
        tensors = self.check_inputs(inputs)
        with self._turn():
            result = self._thread_state().main(*tensors, *(self.weights or ()))
            return result if self.session is None else remote.fetch(self.session, result)

    def times_ms(self, *inputs, number: int = 10, repeat: int = 1) -> list[float]:
        """ms a run of main takes on `inputs`, `repeat` times the mean of `number` runs, timed on
        the device by TVM's time_evaluator (after one run it does not time)."""
        tensors = self.check_inputs(inputs)
        with self._turn():
            timer = self.vm.time_evaluator("main", self.device, number=number, repeat=repeat)
            return [seconds * 1e3 for seconds in timer(*tensors, *(self.weights or ())).results]

    def time_ms(self, *inputs, number: int = 10) -> float:
        """Mean ms of `number` runs of main on `inputs` (`times_ms`)."""
        return self.times_ms(*inputs, number=number)[0]
