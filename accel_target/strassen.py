"""Strassen: a large matrix product with a constant weight as seven half-size products.

``x @ W`` with x [*rows, K] (their product M) and W a constant [K, N], M, K and N even,
splits each operand into 2x2 blocks and computes

    P1 = (A11 + A22) (B11 + B22)    P2 = (A21 + A22) B11    P3 = A11 (B12 - B22)
    P4 = A22 (B21 - B11)            P5 = (A11 + A12) B22    P6 = (A21 - A11) (B11 + B12)
    P7 = (A12 - A22) (B21 + B22)

    C11 = P1 + P4 - P5 + P7    C12 = P3 + P5    C21 = P2 + P4    C22 = P1 - P2 + P3 + P6

seven products of an eighth of the work each instead of eight: 7/8 of the multiply-adds.
The weight's sums are constants, computed here by numpy once at compile time (the weights
take 7/4 of their memory, as Winograd's transformed weights take more than theirs); what
runs is the five sums of the activation's blocks, the seven products on accel's dense
kernel, and the sums of their results, which the build fuses with whatever elementwise op
follows the product (a bias, GELU, a residual add) into one kernel.

Only where the saving outweighs the extra kernels and their memory traffic: at least
MIN_ROWS rows (by the vector width) and MIN_FEATURES inputs and outputs. Measured, 2
threads, Zen 5, as graphs of accel's kernels (plain / Strassen, ms, three timings each).
AVX2 code: 128x768x3072 2.54-2.61 / 2.38-2.41, 256x768x768 1.30-1.34 / 1.22-1.23,
128x768x768 0.65-0.66 / 0.62-0.63, 64x768x768 0.32-0.34 / 0.31-0.36, 32x1024x1024 0.33 /
0.38, 128x512x512 0.29 / 0.39. AVX-512 code: 256x768x768 0.64-0.67 / 0.60-0.62,
128x768x3072 1.24-1.25 / 1.22-1.24, 128x768x768 0.31-0.32 / 0.32, 64x768x768 0.16-0.17 /
0.18. In a model, the halves' products read each weight for half as many rows, so a weight
that comes from memory costs more: BERT-2L (128 rows) with AVX2 code, 1.14x ONNX Runtime
without, 1.18x-1.19x with (benchmarks/README.md); with AVX-512 code at 128 rows, 0.98x, 1.01x
and 0.99x the time in three A/Bs, so not taken there. One level only: each further level halves the
rows again, below where it pays. The result differs from the plain product by rounding
(its error bound is a small multiple of the plain product's).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array, static_shape
from topi_accel.knobs import cpu_knobs

from .transforms import MATMUL, _op_name, _resolve, _rewrite_functions

# False: every product stays as it is (plain products bit for bit, the weights at their size).
ENABLED = True
# The least rows (the product of the data's leading axes) a product takes Strassen's form at,
# by the target's float32 lanes (AVX-512's products run twice as fast, so the sums and the
# extra kernels cost twice as much of them; SSE's taken as AVX2's, not measured), and the
# least inputs and outputs (K and N).
MIN_ROWS = {4: 128, 8: 128, 16: 256}
MIN_FEATURES = 768


def _eligible(call: relax.Call, weight, lanes: int) -> bool:
    """A float32 matmul of static, even extents, at least MIN_ROWS x MIN_FEATURES x
    MIN_FEATURES, its second operand a 2-D constant."""
    if not ENABLED or not isinstance(weight, tvm.ir.expr.Constant) or len(weight.ty.shape) != 2:
        return False
    shape = static_shape(call.args[0])
    if shape is None or len(shape) < 2 or any(str(e.ty.dtype) != "float32" for e in (call, call.args[0], weight)):
        return False
    m, (k, n) = math.prod(shape[:-1]), (int(d) for d in weight.ty.shape)
    min_rows = MIN_ROWS.get(lanes, max(MIN_ROWS.values()))
    return all(v % 2 == 0 for v in (m, k, n)) and m >= min_rows and min(k, n) >= MIN_FEATURES


def weight_sums(w: np.ndarray) -> list[np.ndarray]:
    """The seven right operands of Strassen's products, for W [K, N] (K, N even)."""
    k, n = w.shape[0] // 2, w.shape[1] // 2
    b11, b12, b21, b22 = w[:k, :n], w[:k, n:], w[k:, :n], w[k:, n:]
    return [b11 + b22, b11, b12 - b22, b21 - b11, b22, b11 + b12, b21 + b22]


@mutator
class _Strassen(PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.lanes = cpu_knobs().lanes  # (of the target in scope)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if _op_name(call) != MATMUL:
            return call
        weight = _resolve(self, call.args[1])
        if not _eligible(call, weight, self.lanes):
            return call
        return self._strassen(call.args[0], constant_array(weight))

    def _strassen(self, x: relax.Expr, w: np.ndarray) -> relax.Expr:
        emit, op = self.builder_.emit, relax.op
        shape = static_shape(x)
        m, k, n = math.prod(shape[:-1]), shape[-1], w.shape[1]
        flat = emit(op.reshape(x, [m, k])) if len(shape) > 2 else x
        h, kh = m // 2, k // 2

        def block(r, c):
            return emit(op.strided_slice(flat, [0, 1], [r * h, c * kh], [(r + 1) * h, (c + 1) * kh]))

        a11, a12, a21, a22 = block(0, 0), block(0, 1), block(1, 0), block(1, 1)
        add, sub = (lambda a, b: emit(op.add(a, b))), (lambda a, b: emit(op.subtract(a, b)))
        lefts = [add(a11, a22), add(a21, a22), a11, a22, add(a11, a12), sub(a21, a11), sub(a12, a22)]
        p1, p2, p3, p4, p5, p6, p7 = (emit(op.matmul(a, array_constant(b))) for a, b in zip(lefts, weight_sums(w)))
        top = op.concat([op.add(op.add(p1, p4), op.subtract(p7, p5)), op.add(p3, p5)], axis=1)
        bottom = op.concat([op.add(p2, p4), op.add(op.subtract(p1, p2), op.add(p3, p6))], axis=1)
        out = op.concat([top, bottom], axis=0)
        return op.reshape(out, [*shape[:-1], n]) if len(shape) > 2 else out


@tvm.transform.module_pass(opt_level=0, name="Strassen")
class Strassen:
    """Every eligible product with a constant weight in Strassen's form (see the module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_Strassen, mod)
