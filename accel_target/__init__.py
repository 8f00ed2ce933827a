"""accel: an Apache TVM target for NHWC/OHWI convolutions and [in, out] dense layers.

``import accel_target`` registers, once:
- the target tag "accel" (`Target("accel")`), tuned for this host;
- the accel kernels as the legalization of conv2d and matmul under any
  target whose keys contain "accel" (other targets keep TVM's own);
- the Relax pipeline "accel" and the TIR pipeline "accel"
  (``tvm.compile(mod, "accel", relax_pipeline="accel", tir_pipeline="accel")``).

Whole models: `from_torch` / `from_onnx` -> [`tune`] -> `build` (or `optimize`) -> `report`;
`save` / `load` a built model (its weights beside the library with ``build(weights="separate")``).
"""

import strategy as _strategy
from strategy import Decision, StrictModeError, recording, strict

from . import pipeline as _pipeline
from . import target as _target
from .compiler import build, optimize, report
from .declines import Decline, recording_declines
from .frontends import from_onnx, from_torch
from .reporting import Report
from .runtime.deploy import load, save
from .runtime.executable import AccelExecutable
from .target import host_cores, host_cpu, is_accel, machine, num_threads, target_config
from .tools.tuner import tune

_target.register()
_strategy.install()
_pipeline.register()

__all__ = [
    "AccelExecutable",
    "Decision",
    "Decline",
    "Report",
    "StrictModeError",
    "build",
    "from_onnx",
    "from_torch",
    "host_cores",
    "host_cpu",
    "is_accel",
    "load",
    "machine",
    "num_threads",
    "optimize",
    "recording",
    "recording_declines",
    "report",
    "save",
    "strict",
    "target_config",
    "tune",
]
