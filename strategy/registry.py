"""Implementations per Relax op, and the record of what each call got.

The Relax counterpart of Relay's OpStrategy: an implementation has a name
("<compute>.<target key>"), the target key it serves, a condition on the
call (attributes, shapes, dtypes) and a priority level. Adding a kernel is one
`register` call; the dispatcher tries the implementations of an op in
priority order and records why each skipped one did not match.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import tvm.error
from tvm import relax

# A condition returns None when the implementation can take the call, else the reason it cannot.
Condition = Callable[[relax.Call], "str | None"]
Legalize = Callable[[relax.BlockBuilder, relax.Call], relax.Expr]


@dataclass(frozen=True)
class Implementation:
    """One way to lower `op` for targets with `target_key`."""

    op: str
    name: str
    target_key: str
    condition: Condition
    legalize: Legalize
    plevel: int


@dataclass(frozen=True)
class Decision:
    """What one op call got: an implementation, or TVM's own kernel and why."""

    op: str
    implementation: str | None
    reason: str
    inputs: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = field(default=())

    @property
    def fallback(self) -> bool:
        return self.implementation is None


@dataclass(frozen=True)
class Options:
    """What a build asks of the strategies beyond the target (`accel_target.build`'s options).

    strassen: large float32 products with a constant weight as Strassen's seven half-size
        products (strategy/strassen.py): 7/8 of the multiply-adds, results equal to the plain
        product's up to rounding, the weight's memory 7/4.
    """

    strassen: bool = False


@tvm.error.register_error  # keeps its type when raised through tvm.compile
class StrictModeError(RuntimeError):
    """Raised in strict mode when an op would fall back to TVM's generic kernel."""


_IMPLEMENTATIONS: dict[str, list[Implementation]] = {}
_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("accel_strict", default=False)
_SUSPENDED: contextvars.ContextVar[bool] = contextvars.ContextVar("accel_suspended", default=False)
# (Options is frozen: one default instance is safe to share)
_OPTIONS: contextvars.ContextVar[Options] = contextvars.ContextVar("accel_options", default=Options())  # noqa: B039
_LOGS: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("accel_decisions", default=())


def register(op: str, name: str, *, condition: Condition, key: str = "accel", plevel: int = 10):
    """Decorator: register a legalize function as implementation `name` of `op`.

    Re-registering a name replaces it, so re-importing a module is harmless.
    """

    def _register(legalize: Legalize) -> Legalize:
        impls = [i for i in _IMPLEMENTATIONS.get(op, []) if i.name != name]
        impls.append(Implementation(op, name, key, condition, legalize, plevel))
        _IMPLEMENTATIONS[op] = sorted(impls, key=lambda i: -i.plevel)
        return legalize

    return _register


def implementations(op: str, target_keys=None) -> list[Implementation]:
    """The implementations of `op` (for a target with `target_keys`), best first."""
    impls = _IMPLEMENTATIONS.get(op, [])
    if target_keys is None:
        return list(impls)
    keys = {str(k) for k in target_keys}
    return [i for i in impls if i.target_key in keys]


def covered_ops() -> list[str]:
    return sorted(_IMPLEMENTATIONS)


def select(call: relax.Call, target_keys) -> tuple[Implementation | None, list[tuple[str, str]]]:
    """The best implementation whose condition holds, and (name, reason) of those skipped."""
    skipped = []
    for impl in implementations(call.op.name, target_keys):
        try:
            reason = impl.condition(call)
        except Exception as err:  # a failing condition does not match
            reason = f"failed: {reason_of(err)}"
        if reason is None:
            return impl, skipped
        skipped.append((impl.name, reason))
    return None, skipped


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value) -> Iterator:
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def strict(enabled: bool = True):
    """Within this block (``with strict():``), a fallback to TVM's kernel raises StrictModeError."""
    return _setting(_STRICT, enabled)


def is_strict() -> bool:
    return _STRICT.get()


def using(options: Options):
    """Within this block (``with using(Options(strassen=True)):``) the strategies read `options`."""
    return _setting(_OPTIONS, options)


def options() -> Options:
    return _OPTIONS.get()


def suspended():
    """Within this block the dispatcher hands every call to TVM's legalization, records
    nothing and builds no kernel: for passes that legalize only to evaluate, such as
    FoldConstant (it legalizes every call it visits, constant or not)."""
    return _setting(_SUSPENDED, True)


def is_suspended() -> bool:
    return _SUSPENDED.get()


@contextlib.contextmanager
def recording() -> Iterator[list]:
    """``with recording() as log:`` collects the Decision of every call dispatched in the block.
    Blocks nest: a decision goes to the log of every open block."""
    log: list = []
    with _setting(_LOGS, _LOGS.get() + (log,)):
        yield log


def record(decision: Decision) -> None:
    for log in _LOGS.get():
        log.append(decision)


def reason_of(err: BaseException) -> str:
    """One line naming what went wrong: the error's type and the first line of its message
    (a TVM error's message is the check that failed; its C++ stack is kept apart)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
