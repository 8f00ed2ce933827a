"""Prefetches of the next weight panel: where the schedules ask for them, which lines they
fetch (recorded by running the kernel with a call in place of each prefetch), and that the
kernels with them compute what they did."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

import accel_target
import topi_accel
from tests.helpers import assert_close, matmul_module, pack, rand, run_executable, run_primfunc
from topi_accel.tir_passes import prefetch as P

RECORD = "testing.accel_prefetched"


def _dense(m, k, n, parallel=True):
    with tvm.target.Target("accel"):
        cfg = replace(topi_accel.dense_config(m, n), parallel=parallel)
    return topi_accel.dense_kn_func(m, k, n, cfg), cfg


def _conv(parallel=True, batch=1, **config):
    # 8x8 outputs, a 1x1 kernel of 32 KB: channel blocks outer (8 rows of 8 pixels per panel)
    geo = topi_accel.conv2d_geometry((batch, 8, 8, 128), (64, 1, 1, 128))
    with tvm.target.Target("accel") as target:
        cfg = replace(topi_accel.conv2d_config(geo, target), parallel=parallel, **config)
    assert cfg.channels_outer
    return topi_accel.conv2d_nhwc_ohwi_func(geo, cfg), cfg


def _winograd(parallel=True):
    # 14x14 outputs: F(2x2), 49 tiles per panel of the transformed kernel
    geo = topi_accel.conv2d_geometry((1, 14, 14, 128), (64, 3, 3, 128), 1, 1)
    with tvm.target.Target("accel") as target:
        cfg = replace(topi_accel.winograd_config(geo, target), parallel=parallel)
    return topi_accel.conv2d_winograd_func(geo, cfg), cfg


LINE = P.LINE_BYTES // 4  # float32 weights per cache line


def _panels(func) -> tuple[int, int]:
    """(panels, floats per panel) of the weights (parameter 1, panels outermost)."""
    shape = [int(v) for v in func.params[1].ty.shape]
    if len(shape) == 4:  # Winograd's [alpha^2, O/nb, C, nb]: a panel per (plane, column block)
        return shape[0] * shape[1], shape[2] * shape[3]
    return shape[0], int(np.prod(shape[1:]))  # dense_kn's [N/nb, K, nb], conv's [O/ob, KH, KW, C, ob]


@pytest.mark.parametrize(
    "make",
    [lambda: _dense(64, 256, 96, False), lambda: _conv(False), lambda: _winograd(False)],
    ids=["dense", "conv", "winograd"],
)
def test_each_panel_prefetches_the_next_one_line_by_line(make):
    func, _ = make()
    lines = []
    tvm.register_global_func(RECORD, lambda offset: lines.append(offset // LINE), override=True)

    def record(buffer, offset):
        return tirx.Evaluate(tirx.call_packed(RECORD, offset))

    recording = topi_accel.insert_prefetches(func, fetch=record)
    assert recording is not None
    inputs = [rand(*[int(v) for v in p.ty.shape]) for p in func.params[:-1]]
    run_primfunc(recording, inputs, [int(v) for v in func.params[-1].ty.shape])

    panels, panel = _panels(func)
    panel_lines, total = panel // LINE, panels * panel // LINE
    assert set(lines) == set(range(total))  # every line, the first panel's by the last one's rows (wrapping)
    assert len(lines) < 1.25 * total  # a line once, give or take rounding at the shares' ends
    # serial: the first panel's rows run first, and fetch the second panel
    first = lines[: len(lines) // panels]
    assert min(first) >= panel_lines - 1 and max(first) < 2 * panel_lines + 1


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_each_chunk_of_rows_prefetches_every_panel(batch, flat):
    """Rows in chunks (one per thread), each over every channel block: each chunk's rows of a
    panel fetch the next panel, the last panel's the first (wrapping), once per sample; in
    rows of tiles or flat tiles along each chunk's pixels (32: 4 rows of 8)."""
    func, _ = _conv(batch=batch, row_chunks=2, flat=flat, ow_block=4)
    lines = []
    tvm.register_global_func(RECORD, lambda offset: lines.append(offset // LINE), override=True)
    recording = topi_accel.insert_prefetches(func, fetch=lambda b, o: tirx.Evaluate(tirx.call_packed(RECORD, o)))
    inputs = [rand(*[int(v) for v in p.ty.shape]) for p in func.params[:-1]]
    run_primfunc(recording, inputs, [int(v) for v in func.params[-1].ty.shape])
    panels, panel = _panels(func)
    total = panels * panel // LINE
    assert set(lines) == set(range(total))
    assert 2 * batch * total <= len(lines) < 2 * batch * 1.25 * total  # every line once per chunk


def test_no_prefetch_where_the_weights_stream_anyway():
    assert topi_accel.insert_prefetches(_dense(1, 2048, 1000)[0]) is None  # GEMV: one row per panel
    assert topi_accel.insert_prefetches(_dense(16, 768, 768)[0]) is None  # 16 rows
    assert topi_accel.insert_prefetches(_dense(64, 200, 96)[0]) is None  # K not a multiple of the steps
    assert topi_accel.insert_prefetches(_dense(64, P.STEPS, 96)[0]) is None  # one step: nothing to spread over
    func = topi_accel.insert_prefetches(_dense(64, 256, 96)[0])
    assert func is not None and func.script().count("T.prefetch(") == 1


def test_kernels_with_prefetches_compute_what_they_did():
    func, cfg = _dense(64, 256, 96)
    a, w = rand(64, 256), rand(256, 96)
    prefetched = topi_accel.insert_prefetches(func)
    assert_close(run_primfunc(prefetched, [a, pack(w, topi_accel.weight_pack_map(cfg))], (64, 96)), a @ w)

    func, cfg = _conv()
    x, k = rand(1, 8, 8, 128), rand(64, 1, 1, 128)
    prefetched = topi_accel.insert_prefetches(func)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(k).permute(0, 3, 1, 2))
    out = run_primfunc(prefetched, [x, pack(k, topi_accel.kernel_pack_map(cfg))], (1, 8, 8, 64))
    assert_close(out, ref.permute(0, 2, 3, 1).numpy())


def test_the_build_inserts_the_prefetches():
    mod = matmul_module(rand(64, 256), rand(256, 96), True)
    with tvm.target.Target("accel") as target:
        lowered = accel_target.pipeline.run_phases(
            accel_target.optimize(mod, target=target), target, "lowering", "lowering"
        )
        lowered = lowered["lowering"]
    kernels = [f.script() for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("T.prefetch(" in k for k in kernels) == 1


def test_a_kernel_that_asked_for_no_prefetch_is_left_unlowered(monkeypatch):
    assert P.asks_for_prefetches(_dense(64, 256, 96)[0])
    with tvm.target.Target("accel"):
        legalized = relax.transform.LegalizeOps()(_transpose_chain())
    transposes = [f for g, f in legalized.functions_items() if g.name_hint.startswith("transpose")]
    assert transposes and not any(P.asks_for_prefetches(f) for f in transposes)
    monkeypatch.setattr(P, "lower_blocks", lambda: pytest.fail("lowered a kernel that asked for no prefetch"))
    assert all(P.insert_prefetches(f) is None for f in transposes)


def _transpose_chain():
    """main(x: [256, 32]) -> [1, 16, 16, 32]: reshape, NCHW permute, reshape, NHWC permute
    (SegFormer's and CvT's tokens <-> image round trip), as one legalized kernel."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((256, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.permute_dims(relax.op.reshape(x, [1, 256, 32]), [0, 2, 1]))
            out = bb.emit_output(relax.op.permute_dims(relax.op.reshape(y, [1, 32, 16, 16]), [0, 2, 3, 1]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_row_by_row_kernel_is_lowered():
    """The chain computed row by row (generic.parallelize) compacts its per-row buffers to
    indices like ``row - row``; lowered without TVM's StmtSimplify, FlattenBuffer failed on
    them ("Divide by zero"). Strict: the build fails if any step declines."""
    x = rand(256, 32)
    executable = accel_target.build(_transpose_chain(), strict=True)
    assert_close(run_executable(executable, x), x.reshape(1, 16, 16, 32))
    report = accel_target.report(executable)
    assert report.declines == ()
