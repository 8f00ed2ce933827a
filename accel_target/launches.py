"""SharedLaunches: the kernels that `main` calls one after the other run in one launch of
TVM's thread pool (`topi_accel.shared_launch`), instead of waking its sleeping workers once
per kernel.

It runs last, on the module lowered for the VM: the memory is planned by then, every
kernel call is a call with its output buffers as arguments (in-place ones too), and
between two kernel calls there are only the VM's allocations and releases. A run is a
sequence of kernel calls that can join (`topi_accel.shared_launch.joining`) with nothing
else between them but allocations, views (``vm.builtin.reshape``) and releases; it is
cut to start and end with a kernel that has a parallel loop, and needs two such kernels.
The run's allocations and views move before the merged call (they read no data, and the
merged kernel runs its members in order), its releases after it.

The layout transforms stay out of the runs, so that the VM's bytecode still shows them
(`reporting.runtime_kernels`); the merged kernel is named after its members,
``shared_launch<i>__<kernel>__<kernel>...`` (`topi_accel.shared_launch.member_names` reads
it), and carries MEMBERS (the members' names and implementations, for
`reporting.module_kernels`). A run that fails to merge is left as it was (declined); a
build that fails with shared launches is made again without them (`accel_target.build`).
"""

from __future__ import annotations

import contextlib
import contextvars

import tvm
from tvm import relax, tirx

from strategy.registry import attempt
from topi_accel import shared_launch, workshare
from topi_accel.epilogue import IMPL
from topi_accel.knobs import cpu_knobs
from topi_accel.shared_launch import MAX_MEMBERS, MEMBERS, PREFIX, SEPARATOR

from .reporting import TRANSFORM_KERNELS

_MOVABLE = ("relax.vm.alloc_storage", "relax.vm.alloc_tensor")  # read no data
# a view, and a shape read from the shape heap: no kernel of a run writes the heap (a call
# that takes it, a shape function, ends the run, as does the VM's match_shape)
_VIEWS = ("vm.builtin.reshape", "vm.builtin.make_shape")
_RELEASE = "relax.vm.kill_object"
_SHAPE_HEAP = "vm.builtin.alloc_shape_heap"
_OFF = contextvars.ContextVar("accel_shared_launches_off", default=False)


@contextlib.contextmanager
def disabled():
    """Within this block, SharedLaunches leaves modules as they are (every kernel launches
    the pool itself, and a VM instrument times each one)."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def shares(mod: tvm.IRModule) -> bool:
    """Whether `mod` has a kernel that SharedLaunches merged."""
    return any(isinstance(f, tirx.PrimFunc) and MEMBERS in (f.attrs or {}) for f in mod.functions.values())


def _role(binding: relax.Binding, heaps: set) -> str | None:
    """What `binding` is to a run (None: it ends one); `heaps`: the function's shape heaps."""
    value = binding.value
    if not isinstance(binding, relax.VarBinding) or not isinstance(value, relax.Call):
        return None
    if isinstance(value.op, tvm.ir.Op):
        return "move" if value.op.name in _MOVABLE else "release" if value.op.name == _RELEASE else None
    if isinstance(value.op, relax.ExternFunc) and str(value.op.global_symbol) in _VIEWS:
        return "move"
    if isinstance(value.op, tvm.ir.GlobalVar) and not any(a in heaps for a in value.args):
        return "kernel"
    return None


def _shape_heaps(func: relax.Function) -> set:
    """The variables of `func` bound to the VM's shape heap (of a function of symbolic shapes)."""
    return {
        b.var
        for block in func.body.blocks
        for b in block.bindings
        if isinstance(b.value, relax.Call)
        and isinstance(b.value.op, tvm.ir.Op)
        and b.value.op.name == "relax.call_builtin_with_ctx"
        and str(b.value.args[0].global_symbol) == _SHAPE_HEAP
    }


def _key(calls: list) -> tuple[tuple, list]:
    """(what tells merged kernels apart: the kernels called and how their arguments repeat;
    the calls' distinct arguments, the merged kernel's)."""
    args, pattern = shared_launch.argument_pattern([list(c.args) for c in calls])
    return (tuple(c.op for c in calls), pattern), args


def _members(calls: list) -> int:
    """How many of a run's kernel `calls` (its first 2 * MAX_MEMBERS at most) to merge:
    MAX_MEMBERS, or a whole number of periods where the run repeats itself within that (a
    block per sample, `accel_target.microbatch`), so that every period after the first calls
    the same merged kernel instead of a copy of its own (compile time: a merged kernel
    holds a copy of each member)."""
    for period in range(1, min(MAX_MEMBERS, len(calls) // 2) + 1):
        if _key(calls[:period])[0] == _key(calls[period : 2 * period])[0]:
            return period * (MAX_MEMBERS // period)
    return MAX_MEMBERS


class _Runs:
    """The runs of one function's bindings and their merged kernels."""

    def __init__(self, mod: tvm.IRModule):
        self.mod, self.joining, self.count = mod, {}, 0  # joining: kernel -> Joining or None
        self.merged = {}  # (kernels, argument pattern) -> the merged kernel's GlobalVar
        self.heaps = set()  # (of the function whose blocks it is given)
        self.cores = cpu_knobs().cores  # (of the target in scope)
        self.builder = relax.BlockBuilder(mod)  # (it gives the merged kernels typed GlobalVars)

    def part(self, binding):
        """The kernel the binding calls, `Joining`, if it can join a run, else None."""
        gvar = binding.value.op
        if gvar not in self.joining:
            func, name = self.mod[gvar], gvar.name_hint
            joins = (
                isinstance(func, tirx.PrimFunc)
                and SEPARATOR not in name
                and not any(t in name for t in TRANSFORM_KERNELS)
                and len(func.params) == len(binding.value.args)
            )
            self.joining[gvar] = attempt("SharedLaunches", name, self.joins, func) if joins else None
        return self.joining[gvar]

    def joins(self, func: tirx.PrimFunc) -> shared_launch.Joining | None:
        """`func` as it joins a launch: a kernel that SerialSmallKernels made serial joins with
        its loops parallel again (the pool is awake in a launch)."""
        return shared_launch.joining(workshare.parallel_again(func, self.cores) or func)

    def block(self, bindings: list) -> list:
        out, i = [], 0
        while i < len(bindings):
            kernels, j = [], i  # the run from i: kernel calls and movable bindings
            while j < len(bindings) and len(kernels) < 2 * MAX_MEMBERS:
                role = _role(bindings[j], self.heaps)
                if role == "kernel" and self.part(bindings[j]) is not None:
                    kernels.append(j)
                elif role not in ("move", "release"):
                    break
                j += 1
            kernels = kernels[: _members([bindings[k].value for k in kernels])]
            parallel = [k for k in kernels if self.joining[bindings[k].value.op].parallel]
            if len(parallel) < 2 or i != parallel[0]:
                out.append(bindings[i])  # (a run starts at a parallel kernel)
                i += 1
                continue
            end = parallel[-1] + 1
            merged = attempt("SharedLaunches", bindings[i].value.op.name_hint, self.merge, bindings[i:end])
            out += bindings[i:end] if merged is None else merged
            i = end
        return out

    def merge(self, run: list) -> list:
        """The bindings of `run` with its kernel calls as one: allocations and views first,
        then the call, then the releases."""
        calls = [b for b in run if _role(b, self.heaps) == "kernel"]
        key, args = _key([b.value for b in calls])
        if key not in self.merged:  # (a run repeated, a block of a model per sample, is one kernel)
            func, _ = shared_launch.merge([(self.joining[b.value.op], list(b.value.args)) for b in calls])
            names = [b.value.op.name_hint for b in calls]
            name = SEPARATOR.join([f"{PREFIX}{self.count}", *names])
            impls = [str((self.mod[b.value.op].attrs or {}).get(IMPL, "")) for b in calls]
            func = func.with_attr("global_symbol", name).with_attr(MEMBERS, [[n, i] for n, i in zip(names, impls)])
            self.merged[key] = self.builder.add_func(func, name)
            self.count += 1
        gvar = self.merged[key]
        moved = [b for b in run if _role(b, self.heaps) == "move"]
        released = [b for b in run if _role(b, self.heaps) == "release"]
        call = self.builder.normalize(relax.Call(gvar, args))
        return [*moved, relax.VarBinding(calls[0].var, call), *released]


@tvm.transform.module_pass(opt_level=0, name="SharedLaunches")
def share_launches(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every run of kernels in the module's Relax functions as one kernel with one launch
    (see the module's docstring); the kernels merged into one are dropped where nothing
    else calls them. Contained by run (and as a whole), not by a well-formedness check of
    the module: that costs seconds on a model of ResNet-50's size."""
    if _OFF.get():
        return mod
    shared = attempt("SharedLaunches", "module", _share, mod)
    return mod if shared is None else shared


def _share(mod: tvm.IRModule) -> tvm.IRModule:
    runs = _Runs(mod)
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        runs.heaps = _shape_heaps(func)
        blocks = [relax.BindingBlock(runs.block(list(b.bindings))) for b in func.body.blocks]
        body = relax.SeqExpr(blocks, func.body.body)
        runs.builder.update_func(
            gvar, relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        )
    mod = relax.transform.Normalize()(runs.builder.get())  # (types of the new expressions)
    called = set()

    def note(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar):
            called.add(expr.op)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, note)
    for gvar in [g for g in runs.joining if g not in called]:
        del mod[gvar]
    return mod
