"""Round half to even as a vector instruction.

``tirx.nearbyint`` is the rounding of every quantize (ONNX's and PyTorch's round half to
even). TVM 0.27 registers it without the ``TVectorizable`` attribute of its other
elementwise intrinsics, so its VectorizeLoop makes every loop that rounds scalar again: the
requantize in an int8 kernel's write-back then costs as much as the kernel. LLVM's
``llvm.roundeven`` is the same rounding, lane by lane, and TVM vectorizes calls of LLVM's
pure intrinsics, so `round_even` writes every ``nearbyint`` of a kernel as that call.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

NEARBYINT = tvm.ir.Op.get("tirx.nearbyint")


def _as_roundeven(call: tvm.ir.Call) -> tirx.PrimExpr:
    if not call.op.same_as(NEARBYINT) or not call.ty.dtype.startswith("float"):
        return call
    return tirx.call_llvm_pure_intrin(call.ty.dtype, "llvm.roundeven", *call.args)


def round_even(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each ``nearbyint`` as ``llvm.roundeven``; None if it has none."""
    body = tvm_ffi.structural_map(func.body, (tvm.ir.Call, _as_roundeven), order="post")
    return None if body.same_as(func.body) else func.with_body(body)
