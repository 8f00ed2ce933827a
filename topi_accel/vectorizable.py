"""TVM 0.27 registers ``tirx.nearbyint`` (round half to even: the round of ONNX and PyTorch,
so of every quantize) without the ``TVectorizable`` attribute that its other elementwise
math intrinsics have (``tirx.round``, ``floor``, ``exp`` ...). Its VectorizeLoop then makes
every vectorized loop that rounds scalar again, and LLVM vectorizes some of those loops
back at 256 bits and some not at all: the requantize after an int8 convolution, written in
its write-back, took twice the convolution's own time (ResNet-50 int8, 56x56 64->256 with a
residual: 0.30 ms against 0.10 without the epilogue).

``llvm.nearbyint`` is elementwise on vectors, the same rounding lane by lane, so marking the
op vectorizable changes the speed and not the bits. `register` does that once, where TVM has
not set the attribute itself (a later TVM that does is left alone).
"""

from __future__ import annotations

import tvm

ROUND_HALF_EVEN = "tirx.nearbyint"


def register() -> None:
    """Mark ``tirx.nearbyint`` vectorizable, unless TVM already says whether it is."""
    if tvm.ir.Op.get(ROUND_HALF_EVEN).get_attr("TVectorizable") is None:
        tvm.ir.register_op_attr(ROUND_HALF_EVEN, "TVectorizable", True)
