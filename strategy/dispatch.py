"""The FLegalize hook: under an accel target, pick an implementation; else TVM's own.

`install(op)` overrides the op's FLegalize at level 11 and keeps TVM's
function as the op attribute "accel.FLegalizeTVM", which also marks the hook
as installed (so a second install, or a re-import, changes nothing).

An implementation whose condition or legalization raises is skipped for that call, its
error logged on the "accel" logger and kept in the call's skipped list ("failed: ..."), and
the next one is tried, then TVM's own: a failing strategy never fails the build, except in
strict mode, where it is a StrictModeError.

The decision travels with the kernels, as PrimFunc attributes that the report reads:
an implementation's legalization adds its kernel through `kernel_call`, which marks it
(topi_accel.epilogue.mark_kernel: the attribute and output-block annotation IMPL, read
by epilogue inlining, WriteInPlace and the report) and records the implementations
skipped before it (SKIPPED); a fallback to TVM's kernel gets FALLBACK (the reasons) and
SKIPPED. An implementation whose legalization made no kernel through `kernel_call` fails like one
that raised.
"""

from __future__ import annotations

import contextvars
import logging

import tvm
from tvm import relax
from tvm.ir import Op

from topi_accel.epilogue import mark_kernel

from .registry import Decision, StrictModeError, implementations, is_strict, is_suspended, reason_of, record

ORIGINAL_ATTR = "accel.FLegalizeTVM"
# PrimFunc attributes: why TVM's kernel (reasons joined), and [[implementation, reason], ...] skipped
FALLBACK = "accel.fallback"
SKIPPED = "accel.skipped"
# TVM's kOutEWiseFusable: FuseOps may append elementwise consumers (the
# epilogue), never merge the kernel into something else
OUT_ELEMWISE_FUSABLE = 4
FAILED = "failed: "  # the start of a skipped implementation's reason when it raised
_LOGGER = logging.getLogger("accel")


def _dim(d):
    return int(d) if isinstance(d, tvm.tirx.IntImm) else d


def describe_inputs(call: relax.Call) -> tuple[str, ...]:
    """'float32[1, 3, 224, 224]' for each tensor argument of `call`."""
    out = []
    for arg in call.args:
        ty = arg.ty
        if isinstance(ty, relax.TensorType):
            dims = "?" if ty.shape is None else ", ".join(str(_dim(d)) for d in ty.shape)
            out.append(f"{ty.dtype}[{dims}]")
    return tuple(out)


def _original(op: Op):
    """TVM's FLegalize kept by `install`, or None before it ran.

    (``Op.has_attr`` cannot tell: it answers True for every op once any op has the attribute.)
    """
    try:
        return op.get_attr(ORIGINAL_ATTR)
    except tvm.error.InternalError:  # no op has the attribute yet
        return None


def tvm_legalize(call: relax.Call):
    """TVM's own FLegalize of the call's op."""
    return _original(call.op)


# the implementations skipped so far for the call being dispatched, and the kernels made for it
_CURRENT: contextvars.ContextVar[tuple[list, list] | None] = contextvars.ContextVar("accel_dispatch", default=None)


def _tag_funcs(bb: relax.BlockBuilder, expr: relax.Expr, attrs: dict) -> None:
    """Set `attrs` on the PrimFunc `expr` calls through call_tir, if it is one."""
    if not isinstance(expr, relax.Call) or not expr.args or not isinstance(expr.args[0], tvm.ir.GlobalVar):
        return
    gvar = expr.args[0]
    func = bb.get()[gvar]
    if isinstance(func, tvm.tirx.PrimFunc):
        bb.update_func(gvar, func.with_attrs(attrs))


def _where(call: relax.Call, inputs) -> str:
    return f"{call.op.name} on {', '.join(inputs)}"


def _legalize(impl, bb: relax.BlockBuilder, call: relax.Call, skipped: list) -> relax.Expr:
    """impl.legalize(bb, call), which must make its kernel through `kernel_call`."""
    made: list = []
    token = _CURRENT.set((skipped, made))
    try:
        result = impl.legalize(bb, call)
    finally:
        _CURRENT.reset(token)
    if impl.name not in made:
        raise ValueError(f"{impl.name} made no kernel through strategy.dispatch.kernel_call")
    return result


def _try(impl, bb: relax.BlockBuilder, call: relax.Call, inputs, failures: list, skipped: list):
    """(legalized expression, None), or (None, why `impl` did not give one): its condition's
    reason, or the error its condition or legalization raised (logged, and appended to
    `failures`; in strict mode a StrictModeError)."""
    try:
        reason = impl.condition(call)
        return (None, reason) if reason is not None else (_legalize(impl, bb, call, skipped), None)
    except StrictModeError:
        raise
    except Exception as err:  # any failure: the next one, or TVM's kernel
        if is_strict():
            raise StrictModeError(f"{impl.name} failed on {_where(call, inputs)}: {reason_of(err)}") from err
        _LOGGER.warning(
            "%s failed on %s: %s (the next implementation takes it)", impl.name, _where(call, inputs), reason_of(err)
        )
        failures.append(err)
        return None, FAILED + reason_of(err)


def _fallback(bb: relax.BlockBuilder, call: relax.Call, failures: list):
    """TVM's own legalization of `call`; where that fails too after an implementation of
    ours failed, our error (it names the op, the value and what is supported)."""
    try:
        return tvm_legalize(call)(bb, call)
    except Exception as err:
        if failures:
            raise failures[0] from err
        raise


def dispatch(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """FLegalize of every covered op: the first implementation (best first) whose condition
    holds and whose legalization succeeds, else TVM's own kernel (recorded with the reasons)."""
    target = tvm.target.Target.current(allow_none=True)
    keys = [] if target is None or is_suspended() else [str(k) for k in target.keys]
    impls = implementations(call.op.name, keys)
    if not impls:
        return tvm_legalize(call)(bb, call)
    inputs, skipped, failures = describe_inputs(call), [], []
    for impl in impls:
        result, why = _try(impl, bb, call, inputs, failures, skipped)
        if why is None:
            record(Decision(call.op.name, impl.name, "", inputs, tuple(skipped)))
            return result
        skipped.append((impl.name, why))
    reason = "; ".join(f"{name}: {why}" for name, why in skipped)
    if is_strict():
        raise StrictModeError(
            f"{call.op.name} on {', '.join(inputs)} has no accel kernel ({reason}); "
            "strict mode forbids the fallback to TVM's kernel"
        )
    result = _fallback(bb, call, failures)
    record(Decision(call.op.name, None, reason, inputs, tuple(skipped)))
    _tag_funcs(bb, result, {FALLBACK: reason, SKIPPED: list(skipped)})
    return result


def install(op_name: str) -> None:
    """Route `op_name`'s legalization through `dispatch` (idempotent)."""
    op = Op.get(op_name)
    if _original(op) is not None:
        return
    original = op.get_attr("FLegalize")
    if original is None:
        raise ValueError(f"strategy: {op_name} has no FLegalize to delegate to")
    tvm.ir.register_op_attr(op_name, ORIGINAL_ATTR, original)
    tvm.ir.register_op_attr(op_name, "FLegalize", dispatch, level=11)


def kernel_call(bb: relax.BlockBuilder, func: tvm.tirx.PrimFunc, name: str, impl: str, args, out_type):
    """Add kernel `func` of implementation `impl` to the module as `name` and return the
    call_tir to it: what makes it an accel kernel (see the module's docstring).

    func: scheduled PrimFunc (args..., outputs...). out_type: a relax.TensorType, or a list
    of them for several outputs.
    """
    current = _CURRENT.get()
    skipped = [] if current is None else current[0]
    num_outputs = len(out_type) if isinstance(out_type, (list, tuple)) else 1
    func = mark_kernel(func, impl, num_outputs).with_attrs({SKIPPED: list(skipped), "op_pattern": OUT_ELEMWISE_FUSABLE})
    if func.attrs is not None and "global_symbol" in func.attrs:  # private, so DCE drops it once fused
        func = func.without_attr("global_symbol")
    gvar = bb.add_func(func, name)
    if current is not None:
        current[1].append(impl)
    return relax.call_tir(gvar, args, out_type)
