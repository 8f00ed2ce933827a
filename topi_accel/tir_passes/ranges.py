"""An innermost loop that picks its operand by comparing its index with constants, as one
loop per range of the index.

A concatenation along a tensor's innermost axis (channels, in NHWC: DenseNet concatenates
every earlier layer's features before its batch norm and ReLU) is, in TOPI's compute, one
loop over the output channels whose element is a chain of ``if_then_else(c_k <= i, x_k[i -
c_k], ...)``, one test per operand. Every element runs the tests, and LLVM, vectorizing a
loop that loads from every operand under a condition, spends time growing with the number of
operands (a 30-way concatenation: the longest-compiling kernels of a DenseNet). Cut at each
constant the index is compared with, every range picks one operand for all its elements: the
tests resolve at compile time and each range is a plain copy (with the epilogue fused into
it) that LLVM vectorizes as any other.

`split_ranges` does that to every innermost serial loop of a lowered function whose body
compares the loop's index with constants (``<``, ``<=``, ``>``, ``>=``) in ``if_then_else``
conditions; other conditions stay as they are.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .blocks import substitute

IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")
# a comparison -> (its form with the variable on the left, the constant's shift; the same with
# the variable on the right): `var <= c` is ("lt", c + 1), `c <= var` is ("ge", c)
COMPARISONS = {
    tirx.LT: ("lt", 0, "ge", 1),
    tirx.LE: ("lt", 1, "ge", 0),
    tirx.GT: ("ge", 1, "lt", 0),
    tirx.GE: ("ge", 0, "lt", 1),
}


def _test(cond, var) -> tuple[str, int] | None:
    """`cond` as ("ge", c) for ``var >= c`` or ("lt", c) for ``var < c``; None if it is not a
    comparison of `var` with an integer constant."""
    entry = COMPARISONS.get(type(cond))
    if entry is None:
        return None
    var_left, shift_left, var_right, shift_right = entry
    a, b = cond.a, cond.b
    if a.same_as(var) and isinstance(b, tirx.IntImm):
        return var_left, int(b.value) + shift_left
    if b.same_as(var) and isinstance(a, tirx.IntImm):
        return var_right, int(a.value) + shift_right
    return None


def _tests(body, var) -> list[tuple[str, int]]:
    found = []

    def visit(call):
        if call.op.same_as(IF_THEN_ELSE) and (test := _test(call.args[0], var)) is not None:
            found.append(test)
        return call

    tvm_ffi.structural_map(body, (tvm.ir.Call, visit), order="post")
    return found


def _resolved(body, var, lo: int, hi: int):
    """`body` for `var` in [lo, hi), a range no constant it is compared with cuts."""

    def resolve(call):
        if not call.op.same_as(IF_THEN_ELSE) or (test := _test(call.args[0], var)) is None:
            return call
        kind, c = test
        holds = c <= lo if kind == "ge" else hi <= c
        return call.args[1] if holds else call.args[2]

    return tvm_ffi.structural_map(body, (tvm.ir.Call, resolve), order="post")


def _has_loop(body) -> bool:
    loops = []
    tvm_ffi.structural_map(body, (tirx.For, lambda node: loops.append(node) or node), order="post")
    return bool(loops)


def _split(loop: tirx.For) -> tirx.Stmt:
    if (
        loop.kind != tirx.ForKind.SERIAL
        or not isinstance(loop.min, tirx.IntImm)
        or loop.min.value != 0
        or not isinstance(loop.extent, tirx.IntImm)
        or _has_loop(loop.body)
    ):
        return loop
    extent, var = int(loop.extent.value), loop.loop_var
    cuts = sorted({c for _, c in _tests(loop.body, var) if 0 < c < extent})
    if not cuts:
        return loop
    bounds = [0, *cuts, extent]
    ranges = []
    for lo, hi in zip(bounds, bounds[1:]):
        inner = tirx.Var(var.name, var.ty.dtype)
        body = substitute(_resolved(loop.body, var, lo, hi), {var: inner + tirx.const(lo, var.ty.dtype)})
        ranges.append(tirx.For(inner, tirx.const(0, var.ty.dtype), tirx.const(hi - lo, var.ty.dtype), loop.kind, body))
    return tirx.SeqStmt(ranges)


def split_ranges(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each innermost loop that compares its index with constants split at them;
    None if it has none."""
    body = tvm_ffi.structural_map(func.body, (tirx.For, _split), order="post")
    if body.same_as(func.body):
        return None
    # each range's copy of the body defines its variables (let bindings) anew
    return tirx.transform.ConvertSSA()(tvm.IRModule({"main": func.with_body(body)}))["main"]
