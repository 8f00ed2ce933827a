"""CheckDivisors: an integer division by zero fails the call with an error, as in PyTorch
(``ZeroDivisionError``), instead of taking the process down.

TVM compiles an integer ``divide``, ``floor_divide``, ``mod`` or ``floor_mod`` to the CPU's
division instruction, which traps on a zero divisor: the VM's process died of SIGFPE (a
``torch.remainder`` by a count the data gives, an index computed by ``//``). Each such op whose
divisor is not a constant without zeros (ZeroConstants refuses a constant 0 at build) reads its
divisor plus the tensor of zeros that the index check kernel (accel_target/passes/indexing.py)
returns for it: a zero divisor, marked -1, lies outside [0, 1), and the call fails naming the op
before the division runs. A signed division by -1 is computed as a negation (a remainder of 0):
the least integer divided by -1 traps too, where PyTorch's floor division wraps to the least
integer. Float division is left alone (a zero gives inf or NaN).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import constant_array, tensor_shape

from . import indexing
from .relax_util import rewrite_functions

_DIVISIONS = ("relax.divide", "relax.floor_divide", "relax.mod", "relax.floor_mod")


def _checked_elsewhere(divisor: relax.Expr) -> bool:
    """A constant without zeros, or one number (ZeroConstants refuses a 0 at build)."""
    if not isinstance(divisor, Constant):
        return False
    return divisor.ty.ndim == 0 or bool((constant_array(divisor) != 0).all())


@mutator
class _CheckDivisors(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in _DIVISIONS:
            return call
        divisor = call.args[1]
        dtype, shape = str(getattr(divisor.ty, "dtype", "")), tensor_shape(divisor)
        if not dtype.startswith(("int", "uint")) or shape is None or _checked_elsewhere(divisor):
            return call
        op = call.op.name[len("relax.") :]
        message = f"{op}: an integer division by zero (a divisor known at run time is 0), which PyTorch refuses too"
        bb = self.builder_
        zero = relax.op.equal(divisor, relax.const(0, dtype))
        marks = bb.emit(relax.op.where(zero, relax.const(-1, "int64"), relax.const(0, "int64")))
        zeros = indexing.check(bb, op, marks, [1], [0], indexing.NONE, message)
        checked = bb.emit(relax.op.add(divisor, relax.op.astype(zeros, dtype)), "divisor")
        if dtype.startswith("uint"):
            return relax.Call(call.op, [call.args[0], checked], call.attrs)
        # the least integer by -1 traps too: its quotient is itself (wrapped), its remainder 0
        minus_one = bb.emit(relax.op.equal(checked, relax.const(-1, dtype)))
        safe = bb.emit(relax.op.where(minus_one, relax.const(1, dtype), checked))
        found = bb.emit(relax.Call(call.op, [call.args[0], safe], call.attrs))
        by_minus_one = relax.op.negative(call.args[0]) if "divide" in op else relax.op.zeros_like(found)
        return relax.op.where(minus_one, by_minus_one, found)


@tvm.transform.module_pass(opt_level=0, name="CheckDivisors")
def check_divisors(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every integer division of `mod` whose divisor may be 0 checks it first."""
    return rewrite_functions(_CheckDivisors, mod)
