"""Strassen: a large matrix product with a constant weight as seven half-size products.

``x @ W`` with x [*rows, K] (their product M) and W a constant [K, N], M, K and N even,
splits each operand into 2x2 blocks and computes

    P1 = (A11 + A22) (B11 + B22)    P2 = (A21 + A22) B11    P3 = A11 (B12 - B22)
    P4 = A22 (B21 - B11)            P5 = (A11 + A12) B22    P6 = (A21 - A11) (B11 + B12)
    P7 = (A12 - A22) (B21 + B22)

    C11 = P1 + P4 - P5 + P7    C12 = P3 + P5    C21 = P2 + P4    C22 = P1 - P2 + P3 + P6

seven products of an eighth of the work each instead of eight: 7/8 of the multiply-adds.
The weight's sums are constants, computed here by numpy once at compile time (the weights
take 7/4 of their memory, as Winograd's transformed weights take more than theirs). Three
kernels run: `strassen_lefts` stacks the seven left operands [7, M/2, K/2] in one pass over
x, `batch_dense_kn` computes the seven products (each weight packed as dense_kn's), and
`strassen_combine` sums them into the four blocks of the result, [*rows, N], taking whatever
elementwise op follows the product (a bias, GELU, a residual add) into its write-back.

The sums as the graph's own ops (slices, adds, concats) cost more: 17 kernels a product,
as e55f67a had them; stacked by a concat for one batched product, FuseOps fused the next
product's sums with the previous one's GELU, computing it again per use (1.9 ms of BERT-2L's
16 with AVX2 code). Against e55f67a, `bench_ab.py --base e55f67a --models bert_base_2layers
[--mcpu haswell] --rounds 40`, 2 threads, Zen 5, gave B / A 0.918 with AVX2 code and 0.923
with AVX-512 (there e55f67a took no Strassen at 128 rows: three A/Bs of its form had found
0.98x-1.01x the time). On Zen 4, whose 512-bit FMAs run at the 256-bit rate, BERT-2L with
AVX-512 took 0.992 of the time without it (`bench_ab.py --set
accel_target.strassen.MIN_FEATURES=100000 --rounds 40`, 68b098c): little, but no loss.

Taken at MIN_ROWS rows and MIN_FEATURES inputs and outputs. Measured as a product with its
bias and GELU alone (plain / Strassen, ms, three timings each, 2 threads, Zen 5), AVX2 code:
128x768x3072 2.76-2.79 / 2.45-2.52, 128x768x768 0.69-0.70 / 0.61-0.62, 64x768x768
0.35-0.36 / 0.31, 128x512x512 0.32-0.33 / 0.30, 32x1024x1024 0.33 / 0.31, 64x256x256 0.04
/ 0.04; AVX-512 code: 128x768x3072 1.39-1.46 / 1.32-1.46, 128x768x768 0.34-0.35 /
0.33-0.36, 64x768x768 0.18 / 0.20, 128x512x512 0.16 / 0.17-0.20. Below 128 rows and 768
features only AVX2 gains alone, and there the weights stay in the cache between calls;
in a model they come from memory, where the seven products read 7/4 of the weight's
bytes, and no model of our benchmarks has such products, so the thresholds stay where BERT
measured them. One level only: each further level halves the rows again. The result
differs from the plain product by rounding (its error bound is a small multiple of the
plain product's).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

import topi_accel
from strategy.dispatch import kernel_call
from strategy.layout import array_constant, constant_array, static_shape
from topi_accel.knobs import cpu_knobs

from .transforms import MATMUL, _op_name, _resolve, _rewrite_functions

# False: every product stays as it is (plain products bit for bit, the weights at their size).
ENABLED = True
# The least rows (the product of the data's leading axes) a product takes Strassen's form at,
# and the least inputs and outputs (K and N).
MIN_ROWS = 128
MIN_FEATURES = 768
# the implementation the reports name for the two kernels of sums
IMPL = "strassen.accel"


def _eligible(call: relax.Call, weight) -> bool:
    """A float32 matmul of static, even extents, at least MIN_ROWS x MIN_FEATURES x
    MIN_FEATURES, its second operand a 2-D constant."""
    if not ENABLED or not isinstance(weight, tvm.ir.expr.Constant) or len(weight.ty.shape) != 2:
        return False
    shape = static_shape(call.args[0])
    if shape is None or len(shape) < 2 or any(str(e.ty.dtype) != "float32" for e in (call, call.args[0], weight)):
        return False
    m, (k, n) = math.prod(shape[:-1]), (int(d) for d in weight.ty.shape)
    return all(v % 2 == 0 for v in (m, k, n)) and m >= MIN_ROWS and min(k, n) >= MIN_FEATURES


def weight_sums(w: np.ndarray) -> list[np.ndarray]:
    """The seven right operands of Strassen's products, for W [K, N] (K, N even)."""
    k, n = w.shape[0] // 2, w.shape[1] // 2
    b11, b12, b21, b22 = w[:k, :n], w[:k, n:], w[k:, :n], w[k:, n:]
    return [b11 + b22, b11, b12 - b22, b21 - b11, b22, b11 + b12, b21 + b22]


@mutator
class _Strassen(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if _op_name(call) != MATMUL:
            return call
        weight = _resolve(self, call.args[1])
        if not _eligible(call, weight):
            return call
        return self._strassen(call.args[0], constant_array(weight))

    def _strassen(self, x: relax.Expr, w: np.ndarray) -> relax.Expr:
        """The three kernels of the module's docstring, for x [*rows, K] @ w [K, N]."""
        bb, shape, dtype = self.builder_, static_shape(x), str(x.ty.dtype)
        m, k, n = math.prod(shape[:-1]), shape[-1], w.shape[1]
        flat = bb.emit(relax.op.reshape(x, [m, k])) if len(shape) > 2 else x
        parallel = cpu_knobs().parallel  # (of the target in scope)
        lefts = topi_accel.strassen_lefts_func(m // 2, k // 2, dtype, parallel)
        stacked = bb.emit(
            kernel_call(bb, lefts, "strassen_lefts", IMPL, [flat], relax.TensorType([7, m // 2, k // 2], dtype))
        )
        products = bb.emit(relax.op.matmul(stacked, array_constant(np.stack(weight_sums(w)))))
        combine = topi_accel.strassen_combine_func(tuple(shape[:-1]), n, dtype, parallel)
        return kernel_call(bb, combine, "strassen_combine", IMPL, [products], relax.TensorType([*shape[:-1], n], dtype))


@tvm.transform.module_pass(opt_level=0, name="Strassen")
class Strassen:
    """Every eligible product with a constant weight in Strassen's form (see the module)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_Strassen, mod)
