"""Schedule choices as data: a JSON database of the best config per kernel shape.

The configs come from rules on the target's vector width and register budget
(`topi_accel.conv2d_configs`); `accel_target.tune` times the candidates of a model's convs
in the model (`tune_conv2d` times one shape's alone), and a `TuningDB` keeps the winners in
a JSON file. While a database is in use (``with using(db):``), `conv2d_config` returns its
entry for a shape it holds.

`lowered_kernel_steps` is the one list of what the build does to every kernel after
TVM's lowering; the build's pipeline runs it (accel_target.pipeline.lowering_passes),
and the tuner times each candidate after it (`finish_kernel`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict

import tvm
from tvm import tirx

from . import symbolic
from .epilogue import accel_impl
from .knobs import cpu_knobs
from .tir_passes import casts, nan_extrema, prefetch, round_even, serial, wholetiles

# a kernel rewrite: the new function, or None where it changes nothing
KernelRewrite = Callable[[tirx.PrimFunc], "tirx.PrimFunc | None"]

_ACTIVE: contextvars.ContextVar[TuningDB | None] = contextvars.ContextVar("accel_tuning_db", default=None)


class TuningDB:
    """Best configs by kernel key, kept in a JSON file ({key: {"config": {...}, "ms": float}})."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.entries: dict[str, dict] = {}
        if os.path.isfile(self.path):
            with open(self.path) as f:
                self.entries = json.load(f)

    def get(self, key: str) -> dict | None:
        entry = self.entries.get(key)
        return None if entry is None else entry["config"]

    def put(self, key: str, config, ms: float) -> None:
        self.entries[key] = {"config": asdict(config), "ms": ms}

    def save(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.entries, f, indent=1, sort_keys=True)


@contextlib.contextmanager
def using(db: TuningDB | None) -> Iterator[None]:
    """Within this block, configs come from `db` where it has them."""
    token = _ACTIVE.set(db)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def lookup(key: str) -> dict | None:
    db = _ACTIVE.get()
    return None if db is None else db.get(key)


def kernel_key(kind: str, shape_fields: dict, target: tvm.target.Target) -> str:
    """A stable key: kernel kind, its shape and attributes, and what the schedule reads from the target."""
    knobs = cpu_knobs(target)
    return json.dumps({"kind": kind, **shape_fields, "lanes": knobs.lanes, "parallel": knobs.parallel}, sort_keys=True)


# Iterations of its innermost statements below which a kernel runs on the calling thread
# alone (a thread pool's launch costs more than a second thread saves): an accel kernel's are
# vector FMAs, counted per float32 lane of the target's FMA pipes (`CPUKnobs.fma_lanes`): 1M
# multiply-adds on AVX-512, 0.5M on AVX2 and on Zen 4, whose AVX-512 FMAs run in two 256-bit
# halves; TVM's own kernels' are mostly scalar loads and stores.
MIN_PARALLEL_WORK_PER_LANE = 1 << 16
MIN_PARALLEL_WORK_SCALAR = 1 << 15


def serial_when_small(func: tirx.PrimFunc, knobs) -> tirx.PrimFunc | None:
    """`func` with its parallel loops serial if its work is small (serial.serial_when_small):
    below MIN_PARALLEL_WORK_PER_LANE FMA-pipe lanes for an accel kernel, where a statement
    outside a vectorized loop (a broadcasting consumer after the kernel: a squeeze-excitation
    gate scaling a whole image) weighs as in TVM's own kernels, below
    MIN_PARALLEL_WORK_SCALAR statements. One of TVM's kernels that computes each row's
    producers into buffers of its own (`generic._row_by_row`) stays parallel: made serial,
    LLVM's loop vectorizer on AVX2 targets read a row's slice of such a buffer past its end
    (SAM's relative-position bias: the next row's slice, unwritten on the first call, so NaN;
    see serial.computes_rows_in_buffers)."""
    if accel_impl(func) is None:
        if serial.computes_rows_in_buffers(func):
            return None
        return serial.serial_when_small(func, MIN_PARALLEL_WORK_SCALAR)
    per_lane = MIN_PARALLEL_WORK_PER_LANE * knobs.fma_lanes
    return serial.serial_when_small(func, per_lane, per_lane // MIN_PARALLEL_WORK_SCALAR)


def lowered_kernel_steps(target: tvm.target.Target | None = None) -> list[tuple[str, KernelRewrite]]:
    """(name, rewrite) of each step the build applies to every kernel after its schedule, in
    order: on a target with several cores, small kernels made serial
    (topi_accel.tir_passes.serial); round half to even as a vector instruction
    (topi_accel.tir_passes.round_even); values stored as bfloat16 bound first
    (topi_accel.tir_passes.casts); floating maxima and minima that propagate NaN
    (topi_accel.tir_passes.nan_extrema); shape parameters known non-negative
    (topi_accel.symbolic); whole tiles written back without their tail conditions
    (topi_accel.tir_passes.wholetiles); the prefetches the schedules asked for
    (topi_accel.tir_passes.prefetch)."""
    knobs = cpu_knobs(target)
    steps: list[tuple[str, KernelRewrite]] = []
    if knobs.parallel:
        steps.append(("SerialSmallKernels", lambda func: serial_when_small(func, knobs)))
    steps += [
        ("RoundEven", lambda func: round_even.round_even(func)),
        ("BoundStores", lambda func: casts.bound_stores(func)),
        ("PropagateNaN", lambda func: nan_extrema.propagate_nan(func)),
        ("SizesNonNegative", lambda func: symbolic.sizes_non_negative(func)),
        ("WholeTiles", lambda func: wholetiles.whole_tiles(func)),
        ("InsertPrefetches", lambda func: prefetch.insert_prefetches(func)),
    ]
    return steps


def finish_kernel(func: tirx.PrimFunc, target: tvm.target.Target | None = None) -> tirx.PrimFunc:
    """`func` (scheduled) after `lowered_kernel_steps`, as the build runs it: what a tuner times."""
    for _, rewrite in lowered_kernel_steps(target):
        func = rewrite(func) or func
    return func
