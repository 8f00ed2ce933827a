"""Tuning in the model: each conv's candidate schedules timed where the model runs them.

`tune` grid-searches the schedule of every distinct conv2d_nhwc_ohwi conv of a model
(`topi_accel.conv2d_candidates`: the heuristic's config first). A kernel timed alone, called
again and again, finds its input, weights and output in caches the model does not leave them
in, and the winners of such timing made whole models slower (README, Tuning). So the
candidates are timed in the model:

- build k gives every conv its k-th candidate (its heuristic's where it has fewer), every kernel
  launching the thread pool itself (`launches.disabled`: a shared launch runs several kernels
  as one);
- the builds take turns, PASSES times, running ``main`` on random inputs under a VM
  instrument that times every kernel call; a conv's time in a run is the sum of its calls
  (matched to the conv by their arguments' shapes, `_conv_of_call`);
- each conv's winner is the heuristic's config unless another's median over the turns is
  MARGIN faster.

A kernel's time so measured misses what its config costs the kernels after it (which core
wrote which part of its output, what it left in the caches), and a model whose launches are
shared runs its kernels differently: with every conv's winner MobileNetV2 (AVX-512 code, the
Zen 4 VM) took 1.024 of the heuristic's time, with the pointwise convs' winners alone 0.976
(README, Tuning). So the winners are checked in the whole model, built
as `build` builds it: the heuristic's configs, every conv's winner and each family's
(pointwise, spatial, grouped) winners alone take turns, 3 * PASSES of them, and the fastest
set is kept if it is MODEL_MARGIN faster than the heuristic's configs, else the heuristic's.
The database records every conv tuned, the heuristic's config where it stayed.

Every build is held in memory while they take turns, a copy of the weights each (built with
``weights="separate"``: not a second copy in the library).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
from collections import Counter

import numpy as np
import tvm
from tvm import relax

import strategy.conv2d
import topi_accel
from strategy import select

from . import launches
from .deploy import executable_inputs
from .pipeline import _graph, build
from .reporting import calls_of
from .timing import median_ms, turn_order

# turns each build takes; a candidate must beat the heuristic's median by this fraction, and
# a set of them the heuristic's configs in the whole model by MODEL_MARGIN
PASSES = 5
MARGIN = 0.03
MODEL_MARGIN = 0.01


def _conv_shapes(geo: topi_accel.Conv2DGeometry) -> tuple:
    """What the kernel calls of `geo` show of it: (input shape, output shape, (kh, kw, input
    channels per group)) - the packed weight's middle axes, whatever its channel block."""
    return (
        (geo.batch, geo.in_h, geo.in_w, geo.in_c),
        (geo.batch, geo.out_h, geo.out_w, geo.out_c),
        (geo.kh, geo.kw, geo.in_c // geo.groups),
    )


def _call_shapes(shapes: list[tuple]) -> tuple | None:
    """`_conv_shapes` as a conv kernel's call shows it: its data first, its packed weight
    (blocks, kh, kw, channels, block) second, its output last (fused epilogue inputs between;
    a kernel writing over a residual takes it last). None for a call of another form."""
    if len(shapes) < 3 or len(shapes[1]) != 5:
        return None
    return (shapes[0], shapes[-1], shapes[1][1:4])


def _conv_of_call(convs: dict[tuple, object], shapes: list[tuple]):
    """The conv in `convs` (`_conv_shapes` -> conv) whose kernel call shows `shapes`: its data
    NHWC, or else NCHW (a first conv reading the image as it is, topi_accel.nchw_data_reason)."""
    key = _call_shapes(shapes)
    if key is None:
        return None
    if key in convs or len(key[0]) != 4:
        return convs.get(key)
    n, c, h, w = key[0]
    return convs.get(((n, h, w, c), *key[1:]))


def _random_inputs(executable) -> list:
    """Random tensors for main's inputs (`executable_inputs`: not the trailing weights of a
    build whose weights are separate)."""
    specs = executable_inputs(executable)
    symbolic = [s.name for s in specs if s.shape is None or not all(isinstance(d, int) for d in s.shape)]
    if symbolic:
        raise ValueError(f"tune times the model on random inputs: inputs {symbolic} have symbolic shapes")
    rng = np.random.default_rng(0)
    # integer inputs (token ids, indices) as zeros: an index every table takes
    return [
        tvm.runtime.tensor(
            rng.standard_normal(s.shape).astype(s.dtype) if "float" in s.dtype else np.zeros(s.shape, s.dtype)
        )
        for s in specs
    ]


def conv_times(vm: relax.VirtualMachine, inputs: list, convs: dict[tuple, object], runs: int) -> dict:
    """{conv: median ms a run of main} over `runs` runs, every kernel call timed by a VM
    instrument and added to the conv whose `_conv_shapes` its arguments show (`convs`: those
    shapes -> conv); a conv no call showed is left out."""
    by_name: dict[str, object] = {}
    started: list[float] = []
    run = Counter()

    def instrument(func, name, before, ret, *args):
        if before:
            started.append(time.perf_counter())
            return
        elapsed = time.perf_counter() - started.pop()
        if name not in by_name:
            by_name[name] = _conv_of_call(convs, [tuple(a.shape) for a in args if hasattr(a, "shape")])
        if by_name[name] is not None:
            run[by_name[name]] += elapsed

    per_run: dict[object, list[float]] = {}
    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            run.clear()
            vm["main"](*inputs)
            for conv, seconds in run.items():
                per_run.setdefault(conv, []).append(seconds * 1e3)
    finally:
        vm.set_instrument(lambda *a: None)
    return {conv: float(np.median(ms)) for conv, ms in per_run.items()}


def choose(times: dict[int, list[float]], margin: float = MARGIN) -> int | None:
    """The candidate to keep from {candidate index: its times}: the fastest by median, if it
    beats the heuristic's (index 0) by `margin`; else 0. None if the heuristic was not timed."""
    if not times.get(0):
        return None
    medians = {i: float(np.median(t)) for i, t in times.items() if t}
    best = min(medians, key=medians.get)
    return best if medians[best] < medians[0] * (1 - margin) else 0


def _family(geo: topi_accel.Conv2DGeometry) -> str:
    if geo.groups > 1:
        return "grouped"
    return "pointwise" if geo.kh == geo.kw == 1 else "spatial"


def _describe(geo: topi_accel.Conv2DGeometry) -> str:
    grouped = f", {geo.groups} groups" if geo.groups > 1 else ""
    return f"{geo.in_h}x{geo.in_w}x{geo.in_c}->{geo.out_c} {geo.kh}x{geo.kw}/{geo.stride[0]}{grouped}"


def model_times(vms: dict, turns: int, runs: int) -> dict[str, list[float]]:
    """{name: median ms of `runs` runs of main in each of `turns` turns} of the VMs `vms`
    ({name: (VirtualMachine, main's arguments)}), taking turns in `timing.turn_order`."""
    times: dict[str, list[float]] = {name: [] for name in vms}
    for turn in range(turns):
        for name in turn_order(list(vms), turn):
            vm, args = vms[name]
            times[name].append(median_ms(functools.partial(vm["main"], *args), runs))
    return times


def _winner_sets(heuristic: dict, changed: dict) -> dict[str, dict]:
    """{name: {conv: config}} the whole model is timed with: the heuristic's configs, every
    changed conv's winner, and where the winners are of several families each family's alone."""
    sets = {"the heuristic's": heuristic, "every conv's winner": {**heuristic, **changed}}
    families = sorted({_family(g) for g in changed})
    if len(families) > 1:
        for family in families:
            sets[f"the {family} convs' winners"] = {
                **heuristic,
                **{g: c for g, c in changed.items() if _family(g) == family},
            }
    return sets


def direct_convs(mod: tvm.IRModule, params, target: tvm.target.Target, input_layout=None) -> list:
    """The distinct geometries of the convs of `mod` that conv2d_nhwc_ohwi runs, in the
    model's order (conv2d_winograd's have nothing to tune)."""
    graph = _graph(mod, params, target, input_layout)
    with target:
        direct = [
            c
            for c in calls_of(graph, ("relax.nn.conv2d",))
            if getattr(select(c, target.keys)[0], "name", None) == "conv2d_nhwc_ohwi.accel"
        ]
        return list(dict.fromkeys(strategy.conv2d.geometry_of(c) for c in direct))


def tune(mod: tvm.IRModule, db, params=None, *, target="accel", input_layout=None, limit=None, number=5, progress=None):
    """Grid-search the schedule of every distinct conv2d_nhwc_ohwi conv of `mod`, timing each
    candidate in the model (module docstring); save the configs kept in `db`.

    db: path of the JSON tuning database (created, or extended: shapes it holds are skipped,
        and every build takes their configs).
    limit: at most this many candidates per shape (the heuristic's config is always first);
        the builds are as many as the most candidates of a conv.
    number: runs of main a build takes in each turn (the whole-model check: twice as many).
    Use the result with ``build(mod, tuning_db=db)``. Returns the TuningDB.
    """
    say = progress or (lambda message: None)
    target = tvm.target.Target(target)
    database = topi_accel.tuning.TuningDB(db)
    geometries = direct_convs(mod, params, target, input_layout)
    with target:
        key = {g: topi_accel.conv2d_key(g, target) for g in geometries}
        todo = [g for g in geometries if database.get(key[g]) is None]
        candidates = {g: topi_accel.conv2d_candidates(g, target)[: max(limit, 1) if limit else None] for g in todo}
    shapes = Counter(_conv_shapes(g) for g in geometries)
    for g in todo:
        if shapes[_conv_shapes(g)] > 1:
            say(f"conv2d {_describe(g)}: another conv's calls show the same shapes; it keeps the heuristic's config")
    timed = {_conv_shapes(g): g for g in todo if shapes[_conv_shapes(g)] == 1}
    if not timed:
        say("no conv of the model is left to tune")
        return database
    convs = list(timed.values())

    with tempfile.TemporaryDirectory(prefix="accel_tune_") as tmp:

        def build_with(configs: dict, shared_launches: bool):
            path = os.path.join(tmp, f"{len(os.listdir(tmp))}.json")
            builds_db = topi_accel.tuning.TuningDB(path)
            builds_db.entries = dict(database.entries)
            for g, config in configs.items():
                builds_db.put(key[g], config, 0.0)
            builds_db.save()
            with contextlib.nullcontext() if shared_launches else launches.disabled():
                executable = build(
                    mod, params, target=target, input_layout=input_layout, tuning_db=path, weights="separate"
                )
            # (the weights outside the library: one copy of them a build, not two)
            return executable, relax.VirtualMachine(executable, tvm.cpu()), executable.weights

        # 1. every candidate in the model, its kernels timed one by one
        def candidate(g, build_index):
            return build_index if build_index < len(candidates[g]) else 0

        builds = max(len(candidates[g]) for g in convs)
        vms = []  # (VM, its main's arguments)
        for k in range(builds):
            executable, vm, weights = build_with(
                {g: candidates[g][candidate(g, k)] for g in convs}, shared_launches=False
            )
            if k == 0:
                inputs = _random_inputs(executable)  # a symbolic input shape fails here, before the other builds
            vms.append((vm, inputs + weights))
            say(f"build {k + 1}/{builds}: every conv's candidate {k + 1} (or the heuristic's)")
        for vm, args in vms:
            vm["main"](*args)  # first runs allocate
        times: dict = {g: {} for g in convs}  # conv -> candidate index -> ms of each turn
        for turn in range(PASSES):
            for k in turn_order(list(range(builds)), turn):
                for g, ms in conv_times(*vms[k], timed, number).items():
                    times[g].setdefault(candidate(g, k), []).append(ms)
        del vms, vm, args, executable, weights  # the builds of the first stage
        winners = {g: choose(times[g]) for g in convs}
        for g in [g for g in convs if winners[g] is None]:
            say(f"conv2d {_describe(g)}: no kernel call showed it in the model; it keeps the heuristic's config")
            convs.remove(g)

        # 2. the whole model, its launches shared as a build shares them: the heuristic's
        # configs against every conv's winner, and against each family's winners alone
        heuristic = {g: candidates[g][0] for g in convs}
        changed = {g: candidates[g][winners[g]] for g in convs if winners[g] != 0}
        kept = heuristic
        if changed:
            sets = _winner_sets(heuristic, changed)
            runs = {}
            for name, configs in sets.items():
                _, vm, weights = build_with(configs, shared_launches=True)
                runs[name] = (vm, inputs + weights)
            whole = model_times(runs, 3 * PASSES, 2 * number)
            base = np.array(whole["the heuristic's"])
            ratios = {name: float(np.median(np.array(ms) / base)) for name, ms in whole.items()}
            best = min(ratios, key=ratios.get)
            say(
                "the whole model, against the heuristic's configs: "
                + ", ".join(f"{name} {ratio:.3f}" for name, ratio in ratios.items())
            )
            if ratios[best] < 1 - MODEL_MARGIN:
                kept = sets[best]
                say(f"keeping {best}")
            else:
                say("keeping the heuristic's configs")
    for g in convs:
        ms = float(np.median(times[g][candidates[g].index(kept[g])]))
        database.put(key[g], kept[g], ms)
        if kept[g] == heuristic[g]:
            say(f"conv2d {_describe(g)}: the heuristic's config, {ms:.3f} ms in the model")
        else:
            was = float(np.median(times[g][0]))
            say(f"conv2d {_describe(g)}: {ms:.3f} ms in the model (the heuristic's {was:.3f}) with {kept[g]}")
    database.save()
    return database
