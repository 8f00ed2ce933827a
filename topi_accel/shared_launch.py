"""Consecutive kernels as one kernel that launches TVM's thread pool once.

Each top-level parallel loop of a kernel is a launch of TVM's thread pool: the calling
thread hands each worker its share and waits for all of them. accel's idle workers sleep
(`accel_target.threads`: spinning ones take the cores that other libraries' threads want
next), so every launch wakes one: 10-15 us on a 2-core VM, a sixth of MobileNetV2's time.
(The libraries accel loads run on accel's pool, `accel_target.pool`, through the same two
calls, launch and barrier; it gives a launch with barriers only the workers on a core.)

`merge` makes one kernel of kernels that run one after the other: a single launch
(TVM's ``pragma_parallel_launch_point``) in which every top-level parallel loop of every
kernel is split among the launch's tasks as TVM splits the loop of a launch of its own,
followed by a barrier (``pragma_parallel_barrier_when_finish``) where the kernel's own
launch would have ended. Inside a launch every task runs the whole body, so the rest moves:

- what a kernel computes outside its parallel loops runs on the first task only (a
  parallel loop of two iterations whose first one does it: a loop of one iteration would
  be simplified away), then a barrier;
- the buffers a kernel allocates outside its parallel loops, and the zeroing of its
  claimed loops' counters (`workshare`, marked CLAIM_RESET), come before the launch, so
  that every task sees the same ones;
- the kernels' parameters become declarations (views) of the merged kernel's parameters,
  one per distinct argument of the calls.

The price is compile time: a merged kernel holds a copy of each kernel it calls, where
the module had one function for identical calls (ResNet-50: 70 calls of 30 kernels, built
in 15 s instead of 7.5).

Kernels of symbolic shapes join too: where a kernel takes an argument that an earlier one
of the launch took, its shape variables become that one's (`_unified`), so that one set of
variables, bound from the merged kernel's arguments, shapes them all.

A kernel joins only as TVM's lowering leaves it (`joining`): dimensions that are numbers or
variables, parallel loops at the top level only, no assertion (`accel_target.indexing`'s
check: one that fails in a task of the launch would leave the other tasks waiting at the
next barrier), and lowered again without error (not the int8 kernels, see
`workshare.claim_iterations`). A kernel that ClaimIterations (or
SerialSmallKernels) lowered and checked (`workshare.LOWERED`) joins as it is: lowered once
more, then again by the build, its claimed loops of a symbolic extent cost TVM's buffer
compaction tens of seconds (a 3-conv model of symbolic batch built in 116 s instead of 3). `accel_target.launches` finds
the runs in `main`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .workshare import CLAIM_RESET, LOWERED, accepted, lower_blocks

LAUNCH = "pragma_parallel_launch_point"
BARRIER = "pragma_parallel_barrier_when_finish"
IMPORT_LLVM = "pragma_import_llvm"
# a merged kernel's name: PREFIX<i>, then its members' names, SEPARATOR between them (the only
# sign of them in the VM's bytecode); its MEMBERS attribute: [[name, implementation or ""], ...]
PREFIX, SEPARATOR = "shared_launch", "__"
MEMBERS = "accel.shared_launch_members"
# kernels per shared launch at most: TVM's lowering and LLVM take superlinear time in a
# kernel's size (ResNet-50's kernels, merged 8 / 16 / 32 / 64 at a time: 0.14 / 0.21 / 0.31 /
# 0.32 s a kernel, 0.12 alone); each launch more costs one wake-up (10-15 us)
MAX_MEMBERS = 8


@dataclass(frozen=True)
class Parts:
    """A lowered kernel taken apart for `merge`: its parameters; what runs before the launch
    (`before`: allocations, counters zeroed); inside it, in order (`inside`: declarations,
    then each piece of work followed by a barrier); the LLVM IR it imports; whether it has
    a parallel loop at all."""

    params: tuple
    before: tuple
    inside: tuple
    imports: tuple[str, ...]
    parallel: bool


@dataclass(frozen=True)
class Joining:
    """A kernel that can join a shared launch: lowered, and whether it has a parallel loop."""

    lowered: tirx.PrimFunc
    parallel: bool


def member_names(name: str) -> list[str] | None:
    """The kernels that the merged kernel named `name` runs, or None if it is not one."""
    head, *members = name.split(SEPARATOR)
    return members if head.startswith(PREFIX) and members else None


def _contains(stmt: tirx.Stmt, found) -> bool:
    """Whether `stmt` or a statement within it is one that found(statement) is true of."""
    if found(stmt):
        return True
    if isinstance(stmt, tirx.SeqStmt):
        return any(_contains(s, found) for s in stmt.seq)
    if isinstance(stmt, tirx.IfThenElse):
        return any(_contains(s, found) for s in (stmt.then_case, stmt.else_case) if s is not None)
    body = getattr(stmt, "body", None)
    return isinstance(body, tirx.Stmt) and _contains(body, found)


def _has_parallel(stmt: tirx.Stmt) -> bool:
    return _contains(stmt, lambda s: isinstance(s, tirx.For) and s.kind == tirx.ForKind.PARALLEL)


def _top_level(stmt: tirx.Stmt, imports: list) -> list:
    """The statements of a lowered kernel's body in order, LLVM imports peeled off."""
    if isinstance(stmt, tirx.SeqStmt):
        return [t for s in stmt.seq for t in _top_level(s, imports)]
    if isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == IMPORT_LLVM:
        imports.append(str(stmt.value.value))
        return _top_level(stmt.body, imports)
    return [stmt]


def _then_barrier(stmt: tirx.Stmt) -> tirx.Stmt:
    return tirx.AttrStmt(tirx.const(0, "int32"), BARRIER, 1, stmt)


def _first_task_only(stmt: tirx.Stmt) -> tirx.Stmt:
    task = tirx.Var("task", "int32")
    return tirx.For(task, 0, 2, tirx.ForKind.PARALLEL, tirx.IfThenElse(task == 0, stmt, None))


def _joins(ty) -> bool:
    """Whether a parameter of type `ty` can be one of a merged kernel: a buffer whose dimensions
    are numbers, or variables where it has no layout of its own (TVMScript's buffers'
    layouts name the shape variables, which `merge` does not rename in them), and whose offset
    and strides are numbers (TVM's scan kernel, cumsum, takes its input at an offset of a
    variable that only a kernel's own parameters bind)."""
    shape = getattr(ty, "shape", None)
    if shape is None or not all(isinstance(d, (tirx.IntImm, tirx.Var)) for d in shape):
        return False
    placement = [ty.elem_offset, *(ty.strides or ())]
    if not all(v is None or isinstance(v, tirx.IntImm) for v in placement):
        return False
    return ty.layout is None or all(isinstance(d, tirx.IntImm) for d in shape)


def joining(func: tirx.PrimFunc) -> Joining | None:
    """`func` (a kernel, scheduled or lowered) lowered, if it can join a shared launch (see
    the module's docstring), else None."""
    if not all(_joins(param.ty) for param in func.params):
        return None
    if LOWERED in (func.attrs or {}):
        lowered = func
    else:
        lowered = lower_blocks(compact_again=False)(tvm.IRModule({"main": func}))["main"]
        lowered = accepted(lowered)
    if lowered is None or _contains(lowered.body, lambda s: isinstance(s, tirx.AssertStmt)):
        return None
    found = _parts(lowered)
    return None if found is None else Joining(lowered, found.parallel)


def _parts(lowered: tirx.PrimFunc) -> Parts | None:
    before, inside, imports, parallel = [], [], [], False
    for stmt in _top_level(lowered.body, imports):
        if isinstance(stmt, tirx.AllocBuffer):
            before.append(stmt)
        elif isinstance(stmt, (tirx.DeclBuffer, tirx.Bind)):
            inside.append(stmt)
        elif isinstance(stmt, tirx.For) and CLAIM_RESET in stmt.annotations:
            before.append(stmt)
        elif isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL:
            if _has_parallel(stmt.body):
                return None
            inside.append(_then_barrier(stmt))
            parallel = True
        elif _has_parallel(stmt):  # (a parallel loop inside a serial one: a launch per iteration)
            return None
        else:
            inside.append(_then_barrier(_first_task_only(stmt)))
    return Parts(tuple(lowered.params), tuple(before), tuple(inside), tuple(imports), parallel)


def _index(args: list, arg) -> int | None:
    """Where `arg` is among the merged kernel's arguments `args` (told apart by `same_as`)."""
    return next((i for i, known in enumerate(args) if known.same_as(arg)), None)


def argument_pattern(calls_args: list[list]) -> tuple[list, tuple[int, ...]]:
    """(the distinct arguments of a run of calls, in the order `merge` gives its kernel's
    parameters; the position among them of every argument of every call): runs of the same
    kernels whose arguments repeat alike merge into the same kernel."""
    args, pattern = [], []
    for call_args in calls_args:
        for arg in call_args:
            index = _index(args, arg)
            if index is None:
                index = len(args)
                args.append(arg)
            pattern.append(index)
    return args, tuple(pattern)


def _unified(func: tirx.PrimFunc, call_args: list, args: list, params: list) -> tirx.PrimFunc:
    """`func` with its shape variables replaced by the merged kernel's where it shares an
    argument with an earlier kernel of the launch."""
    mapping = {}
    for param, arg in zip(func.params, call_args, strict=True):
        index = _index(args, arg)
        if index is None:
            continue
        for dim, known in zip(param.ty.shape, params[index].ty.shape, strict=True):
            if isinstance(dim, tirx.Var) and dim not in mapping:
                mapping[dim] = known
            elif not tvm_ffi.structural_equal(mapping.get(dim, dim), known):
                shapes = list(param.ty.shape), list(params[index].ty.shape)
                raise ValueError(f"shape {shapes[0]} of {param.name} differs from the launch's {shapes[1]}")
    if not mapping:
        return func
    variables = list(mapping)
    return tirx.PrimFunc([*variables, *func.params], func.body).specialize(mapping)


def merge(members: list[tuple[Joining, list]]) -> tuple[tirx.PrimFunc, list]:
    """One kernel for the kernels (`joining`, arguments of the call) called in this order:
    (the kernel, the arguments to call it with). Arguments are told apart by `same_as`."""
    args, pattern = argument_pattern([call_args for _, call_args in members])
    positions = iter(pattern)
    params, before, inside, imports = [], [], [], []
    for kernel, call_args in members:
        # (the arguments of the kernels before this one: those that have parameters already)
        part = _parts(_unified(s_tir.renew_defs(kernel.lowered), call_args, args[: len(params)], params))
        for param, _ in zip(part.params, call_args, strict=True):
            index = next(positions)
            if index == len(params):  # an argument's first use
                params.append(tirx.Var(f"arg{index}", param.ty))
            inside.append(tirx.DeclBuffer(param, data=params[index].data))
        before += part.before
        inside += part.inside
        imports += [ir for ir in part.imports if ir not in imports]
    body = tirx.SeqStmt([*before, tirx.AttrStmt(tirx.const(0, "int32"), LAUNCH, 1, tirx.SeqStmt(inside))])
    for ir in imports:
        body = tirx.AttrStmt(tirx.const(0, "int32"), IMPORT_LLVM, tvm.ir.StringImm(ir), body)
    # (not checked here: the lowering of a merged kernel takes superlinear time in its size, and
    # accel_target.build builds again without shared launches where the build fails).
    # noalias as every kernel (TVM's LLVM code generator drops it from all of a module's
    # functions if one lacks it), though the VM's memory plan may give two arguments the same
    # memory: tensors that never live at once, read and written by different kernels, whose
    # code runs in the launch's closure, the barriers (opaque calls) between them
    return tirx.PrimFunc(params, body).with_attr("tirx.noalias", True), args
