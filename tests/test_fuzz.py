"""Hypothesis fuzzing of conv2d (direct and Winograd) and dense configurations through
tvm.compile(target="accel"), and of the flat pixel tiles of convs directly.

The tests draw the examples of the Hypothesis profile in force (tests/conftest.py): the same
ones on every run by default, new and more of them with ``--hypothesis-profile=explore``;
Winograd convs take a quarter of the examples.
"""

import numpy as np
import torch
import tvm
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import accel_target
import topi_accel
from tests.helpers import assert_close, conv2d_module, conv2d_reference, matmul_module, pack, run_primfunc, run_relax

CANONICAL = {"data": "NCHW", "kernel": "OIHW"}


def _layout(array, canonical, layout):
    return np.ascontiguousarray(array.transpose([canonical.index(a) for a in layout]))


@st.composite
def conv2d_cases(draw):
    groups = draw(st.integers(1, 4))
    c = groups * draw(st.integers(1, 6))
    o = groups * draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h, w = draw(st.integers(1, 14)), draw(st.integers(1, 14))
    assume(h + padding[0] + padding[2] >= dilation[0] * (kh - 1) + 1)
    assume(w + padding[1] + padding[3] >= dilation[1] * (kw - 1) + 1)
    return dict(
        n=draw(st.integers(1, 2)),
        c=c,
        h=h,
        w=w,
        o=o,
        kh=kh,
        kw=kw,
        groups=groups,
        strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        padding=padding,
        dilation=dilation,
        data_layout=draw(st.sampled_from(["NCHW", "NHWC"])),
        kernel_layout=draw(st.sampled_from(["OIHW", "OHWI", "HWIO"])),
        const_weight=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@given(case=conv2d_cases())
def test_fuzz_conv2d(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["n"], case["c"], case["h"], case["w"])).astype("float32")
    wt = rng.standard_normal((case["o"], case["c"] // case["groups"], case["kh"], case["kw"])).astype("float32")
    pt, pl, pb, pr = case["padding"]
    ref = torch.nn.functional.conv2d(
        torch.nn.functional.pad(torch.from_numpy(x), (pl, pr, pt, pb)),
        torch.from_numpy(wt),
        stride=case["strides"],
        dilation=case["dilation"],
        groups=case["groups"],
    ).numpy()
    dl, kl = case["data_layout"], case["kernel_layout"]
    xl, wl = _layout(x, "NCHW", dl), _layout(wt, "OIHW", kl)
    mod = conv2d_module(
        xl,
        wl,
        case["const_weight"],
        strides=case["strides"],
        padding=case["padding"],
        dilation=case["dilation"],
        groups=case["groups"],
        data_layout=dl,
        kernel_layout=kl,
    )
    with accel_target.recording() as log:
        out = run_relax(mod, [xl] if case["const_weight"] else [xl, wl])
    assert [d.implementation for d in log] == ["conv2d_nhwc_ohwi.accel"]
    assert_close(out, _layout(ref, "NCHW", dl))


@st.composite
def winograd_cases(draw):
    """What conv2d_winograd.accel takes (3x3, stride 1, undilated, ungrouped, constant weights,
    channels a multiple of the target's vector, at least 14x14 outputs): both output tiles, tails."""
    lanes = topi_accel.cpu_knobs(tvm.target.Target("accel")).lanes
    padding = tuple(draw(st.integers(0, 1)) for _ in range(4))
    return dict(
        n=draw(st.integers(1, 2)),
        c=lanes * draw(st.integers(1, 3)),
        o=lanes * draw(st.integers(1, 3)),
        h=draw(st.integers(16, 36)) - padding[0] - padding[2],
        w=draw(st.integers(16, 36)) - padding[1] - padding[3],
        padding=padding,
        data_layout=draw(st.sampled_from(["NCHW", "NHWC"])),
        seed=draw(st.integers(0, 2**16)),
    )


# a Winograd build takes a few seconds: a quarter of the examples
@settings(max_examples=max(1, settings().max_examples // 4))
@given(case=winograd_cases())
def test_fuzz_winograd(case):
    rng = np.random.default_rng(case["seed"])
    x = rng.standard_normal((case["n"], case["c"], case["h"], case["w"])).astype("float32")
    wt = rng.standard_normal((case["o"], case["c"], 3, 3)).astype("float32")
    pt, pl, pb, pr = case["padding"]
    ref = torch.nn.functional.conv2d(
        torch.nn.functional.pad(torch.from_numpy(x).double(), (pl, pr, pt, pb)), torch.from_numpy(wt).double()
    ).numpy()
    dl = case["data_layout"]
    xl, wl = _layout(x, "NCHW", dl), _layout(wt, "OIHW", "OHWI" if dl == "NHWC" else "OIHW")
    mod = conv2d_module(
        xl, wl, True, padding=case["padding"], data_layout=dl, kernel_layout="OHWI" if dl == "NHWC" else "OIHW"
    )
    with accel_target.recording() as log:
        out = run_relax(mod, [xl])
    assert [d.implementation for d in log] == ["conv2d_winograd.accel"]
    assert_close(out, _layout(ref, "NCHW", dl).astype("float32"))


@given(
    n=st.integers(1, 3),
    h=st.integers(2, 9),
    w=st.integers(1, 9),
    c=st.integers(1, 40),
    o=st.integers(1, 50),
    kernel=st.integers(1, 3),
    pad=st.integers(0, 2),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    vectors=st.integers(1, 3),
    pixels=st.integers(1, 8),
    chunks=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
# one output channel, one pixel a tile: the output block has no loop of its own under the tile
@example(n=1, h=2, w=1, c=1, o=1, kernel=1, pad=1, stride=1, dilation=1, vectors=1, pixels=1, chunks=1, seed=0)
def test_fuzz_flat_pixel_tiles(n, h, w, c, o, kernel, pad, stride, dilation, vectors, pixels, chunks, seed):
    """Convs with their tiles along the flattened pixels (`Conv2DConfig.flat`), any tile
    against any shape: tail tiles, channel tails, windows of several taps, padding, strides,
    dilation, several images, chunks of rows (one where they do not divide the rows)."""
    window = dilation * (kernel - 1) + 1
    assume(h + 2 * pad >= window and w + 2 * pad >= window)
    assume((h + 2 * pad - window) // stride >= 1)  # more than one output row
    rng = np.random.default_rng(seed)
    shape = (o, kernel, kernel, c)
    x, wt = rng.standard_normal((n, h, w, c)).astype("float32"), rng.standard_normal(shape).astype("float32")
    with tvm.target.Target("accel") as target:
        geo = topi_accel.conv2d_geometry(x.shape, wt.shape, stride, pad, dilation)
        lanes = topi_accel.cpu_knobs(target).lanes
        cfg = topi_accel.Conv2DConfig(vectors * lanes, pixels, lanes, flat=True, row_chunks=chunks)
    packed = pack(wt, topi_accel.kernel_pack_map(cfg))
    out = run_primfunc(topi_accel.conv2d_nhwc_ohwi_func(geo, cfg), [x, packed], (n, geo.out_h, geo.out_w, o))
    assert_close(out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, 1))


@given(
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=3),
    k=st.integers(1, 70),
    n=st.integers(1, 140),
    const_weight=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fuzz_dense(lead, k, n, const_weight, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, k)).astype("float32")
    w = rng.standard_normal((k, n)).astype("float32")
    with accel_target.recording() as log:
        out = run_relax(matmul_module(x, w, const_weight), [x] if const_weight else [x, w])
    assert [d.implementation for d in log] == ["dense_kn.accel"]
    assert_close(out, (x.astype("float64") @ w).astype("float32"))
