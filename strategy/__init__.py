"""Op strategies for the accel target: which kernel each Relax op call gets.

Importing this package registers the implementations in its own registry;
`install()` hooks them into Relax legalization (done by `import accel_target`).
"""

from . import conv1d, conv2d, conv2d_int8, dense, dense_int8, search, strassen  # noqa: F401  (registered only)
from .dispatch import install as _install_op
from .registry import (
    Decision,
    Implementation,
    Options,
    StrictModeError,
    covered_ops,
    implementations,
    recording,
    register,
    select,
    strict,
    suspended,
    using,
)


def install() -> None:
    """Hook every op that has an implementation into FLegalize (idempotent)."""
    for op in covered_ops():
        _install_op(op)


__all__ = [
    "Decision",
    "Implementation",
    "Options",
    "StrictModeError",
    "conv1d",
    "conv2d",
    "covered_ops",
    "dense",
    "implementations",
    "install",
    "recording",
    "register",
    "select",
    "strict",
    "suspended",
    "using",
]
