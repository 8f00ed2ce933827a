"""accel: an Apache TVM target for NHWC/OHWI convolutions and [in, out] dense layers.

``import accel_target`` registers everything, once:
- the target tag "accel" (`Target("accel")`), tuned for this host;
- the accel kernels as the legalization of conv2d and matmul under any
  target whose keys contain "accel" (other targets keep TVM's own);
- TVM's thread pool sized to every core (unless TVM_NUM_THREADS is set).
"""

import strategy as _strategy

from . import target as _target
from .target import host_cores, host_cpu, is_accel, target_config
from strategy import Decision, StrictModeError, recording, strict

_target.register()
_strategy.install()

__all__ = [
    "Decision",
    "StrictModeError",
    "host_cores",
    "host_cpu",
    "is_accel",
    "recording",
    "strict",
    "target_config",
]
