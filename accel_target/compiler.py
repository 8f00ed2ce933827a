"""`build` / `optimize` / `report`: the accel pipeline on a whole model, the successors of
`relay.build`."""

from __future__ import annotations

import contextlib
import os

import tvm
from tvm import relax

import topi_accel
from strategy import Options, using
from strategy import strict as strict_mode

from .codegen import compile_executable
from .declines import recording_declines
from .passes.fold_views import noting_folds
from .passes.io_layouts import convert_input_layout, convert_output_layout
from .pipeline import noting_fusion, run_phases
from .reporting import Report, module_kernels, runtime_kernels
from .runtime import deploy
from .runtime.executable import WEIGHT_MODES, AccelExecutable, lift_weights


def _prepare(mod: tvm.IRModule, params, input_layout, output_layout=None) -> tvm.IRModule:
    """`mod` checked, its `params` bound as constants, its inputs and outputs in the layouts asked for."""
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


@contextlib.contextmanager
def _options(strict, strassen: bool):
    """The build's options in force: strict mode on or off (None: as the enclosing block says),
    and what the strategies read."""
    with contextlib.nullcontext() if strict is None else strict_mode(strict), using(Options(strassen=strassen)):
        yield


def graph_module(mod, params=None, target="accel", input_layout=None, output_layout=None) -> tvm.IRModule:
    """`mod` after the graph phase of the pipeline (for the tuner: the convs as they reach the strategies)."""
    target = tvm.target.Target(target)
    with target:
        prepared = _prepare(mod, params, input_layout, output_layout)
    return run_phases(prepared, target, "graph", "graph")["graph"]


def _optimize(mod, params, target, input_layout, output_layout, tuning_db):
    """(module after the kernel passes, its Report without runtime kernels)."""
    target = tvm.target.Target(target)
    if tuning_db is not None and not os.path.isfile(tuning_db):  # not an empty database: the heuristic's configs
        raise FileNotFoundError(
            f"tuning database {os.fspath(tuning_db)!r} does not exist; write it with accel_target.tune (accel-tvm tune)"
        )
    db = None if tuning_db is None else topi_accel.tuning.TuningDB(tuning_db)
    with recording_declines() as declines:
        with target:
            prepared = _prepare(mod, params, input_layout, output_layout)
        with topi_accel.tuning.using(db), noting_fusion() as groups, noting_folds() as folds:
            done = run_phases(prepared, target, "graph", "kernels")
    if any(d.step == "FuseOps" for d in declines):  # declined: the module was left unfused
        groups = []
    return done["kernels"], Report.of_modules(done["graph"], done["legalize"], groups, declines, folds)


def optimize(
    mod: tvm.IRModule,
    params=None,
    *,
    target="accel",
    input_layout=None,
    output_layout=None,
    strict=None,
    tuning_db=None,
    strassen: bool = False,
) -> tvm.IRModule:
    """`mod` after the accel pipeline up to kernels: every op a call_tir to a named PrimFunc.

    Same arguments as `build`; for inspection (``.script()``) and for `report`.
    """
    with _options(strict, strassen):
        return _optimize(mod, params, target, input_layout, output_layout, tuning_db)[0]


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
    strassen: bool = False,
    jobs: int | None = None,
) -> AccelExecutable:
    """Compile a whole model for accel: the `relay.build(mod, target, params)` of this target.

    mod: IRModule with a Relax `main` (e.g. from `from_torch` / `from_onnx`).
    params: name -> array for inputs of main to bind as weights (e.g. from
        ``keep_params_as_input=True``); a module whose weights are constants needs none.
    input_layout: None keeps main's signature; "NHWC" makes every 4-D input that the model
        reads as NCHW (the input axis its first conv reads as channels is axis 1) channels-last
        (a PyTorch channels_last tensor's memory as is). An input the model already takes
        channels-last (a TF/Keras export: [N, H, W, C], permuted to NCHW by the model) is left
        as it is, so the option never asks for [N, H, C, W]; one read with its channels on
        another axis is a ValueError naming it (accel_target/passes/io_layouts.py).
    output_layout: None keeps main's outputs; "NHWC" returns every 4-D NCHW output
        channels-last (an image-to-image model fed NHWC then has no transform at all).
    strict: raise StrictModeError instead of falling back to TVM's kernel, or of leaving
        a kernel or the module as it was where a step of ours fails (None: as an
        enclosing ``with accel_target.strict():`` says, else False).
    tuning_db: a JSON file written by `tune`: its configs replace the heuristic's (a path
        that does not exist raises FileNotFoundError).
    weights: "embedded" keeps the weights (folded and packed for the kernels) in the
        executable; "separate" makes them trailing inputs of main, kept in
        ``executable.weights`` for `save` to write beside the library.
    strassen: large float32 products with a constant weight as Strassen's seven half-size
        products (strategy/strassen.py): fewer multiply-adds, results equal up to rounding.
    jobs: threads that generate the kernels' machine code (accel_target/codegen.py; None: one
        per core this process may run on); the library is the same for any number.

    Returns an AccelExecutable: a VMExecutable (for relax.VirtualMachine, export_library)
    with ``.report`` (also `report(executable)`: which kernel every op got, what runs, and
    which step declined what, left it as it was, and why) and ``.weights``.
    """
    if weights not in WEIGHT_MODES:
        raise ValueError(f"accel build: weights={weights!r} is not supported; supported: {', '.join(WEIGHT_MODES)}")
    target = tvm.target.Target(target)
    with _options(strict, strassen), recording_declines() as declines:
        lowered, report = _optimize(mod, params, target, input_layout, output_layout, tuning_db)
        lifted = None
        if weights == "separate":
            lowered, lifted = lift_weights(lowered)
        final = run_phases(lowered, target, "lowering", "lowering")["lowering"]
        executable = compile_executable(final, target, jobs)
    # the kernels main calls, read from the module the executable is made of
    return AccelExecutable(executable, report.with_kernels(module_kernels(final)).with_declines(declines), lifted)


def report(subject) -> Report:
    """Which kernel every op got, and the layout transforms left at run time.

    subject: an executable from `build`, or a model from `load` (its full report, kept
    with it); a Relax module, which goes through `optimize` first (target "accel"); or a
    VMExecutable built another way (``tvm.compile(..., relax_pipeline="accel")``), whose
    report lists the kernels it calls.
    """
    if isinstance(subject, AccelExecutable):
        return subject.report
    if isinstance(subject, deploy.Deployed):
        if subject.report is None:
            raise ValueError(
                f"accel report: {subject.library!r} was saved without a report (its signature file has none); "
                "save the model again with accel_target.save"
            )
        return subject.report
    if isinstance(subject, relax.VMExecutable):
        return Report.of_kernels(runtime_kernels(subject))
    if isinstance(subject, tvm.IRModule):
        lowered, rep = _optimize(subject, None, "accel", None, None, None)
        return rep.with_kernels(module_kernels(lowered))
    raise TypeError(
        f"accel report: expected an executable from build, a model from load, a VMExecutable or an IRModule, "
        f"got {type(subject).__name__}"
    )
