"""The FLegalize hook: under an accel target, pick an implementation; else TVM's own.

`install(op)` overrides the op's FLegalize at level 11 and keeps TVM's
function as the op attribute "accel.FLegalizeTVM", which also marks the hook
as installed (so a second install, or a re-import, changes nothing).

An implementation whose condition or legalization raises is declined for that call
(recorded, see registry.decline) and the next one is tried, then TVM's own: a
failing strategy never fails the build, except in strict mode.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import Op

from .registry import Decision, StrictModeError, decline, implementations, is_strict, is_suspended, reason_of, record

ORIGINAL_ATTR = "accel.FLegalizeTVM"
# TVM's kOutEWiseFusable: FuseOps may append elementwise consumers (the
# epilogue), never merge the kernel into something else
OUT_ELEMWISE_FUSABLE = 4


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


def _tag_funcs(bb: relax.BlockBuilder, expr: relax.Expr, key: str, value: str) -> None:
    """Set attribute `key` on every PrimFunc `expr` calls through call_tir."""
    if not isinstance(expr, relax.Call) or not expr.args or not isinstance(expr.args[0], tvm.ir.GlobalVar):
        return
    gvar = expr.args[0]
    func = bb.get()[gvar]
    if isinstance(func, tvm.tirx.PrimFunc):
        bb.update_func(gvar, func.with_attr(key, value))


def _where(call: relax.Call, inputs) -> str:
    return f"{call.op.name} on {', '.join(inputs)}"


def _try(impl, bb: relax.BlockBuilder, call: relax.Call, inputs, failures: list):
    """(legalized expression, None), or (None, why `impl` did not give one): its condition's
    reason, or the error its condition or legalization raised (declined, see registry, and
    appended to `failures`)."""
    try:
        reason = impl.condition(call)
        return (None, reason) if reason is not None else (impl.legalize(bb, call), None)
    except StrictModeError:
        raise
    except Exception as err:  # any failure: the next one, or TVM's kernel
        decline(impl.name, _where(call, inputs), err)
        failures.append(err)
        return None, f"failed: {reason_of(err)}"


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
        result, why = _try(impl, bb, call, inputs, failures)
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
    _tag_funcs(bb, result, "accel.fallback", reason)
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
    """Add a scheduled kernel to the module and return the call_tir to it."""
    func = func.with_attrs({"accel.impl": impl, "op_pattern": OUT_ELEMWISE_FUSABLE})
    if func.attrs is not None and "global_symbol" in func.attrs:  # private, so DCE drops it once fused
        func = func.without_attr("global_symbol")
    gvar = bb.add_func(func, name)
    return relax.call_tir(gvar, args, out_type)
