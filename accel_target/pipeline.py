"""The accel Relax pipeline, and `build` / `optimize`, the successors of `relay.build`.

Small functions return lists of passes (as in relax/backend/cpu_generic), one per phase;
PHASES is their order, the one list that the registered pipeline, `optimize`, `build`
and `tune` all run (`run_phases`):

    graph       graph_passes: check indexing, fold BN into conv, decompose for inference, ConvertLayout to
                NHWC/OHWI, fold every weight transform, cancel the rest (the first conv reads
                the NCHW image)
    legalize    legalize_passes: LegalizeOps (the strategies pick the kernels)
    kernels     kernel_passes: fuse elementwise ops into the accel kernels' write-back
                (epilogues) or into one kernel of their own, split TVM's own kernels across
                threads, write a kernel's output over a residual that dies with it
    lowering    lowering_passes: TVM's CPU dataflow lowering and finalization, then what the
                build does to every kernel (topi_accel.tuning.lowered_kernel_steps)

``tvm.compile(mod, target="accel", relax_pipeline="accel", tir_pipeline="accel")`` runs all
four, and the TIR pipeline "accel": TVM's, with the register tiles' accumulators kept on the
stack (topi_accel.tir_passes.stacktiles).

The contract: accel never fails where stock TVM succeeds. Each step of ours applies
or leaves what it would change as it was: a graph pass that raises (or leaves a
module that is not well-formed) gives back the module it was handed; ConvertLayout, where
it leaves an op in a layout that TVM has no kernel for, is undone (`run_phases`); a kernel rewrite
(epilogue, parallelization, WriteInPlace, InsertPrefetches, SerialSmallKernels) that
raises on one kernel leaves that kernel as it was; a strategy that raises gives the
op to the next implementation or TVM's kernel (strategy/dispatch.py). Each such
decline is recorded (accel_target.declines: the report's `declines`, and the "accel"
logger); strict mode makes it a StrictModeError.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

import topi_accel
from strategy.registry import suspended
from topi_accel.tir_passes.ranges import split_ranges
from topi_accel.tir_passes.stacktiles import stack_register_tiles

from .declines import attempt, decline, keep, provisional_declines
from .passes.constants import (
    BindConstantSizes,
    EmptyConstantsAtRunTime,
    NaNSafe,
    ShareConstants,
    ZeroConstants,
)
from .passes.division import check_divisors
from .passes.fast_math import FastMath
from .passes.fold_numpy import FoldConstantNumpy
from .passes.fold_subgraphs import fold_constant_subgraphs, fold_what_is_left
from .passes.fold_views import fold_views
from .passes.indexing import check_indexing
from .passes.inplace import write_in_place
from .passes.microbatch import micro_batch
from .passes.pad_as_conv import PadAsConv
from .passes.quantize import quantize_qdq
from .passes.read_input_nchw import ReadInputNCHW
from .passes.simplify_layouts import SimplifyLayouts
from .passes.whole_input_pooling import WholeInputPooling
from .passes.widen import widen_half_types
from .reporting import calls_of
from .target import is_accel

# Only the convs are asked for a layout; pooling, norms, concat, pad, resize,
# reductions, softmax and elementwise ops follow their input's layout through
# their FRelaxInferLayout (ConvertLayout refuses a desired layout for them). The
# transposed convs are held to the one layout TVM legalizes: following their input to
# channels-last, they were left as ops the VM cannot run (DPT's neck: no build at all).
DESIRED_LAYOUTS = {
    "relax.nn.conv2d": ["NHWC", "OHWI"],
    "relax.nn.conv1d": ["NWC", "OWI"],
    "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
    "relax.nn.conv1d_transpose": ["NCW", "IOW"],
}
_CONVERTING = contextvars.ContextVar("accel_convert_layout", default=True)
# the names of the contained steps that ran without checking their module, where a phase
# checks its result (None: each step checks its own)
_UNCHECKED: contextvars.ContextVar[list | None] = contextvars.ContextVar("accel_unchecked_steps", default=None)


@tvm.transform.module_pass(opt_level=0, name="ConvertLayout")
def convert_layout(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """ConvertLayout to DESIRED_LAYOUTS (zero pads carried through as convs, see
    PadAsConv), skipped for a module without such ops.

    (TVM 0.27's ConvertLayout dies with std::bad_alloc, raised as an InternalError, on a
    squeeze with negative axes: SimplifyLayouts, before it, counts them from the front.)
    Off where it left an op in a layout that TVM has no kernel for (see run_phases).
    """
    if not _CONVERTING.get() or not calls_of(mod, DESIRED_LAYOUTS):
        return mod
    return relax.transform.ConvertLayout(DESIRED_LAYOUTS)(PadAsConv()(mod))


def contained(step: tvm.transform.Pass) -> tvm.transform.Pass:
    """`step` (a module pass), or the module it was handed where it raises or leaves a module
    that is not well-formed: declined, see accel_target.declines.decline. Within a phase of
    `run_phases` the check of the module is deferred to the phase's end (`_run_phase`)."""
    name = step.info.name

    def checked(mod: tvm.IRModule) -> tvm.IRModule:
        new = step(mod)
        unchecked = _UNCHECKED.get()
        if unchecked is None:
            relax.analysis.well_formed(new)  # raises on the first violation
        else:
            unchecked.append(name)
        return new

    @tvm.transform.module_pass(opt_level=0, name=f"Contained{name}")
    def _contained(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        new = attempt(name, "module", checked, mod)
        return mod if new is None else new

    return _contained


def graph_passes() -> list[tvm.transform.Pass]:
    """Whole-model layout conversion with every weight transform folded; each pass contained."""
    return [
        contained(p)
        for p in [
            widen_half_types,  # float16 / bfloat16 models in float32 (accel_target/passes/widen.py)
            check_indexing,  # indices inside their tensors, or an error (accel_target/indexing.py)
            check_divisors,  # an integer division by zero an error, not SIGFPE (accel_target/passes/division.py)
            quantize_qdq,  # QDQ graphs to integer conv2d / matmul + requantize (accel_target/quantize.py)
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            # a batch norm left unfolded is a tuple of its result and its statistics: reading
            # the result from it, not through the tuple, lets its relu fuse with it
            relax.transform.CanonicalizeBindings(),
            WholeInputPooling(),
            SimplifyLayouts(),  # before folding: a broadcast weight must not become a constant
            FoldConstantNumpy(),
            BindConstantSizes(),  # sizes read from what the folding computed
            convert_layout,
            FoldConstantNumpy(),
            # what numpy does not fold, in one build (accel_target/folding.py)
            fold_constant_subgraphs,
            # what is left, by TVM's FoldConstant where anything is; once: it compiles a kernel
            # for every call it checks (running it after each numpy folding, too, changed no
            # model's result)
            fold_what_is_left,
            SimplifyLayouts(),
            # one permute of a tensor for all its readers: ConvertLayout gives each reader its own
            # (an NCHW input read by a conv and by a residual add was transposed twice)
            relax.transform.EliminateCommonSubexpr(),
            FoldConstantNumpy(),
            relax.transform.OptimizeLayoutTransform(),
            relax.transform.RemoveRedundantReshape(),
            FastMath(),
            ReadInputNCHW(),  # the first conv reads the image as it is, not its transpose
            relax.transform.DeadCodeElimination(),
            micro_batch,  # a batch's leading layers one sample at a time (accel_target/passes/microbatch.py)
        ]
    ]


def _update_prim_funcs(mod: tvm.IRModule, rewrite) -> tvm.IRModule:
    """`mod` with each PrimFunc replaced by `rewrite(name, func)` where that is not None."""
    updates = {
        gvar: new
        for gvar, func in mod.functions_items()
        if isinstance(func, tvm.tirx.PrimFunc) and (new := rewrite(gvar.name_hint, func)) is not None
    }
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def per_kernel(step: str, rewrite):
    """rewrite(func) -> func or None, as rewrite(name, func) that leaves a kernel on which it
    raises as it was (declined, see accel_target.declines.decline)."""
    return lambda name, func: attempt(step, name, rewrite, func)


_DECLINED = object()


@tvm.transform.module_pass(opt_level=0, name="ScheduleKernels")
def schedule_kernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """After FuseTIR: compute the elementwise ops merged after an accel kernel in its
    write-back (InlineEpilogue) and give the fused function the IMPL attribute of the
    kernel's output block (FuseTIR keeps block annotations, not function attributes); split
    TVM's own (serial) kernels, and what an accel kernel's write-back could not take (a
    broadcasting consumer), across the thread pool (Parallelize), unless the target has one
    core."""
    parallel = topi_accel.cpu_knobs().parallel
    epilogue = per_kernel("InlineEpilogue", topi_accel.inline_epilogue)
    split = per_kernel("Parallelize", topi_accel.parallelize)
    split_rest = per_kernel("Parallelize", topi_accel.epilogue.parallelize_rest)

    def schedule(name, func):
        impl = attempt("ScheduleKernels", name, topi_accel.epilogue.accel_impl, func, default=_DECLINED)
        if impl is _DECLINED:  # not even an s_tir schedule of it
            return None
        if impl is not None:
            fused = epilogue(name, func) or func
            if parallel:
                fused = split_rest(name, fused) or fused
            return fused.with_attr(topi_accel.epilogue.IMPL, impl)
        return split(name, func) if parallel else None

    return _update_prim_funcs(mod, schedule)


_FUSION: contextvars.ContextVar[list | None] = contextvars.ContextVar("accel_fusion", default=None)


@tvm.transform.module_pass(opt_level=0, name="NoteFusion")
def note_fusion(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Between FuseOps and FuseTIR: make the open `noting_fusion` log the group functions
    FuseOps made, once per call (identical groups share one function), in the order the
    functions that are not groups call them, for the report (reporting.fused_into); a phase
    run again notes them anew. Changes nothing."""
    log = _FUSION.get()
    if log is not None:
        groups = {
            gv: func
            for gv, func in mod.functions.items()
            if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs
        }
        log[:] = [
            groups[binding.value.op]
            for gv, func in mod.functions.items()
            if isinstance(func, relax.Function) and gv not in groups
            for block in func.body.blocks
            for binding in block.bindings
            if isinstance(binding.value, relax.Call) and binding.value.op in groups
        ]
    return mod


@contextlib.contextmanager
def noting_fusion():
    log: list = []
    token = _FUSION.set(log)
    try:
        yield log
    finally:
        _FUSION.reset(token)


def legalize_passes() -> list[tvm.transform.Pass]:
    """Kernels for every op, the accel strategies first (a strategy that raises gives the op to
    the next one, or TVM's)."""
    return [
        *cpu_generic.pipeline.library_dispatch_passes(None),  # sort, scan first
        contained(fold_views),  # batch matmuls with their operands' views (passes/fold_views.py)
        ZeroConstants(),  # x * 0.0 and x / 0.0 as IEEE 754 computes them; x // 0 of integers an error
        NaNSafe(),  # x != x of NaN, full(shape, -inf): what TVM gets wrong or stops on
        relax.transform.LegalizeOps(),
        contained(ShareConstants()),  # a weight packed once per call that reads it is one weight
    ]


def kernel_passes() -> list[tvm.transform.Pass]:
    """Elementwise chains fused, into the accel kernels' write-back when they follow one; such
    a kernel writes over the residual it adds when nothing reads that afterwards
    (accel_target/inplace.py)."""
    return [
        contained(relax.transform.FoldConstant()),
        contained(EmptyConstantsAtRunTime()),  # a constant of no element would not load
        relax.transform.AnnotateTIROpPattern(),
        # together: FuseOps leaves grouped functions that only FuseTIR makes kernels of
        contained(
            tvm.transform.Sequential(
                [relax.transform.FuseOps(), note_fusion, relax.transform.FuseTIR()], name="FuseOps"
            )
        ),
        schedule_kernels,  # contained per kernel
        contained(write_in_place),  # and per kernel
        relax.transform.DeadCodeElimination(),
    ]


def kernel_step(name: str, rewrite) -> tvm.transform.Pass:
    """A module pass applying rewrite(func) -> func or None to every kernel, leaving a kernel
    on which it raises as it was (declined, see accel_target.declines.decline)."""

    @tvm.transform.module_pass(opt_level=0, name=name)
    def _step(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _update_prim_funcs(mod, per_kernel(name, rewrite))

    return _step


@tvm.transform.module_pass(opt_level=0, name="NoAliasShapeFunctions")
def no_alias_shape_functions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Mark the PrimFuncs without the attribute ``tirx.noalias`` that take at most one buffer
    (the VM's ``shape_func`` of a symbolic-shape model: its shape heap) as such: true of any
    function of one buffer. TVM's LLVM code generator marks the arguments of every function
    of the module ``noalias`` only when all of them are: one ``shape_func`` made every
    kernel of a dynamic build lose it, its register tiles reloaded and stored around each
    FMA."""

    def mark(_name, func):
        attrs = func.attrs or {}
        if "tirx.noalias" in attrs or sum(hasattr(p.ty, "shape") for p in func.params) > 1:
            return None
        return func.with_attr("tirx.noalias", True)

    return _update_prim_funcs(mod, mark)


def lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's CPU dataflow lowering and finalization, shape functions marked no-alias like the
    kernels, then the steps the build applies to every kernel (small ones serial, prefetches:
    topi_accel.tuning.lowered_kernel_steps, which the tuner runs too), after TVM's, as they
    leave the kernels without the blocks that RewriteDataflowReshape reads."""
    return (
        cpu_generic.pipeline.dataflow_lower_passes(target)
        + cpu_generic.pipeline.finalize_passes(target)
        + [no_alias_shape_functions]
        + [kernel_step(name, rewrite) for name, rewrite in topi_accel.tuning.lowered_kernel_steps(target)]
    )


@dataclass(frozen=True)
class Phase:
    """A part of the pipeline: its passes for a target, and whether the strategies are
    suspended while it runs (the graph passes legalize only to fold constants)."""

    name: str
    passes: Callable[[tvm.target.Target], list[tvm.transform.Pass]]
    suspend_strategies: bool = False


PHASES = (
    Phase("graph", lambda target: graph_passes(), suspend_strategies=True),
    Phase("legalize", lambda target: legalize_passes()),
    Phase("kernels", lambda target: kernel_passes()),
    Phase("lowering", lowering_passes),
)


_LAYOUT_ATTRS = ("data_layout", "kernel_layout", "layout", "out_layout")


def unlegalized_layouts(mod: tvm.IRModule) -> list[str]:
    """The op calls with a layout that LegalizeOps left in `mod`'s Relax functions, each
    named with its layouts: TVM has no kernel for the op in that layout (its legalization
    hands such a call back as it was, and the VM cannot run it)."""
    left = []

    def visit(expr):
        op = getattr(expr, "op", None)
        if isinstance(expr, relax.Call) and isinstance(op, tvm.ir.Op) and op.get_attr("FLegalize") is not None:
            layouts = [f"{k} {getattr(expr.attrs, k)}" for k in _LAYOUT_ATTRS if hasattr(expr.attrs, k)]
            if layouts:
                left.append(f"{op.name} ({', '.join(layouts)})")

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return left


def _well_formed(mod: tvm.IRModule) -> bool:
    try:
        relax.analysis.well_formed(mod)
    except Exception:  # noqa: BLE001 - any violation
        return False
    return True


def _run_phase(phase: Phase, target: tvm.target.Target, mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` through `phase`'s passes, its contained steps checked together: the phase's
    result must be well-formed (a check takes about as long as a step: 0.1 s a step on a
    DenseNet-121), and where it is not, the phase runs again with each contained step checked,
    which declines the steps that broke it."""

    def run() -> tvm.IRModule:
        with target, suspended() if phase.suspend_strategies else contextlib.nullcontext():
            return tvm.transform.Sequential(phase.passes(target))(mod)

    unchecked: list = []
    token = _UNCHECKED.set(unchecked)
    try:
        with provisional_declines() as declines:
            new = run()
    finally:
        _UNCHECKED.reset(token)
    if unchecked and not _well_formed(new):
        return run()
    keep(declines)
    return new


def run_phases(
    mod: tvm.IRModule, target: tvm.target.Target, first: str = "graph", last: str = "lowering"
) -> dict[str, tvm.IRModule]:
    """Run the PHASES from `first` to `last` (by default all) on `mod` under `target`: each one's result by name.

    Where the graph and legalize phases both run and LegalizeOps leaves an op in a layout
    that ConvertLayout gave it and TVM has no kernel for (`unlegalized_layouts`),
    ConvertLayout is declined: the phases run again without it, and the first attempt's
    declines are dropped."""
    names = [p.name for p in PHASES]
    phases = PHASES[names.index(first) : names.index(last) + 1]
    checked = _CONVERTING.get() and first == "graph" and "legalize" in [p.name for p in phases]
    out, left = {}, []
    with provisional_declines() if checked else contextlib.nullcontext() as attempt_declines:
        current = mod
        for phase in phases:
            current = _run_phase(phase, target, current)
            out[phase.name] = current
            if checked and phase.name == "legalize" and (left := unlegalized_layouts(current)):
                break
    if left:
        decline("ConvertLayout", "module", f"TVM has no kernel for {'; '.join(dict.fromkeys(left))}")
        token = _CONVERTING.set(False)
        try:
            return run_phases(mod, target, first, last)
        finally:
            _CONVERTING.reset(token)
    if checked:
        keep(attempt_declines)
    return out


def get_pipeline() -> tvm.transform.Pass:
    """The whole pipeline as one pass (registered as "accel"); reads the target from the context."""

    @tvm.transform.module_pass(opt_level=0, name="AccelPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return run_phases(mod, tvm.target.Target.current())["lowering"]

    return _pipeline


def lowered_step(name: str, rewrite) -> tvm.transform.Pass:
    """A TIR pass applying rewrite(func) -> func or None to each lowered function built for an
    accel target (keys of its "target" attribute); one it fails on stays as it was (declined)."""

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name=name)
    def _step(func: tvm.tirx.PrimFunc, _mod, _ctx) -> tvm.tirx.PrimFunc:
        if not is_accel((func.attrs or {}).get("target")):
            return func
        return attempt(name, str((func.attrs or {}).get("global_symbol", "a kernel")), rewrite, func) or func

    return _step


def tir_pipeline(**kwargs):
    """TVM's TIR pipeline for CPUs, then two steps on the lowered functions: loops that pick
    an operand by their index split into ranges (topi_accel.tir_passes.ranges), and register
    tiles kept on the stack (topi_accel.tir_passes.stacktiles: after TVM's lowering, where the
    tiles' allocations are final and not yet taken from the workspace pool); registered as the
    TIR pipeline "accel"."""
    lowering, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("s_tir", **kwargs)
    steps = [lowered_step("SplitRanges", split_ranges), lowered_step("StackRegisterTiles", stack_register_tiles)]
    return tvm.transform.Sequential([lowering, *steps], name="accel"), finalize_host, finalize_device


def register() -> None:
    """The Relax pipeline "accel" and the TIR pipeline "accel" (idempotent)."""
    if "accel" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("accel")(get_pipeline)
    tvm.tirx.register_tir_pipeline("accel", tir_pipeline)
