"""accel: an Apache TVM target for NHWC/OHWI convolutions and [in, out] dense layers.

``import accel_target`` registers everything, once:
- the target tag "accel" (`Target("accel")`), tuned for this host;
- the accel kernels as the legalization of conv2d and matmul under any
  target whose keys contain "accel" (other targets keep TVM's own);
- the Relax pipeline "accel" (`tvm.compile(..., relax_pipeline="accel")`);
- TVM's thread pool sized to every core (unless TVM_NUM_THREADS is set).

Whole models: `from_torch` / `from_onnx` -> [`tune`] -> `build` (or `optimize`) -> `report`;
`save` / `load` a built model (its weights beside the library with ``build(weights="separate")``).
"""

import strategy as _strategy
from strategy import Decision, Decline, StrictModeError, recording, recording_declines, strict

from . import pipeline as _pipeline
from . import target as _target
from .deploy import AccelExecutable, load, save
from .frontend import from_onnx, from_torch
from .pipeline import build, optimize, report
from .reporting import Report
from .target import host_cores, host_cpu, is_accel, machine, num_threads, target_config
from .tuner import tune

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
