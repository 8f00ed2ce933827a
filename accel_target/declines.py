"""What a build step of ours does where it fails: leave what it would change as it was, and say so.

A graph pass, a kernel rewrite or a merge of kernels that raises leaves the module or the
kernel as it was and calls `decline`: a `Decline` goes to every open `recording_declines()`
block and to the "accel" logger; in strict mode it is a StrictModeError instead. (A strategy
that fails hands its op to the next implementation; the report reads those failures from the
kernels, strategy.dispatch.)
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from strategy.registry import StrictModeError, is_strict, reason_of

_DECLINES: contextvars.ContextVar[tuple[list, ...]] = contextvars.ContextVar("accel_declines", default=())
_LOGGER = logging.getLogger("accel")


@dataclass(frozen=True)
class Decline:
    """A build step that left something as it was because it failed there: `where` is a
    kernel (PrimFunc) name, an op call, or "module" for a whole-module pass."""

    step: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.step} declined {self.where}: {self.reason}"


@contextlib.contextmanager
def _logging_to(logs: tuple[list, ...]) -> Iterator[None]:
    token = _DECLINES.set(logs)
    try:
        yield
    finally:
        _DECLINES.reset(token)


@contextlib.contextmanager
def recording_declines() -> Iterator[list]:
    """``with recording_declines() as log:`` collects the Decline of every step that failed in
    the block. Blocks nest: a decline goes to the log of every open block."""
    log: list = []
    with _logging_to(_DECLINES.get() + (log,)):
        yield log


@contextlib.contextmanager
def provisional_declines() -> Iterator[list]:
    """``with provisional_declines() as log:`` collects the Declines of the block in `log`
    alone, for an attempt that may be discarded; `keep(log)` passes them on to the blocks
    open around it."""
    log: list = []
    with _logging_to((log,)):
        yield log


def keep(declines: list) -> None:
    """Add `declines` (from `provisional_declines`) to every open `recording_declines()` block."""
    for log in _DECLINES.get():
        log.extend(declines)


def decline(step: str, where: str, err: BaseException | str) -> Decline:
    """Record that `step` failed on `where` and left it as it was (logged as a warning); in
    strict mode raise StrictModeError instead, from `err`."""
    found = Decline(step, where, err if isinstance(err, str) else reason_of(err))
    if is_strict():
        cause = None if isinstance(err, str) else err
        raise StrictModeError(f"{found}; strict mode forbids leaving it as it was") from cause
    _LOGGER.warning("%s (left as it was)", found)
    for log in _DECLINES.get():
        log.append(found)
    return found


def attempt(step: str, where: str, fn: Callable, *args, default=None):
    """fn(*args); where it raises, `default` and the failure declined (see `decline`): what
    `fn` would have rewritten stays as it was."""
    try:
        return fn(*args)
    except StrictModeError:
        raise
    except Exception as err:  # any failure leaves it as it was
        decline(step, where, err)
        return default
