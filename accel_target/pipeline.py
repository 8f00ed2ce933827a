"""The accel Relax pipeline, and `build` / `optimize`, the successors of `relay.build`.

Small functions return lists of passes (as in relax/backend/cpu_generic):

    graph_passes      fold BN into conv, decompose for inference, ConvertLayout to
                      NHWC/OHWI, fold every weight transform, cancel the rest
    legalize_passes   LegalizeOps (the strategies pick the kernels), fuse elementwise
                      ops into the accel kernels' write-back (epilogues) or into one
                      kernel of their own, split TVM's own kernels across threads,
                      write a kernel's output over a residual that dies with it
    lowering_passes   TVM's CPU dataflow lowering and finalization

``tvm.compile(mod, target="accel", relax_pipeline="accel")`` runs all three.

The contract: accel never fails where stock TVM succeeds. Each step of ours applies
or leaves what it would change as it was: a graph pass that raises (or leaves a
module that is not well-formed) gives back the module it was handed; a kernel rewrite
(epilogue, parallelization, WriteInPlace, InsertPrefetches, ClaimIterations) that
raises on one kernel leaves that kernel as it was; a strategy that raises gives the
op to the next implementation or TVM's kernel (strategy/dispatch.py). Each such
decline is recorded (strategy.registry.decline: the report's `declines`, and the
"accel" logger); strict mode makes it a StrictModeError.
"""

from __future__ import annotations

import contextlib

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

import strategy.conv2d
import topi_accel
from strategy import recording, select
from strategy import strict as strict_mode
from strategy.registry import attempt, recording_declines, suspended

from . import deploy
from .inplace import write_in_place
from .report import OpRow, Report, calls_of, is_accel_kernel, module_kernels, op_rows, runtime_kernels
from .transforms import (
    FastMath,
    FoldConstantNumpy,
    PadAsConv,
    SimplifyLayouts,
    convert_input_layout,
    convert_output_layout,
)

# Only conv2d is asked for a layout; pooling, norms, concat, pad, resize,
# reductions, softmax and elementwise ops follow their input's layout through
# their FRelaxInferLayout (ConvertLayout refuses a desired layout for them).
DESIRED_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "OHWI"], "relax.nn.conv1d": ["NWC", "OWI"]}


@tvm.transform.module_pass(opt_level=0, name="ConvertLayout")
def convert_layout(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """ConvertLayout to DESIRED_LAYOUTS (zero pads carried through as convs, see
    PadAsConv), skipped for a module without such ops.

    (TVM 0.27's ConvertLayout dies with std::bad_alloc, raised as an InternalError, on a
    squeeze with negative axes: SimplifyLayouts, before it, counts them from the front.)
    """
    if not calls_of(mod, DESIRED_LAYOUTS):
        return mod
    return relax.transform.ConvertLayout(DESIRED_LAYOUTS)(PadAsConv()(mod))


def contained(step: tvm.transform.Pass) -> tvm.transform.Pass:
    """`step` (a module pass), or the module it was handed where it raises or leaves a module
    that is not well-formed: declined, see strategy.registry.decline."""
    name = step.info.name

    def checked(mod: tvm.IRModule) -> tvm.IRModule:
        new = step(mod)
        relax.analysis.well_formed(new)  # raises on the first violation
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
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            SimplifyLayouts(),  # before folding: a broadcast weight must not become a constant
            FoldConstantNumpy(),
            convert_layout,
            FoldConstantNumpy(),
            # what numpy does not fold; once: it compiles a kernel for every call it checks
            # (running it after each numpy folding, too, changed no model's result)
            relax.transform.FoldConstant(),
            SimplifyLayouts(),
            FoldConstantNumpy(),
            relax.transform.OptimizeLayoutTransform(),
            relax.transform.RemoveRedundantReshape(),
            FastMath(),
            relax.transform.DeadCodeElimination(),
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
    raises as it was (declined, see strategy.registry.decline)."""
    return lambda name, func: attempt(step, name, rewrite, func)


@tvm.transform.module_pass(opt_level=0, name="ScheduleKernels")
def schedule_kernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """After FuseTIR: compute the elementwise ops merged after an accel kernel in its
    write-back (InlineEpilogue); split TVM's own (serial) kernels across the thread pool
    (Parallelize), unless the target has one core."""
    parallel = topi_accel.cpu_knobs().parallel
    epilogue = per_kernel("InlineEpilogue", topi_accel.inline_epilogue)
    split = per_kernel("Parallelize", topi_accel.parallelize)

    def schedule(name, func):
        accel = attempt("ScheduleKernels", name, topi_accel.contains_accel_kernel, func)
        if accel is None:  # declined: not even an s_tir schedule of it
            return None
        if accel:
            return epilogue(name, func)
        return split(name, func) if parallel else None

    return _update_prim_funcs(mod, schedule)


def legalize_passes() -> list[tvm.transform.Pass]:
    """Kernels for every op (accel strategies first); elementwise chains fused, into the
    accel kernels' write-back when they follow one; such a kernel writes over the residual
    it adds when nothing reads that afterwards (accel_target/inplace.py)."""
    return [
        relax.transform.LegalizeOps(),  # a strategy that raises gives the op to the next one, or TVM's
        contained(relax.transform.FoldConstant()),
        relax.transform.AnnotateTIROpPattern(),
        # together: FuseOps leaves grouped functions that only FuseTIR makes kernels of
        contained(tvm.transform.Sequential([relax.transform.FuseOps(), relax.transform.FuseTIR()], name="FuseOps")),
        schedule_kernels,  # contained per kernel
        contained(write_in_place),  # and per kernel
        relax.transform.DeadCodeElimination(),
    ]


@tvm.transform.module_pass(opt_level=0, name="ClaimIterations")
def claim_iterations(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """The threads claim the iterations of every kernel's parallel loops as they go instead
    of taking fixed slices (topi_accel.workshare); last, as it leaves the kernels without
    the blocks that RewriteDataflowReshape reads."""
    knobs = topi_accel.cpu_knobs()
    if not knobs.parallel:
        return mod
    return _update_prim_funcs(
        mod, per_kernel("ClaimIterations", lambda func: topi_accel.claim_iterations(func, knobs.cores))
    )


@tvm.transform.module_pass(opt_level=0, name="InsertPrefetches")
def insert_prefetches(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Put into the kernels whose schedules asked for them the prefetches of the next weight
    panel (topi_accel.prefetch); they are lowered to do so, hence late, like ClaimIterations."""
    return _update_prim_funcs(mod, per_kernel("InsertPrefetches", topi_accel.insert_prefetches))


def lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    return (
        cpu_generic.pipeline.dataflow_lower_passes(target)
        + cpu_generic.pipeline.finalize_passes(target)
        + [insert_prefetches, claim_iterations]
    )


def _sequential(passes) -> tvm.transform.Pass:
    return tvm.transform.Sequential(passes)


def get_pipeline() -> tvm.transform.Pass:
    """The whole pipeline as one pass (registered as "accel"); reads the target from the context."""

    @tvm.transform.module_pass(opt_level=0, name="AccelPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current()
        return _sequential(legalize_passes() + lowering_passes(target))(_run_graph_passes(mod))

    return _pipeline


def register() -> None:
    if "accel" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("accel")(get_pipeline)


def _prepare(mod: tvm.IRModule, params, input_layout, output_layout=None) -> tvm.IRModule:
    if not isinstance(mod, tvm.IRModule) or "main" not in [g.name_hint for g in mod.functions]:
        what = type(mod).__name__ if not isinstance(mod, tvm.IRModule) else "an IRModule without 'main'"
        raise TypeError(f"accel: expected an IRModule with a Relax function 'main', got {what}")
    if params:
        names = {p.name for p in mod["main"].params}
        unknown = sorted(set(params) - names)
        if unknown:
            raise ValueError(f"accel: params {unknown} are not inputs of main (inputs: {sorted(names)})")
        arrays = {k: v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v) for k, v in params.items()}
        mod = relax.transform.BindParams("main", arrays)(mod)
        main = mod["main"]
        if main.attrs is not None and "num_input" in main.attrs:  # every remaining parameter is an input now
            mod["main"] = main.without_attr("num_input")
    return convert_output_layout(convert_input_layout(mod, input_layout), output_layout)


def optimize(
    mod: tvm.IRModule,
    params=None,
    *,
    target="accel",
    input_layout=None,
    output_layout=None,
    strict=None,
    tuning_db=None,
) -> tvm.IRModule:
    """`mod` after the accel pipeline up to kernels: every op a call_tir to a named PrimFunc.

    Same arguments as `build`; for inspection (``.script()``) and for `report`.
    """
    return _optimize(mod, params, target, input_layout, strict, tuning_db, output_layout)[0]


def _run_graph_passes(mod: tvm.IRModule) -> tvm.IRModule:
    with suspended():  # FoldConstant legalizes every call: no accel kernels for that
        return _sequential(graph_passes())(mod)


def _graph(mod, params, target, input_layout, output_layout=None) -> tvm.IRModule:
    with target:
        return _run_graph_passes(_prepare(mod, params, input_layout, output_layout))


def _strictness(strict):
    """strict mode on or off within the block; None: as the enclosing block says."""
    return contextlib.nullcontext() if strict is None else strict_mode(strict)


def _optimize(mod, params, target, input_layout, strict=None, tuning_db=None, output_layout=None):
    target = tvm.target.Target(target)
    db = None if tuning_db is None else topi_accel.tuning.TuningDB(tuning_db)
    with _strictness(strict), recording_declines() as declines:
        graph = _graph(mod, params, target, input_layout, output_layout)
        rows = op_rows(graph)
        with target, topi_accel.tuning.using(db), recording() as decisions:
            lowered = _sequential(legalize_passes())(graph)
    return lowered, Report.from_rows(rows, decisions, target.keys, declines)


def tune(mod: tvm.IRModule, db, params=None, *, target="accel", input_layout=None, limit=None, number=5, progress=None):
    """Grid-search the schedule of every distinct conv2d_nhwc_ohwi conv of `mod`; save the winners in `db`.

    db: path of the JSON tuning database (created, or extended: shapes it holds are skipped).
    limit: at most this many candidates per shape (the heuristic's config is always first).
    Use the result with ``build(mod, tuning_db=db)``. Returns the TuningDB.
    """
    target = tvm.target.Target(target)
    graph = _graph(mod, params, target, input_layout)
    database = topi_accel.tuning.TuningDB(db)
    calls = calls_of(graph, ("relax.nn.conv2d",))
    with target:
        # the convs conv2d_nhwc_ohwi gets (conv2d_winograd's have nothing to tune)
        direct = [c for c in calls if getattr(select(c, target.keys)[0], "name", None) == "conv2d_nhwc_ohwi.accel"]
        geometries = dict.fromkeys(strategy.conv2d.geometry_of(c) for c in direct)
        for i, geo in enumerate(geometries, 1):
            key = topi_accel.conv2d_key(geo, target)
            if database.get(key) is not None:
                continue
            cfg, ms = topi_accel.tune_conv2d(geo, target, number=number, limit=limit)
            if progress is not None:
                progress(f"conv2d {i}/{len(geometries)}: {ms:.3f} ms with {cfg}")
            database.put(key, cfg, ms)
            database.save()
    return database


def build(
    mod: tvm.IRModule,
    params=None,
    *,
    target="accel",
    input_layout=None,
    output_layout=None,
    strict=None,
    tuning_db=None,
    weights="embedded",
) -> relax.VMExecutable:
    """Compile a whole model for accel: the `relay.build(mod, target, params)` of this target.

    mod: IRModule with a Relax `main` (e.g. from `from_torch` / `from_onnx`).
    params: name -> array for inputs of main to bind as weights (e.g. from
        ``keep_params_as_input=True``); a module whose weights are constants needs none.
    input_layout: None keeps main's signature; "NHWC" makes every 4-D NCHW
        input channels-last (a PyTorch channels_last tensor's memory as is).
    output_layout: None keeps main's outputs; "NHWC" returns every 4-D NCHW output
        channels-last (an image-to-image model fed NHWC then has no transform at all).
    strict: raise StrictModeError instead of falling back to TVM's kernel, or of leaving
        a kernel or the module as it was where a step of ours fails (None: as an
        enclosing ``with accel_target.strict():`` says, else False).
    tuning_db: a JSON file written by `tune`: its configs replace the heuristic's.
    weights: "embedded" keeps the weights (folded and packed for the kernels) in the
        executable; "separate" makes them trailing inputs of main, kept in
        ``executable.accel_weights`` for `deploy.save` to write beside the library.

    Returns a VMExecutable for relax.VirtualMachine; `report(executable)` tells
    which kernel every op got, and which step declined what (left it as it was) and why.
    """
    if weights not in deploy.WEIGHT_MODES:
        raise ValueError(
            f"accel build: weights={weights!r} is not supported; supported: {', '.join(deploy.WEIGHT_MODES)}"
        )
    with _strictness(strict), recording_declines() as declines:
        lowered, report = _optimize(mod, params, target, input_layout, None, tuning_db, output_layout)
        lifted = None
        if weights == "separate":
            lowered, lifted = deploy.lift_weights(lowered)
        target = tvm.target.Target(target)
        executable = tvm.compile(lowered, target=target, relax_pipeline=_sequential(lowering_passes(target)))
    executable.accel_report = report.with_declines(declines)
    executable.accel_weights = lifted
    return executable


def report(executable_or_module) -> Report:
    """Which kernel every op got, and the layout transforms left at run time.

    executable_or_module: an executable from `build` (full per-op report); a
    Relax module, which goes through `optimize` first (target "accel"); or a
    VMExecutable built another way (``tvm.compile(..., relax_pipeline="accel")``),
    whose report lists the kernels it calls.
    """
    if isinstance(executable_or_module, relax.VMExecutable):
        kernels = runtime_kernels(executable_or_module)
        stored = getattr(executable_or_module, "accel_report", None)
        if stored is None:
            rows = tuple(
                OpRow("kernel", (), "", "accel" if is_accel_kernel(name) else "tvm", name) for name in kernels.calls
            )
            stored = Report(rows)
        return stored.with_kernels(kernels)
    if isinstance(executable_or_module, tvm.IRModule):
        lowered, rep = _optimize(executable_or_module, None, "accel", None)
        return rep.with_kernels(module_kernels(lowered))
    raise TypeError(f"accel report: expected a VMExecutable or an IRModule, got {type(executable_or_module).__name__}")
