"""docs/adding_a_kernel.md runs as written, and the kernel it builds is right on more shapes.

The guide's python blocks run in order in one namespace (they carry their own
asserts). Its registration (key "accel_guide") lives in a copy of the strategy
registry that is dropped when the guide tests end, so no other test sees it.
"""

import contextlib
import re
from pathlib import Path

import pytest
import torch
import tvm
from tvm import te

import accel_target
import strategy
import topi_accel
from strategy import registry
from tests.helpers import assert_close, conv2d_module, rand

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "adding_a_kernel.md"
OP = "relax.nn.max_pool2d"
IMPL = "max_pool2d_nhwc.guide"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the first code line, code) of every ```python block, in order."""
    return [
        (text.count("\n", 0, m.start(1)) + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```\s*$", text, flags=re.MULTILINE | re.DOTALL)
    ]


@contextlib.contextmanager
def guide_namespace():
    """The guide's namespace after all its blocks ran; its registration is undone on exit."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_IMPLEMENTATIONS", {op: list(impls) for op, impls in registry._IMPLEMENTATIONS.items()})
        namespace = {"__name__": "adding_a_kernel"}
        for line, code in python_blocks(GUIDE.read_text()):
            # padded so that a traceback points at the guide's own line numbers
            exec(compile("\n" * (line - 1) + code, str(GUIDE), "exec"), namespace)
        yield namespace


@pytest.fixture(scope="class")
def guide():
    with guide_namespace() as namespace:
        yield namespace


def torch_max_pool2d_nhwc(x, pool_size, strides, padding, dilation, ceil_mode=False):
    """PyTorch's max_pool2d on the NCHW view; padding (top, left, bottom, right) with -inf."""
    top, left, bottom, right = padding
    x_nchw = torch.nn.functional.pad(
        torch.from_numpy(x).permute(0, 3, 1, 2), (left, right, top, bottom), value=float("-inf")
    )
    out = torch.nn.functional.max_pool2d(x_nchw, pool_size, strides, 0, dilation, ceil_mode=ceil_mode)
    return out.permute(0, 2, 3, 1).numpy()


CASES = [
    # channels a multiple of the vector lanes (vectorized), no padding
    ((1, 8, 8, 16), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)),
    ((1, 9, 8, 48), (2, 3), (2, 1), (0, 1, 0, 1), (1, 1)),
    # odd channel counts (scalar channel loop), stride 2, padding, batch 2
    ((2, 7, 9, 3), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((2, 11, 6, 7), (3, 3), (1, 1), (1, 0, 1, 2), (1, 1)),
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    # dilation; a window as large as the input
    ((2, 10, 10, 32), (3, 3), (2, 2), (1, 1, 1, 1), (2, 2)),
    ((1, 5, 5, 5), (5, 5), (1, 1), (0, 0, 0, 0), (1, 1)),
]


class TestGuide:
    def test_guide_has_a_block_per_step_and_registers_its_kernel(self, guide):
        assert len(python_blocks(GUIDE.read_text())) >= 6
        assert OP in strategy.covered_ops()
        keys = tvm.target.Target("accel_guide").keys
        assert [i.name for i in strategy.implementations(OP, keys)] == [IMPL]
        assert [i.target_key for i in strategy.implementations(OP)] == ["accel_guide"]

    def test_the_guides_own_test_passes_on_its_table(self, guide):
        assert len(guide["CASES"]) >= 2
        for case in guide["CASES"]:
            guide["test_max_pool2d_nhwc"](*case)

    @pytest.mark.parametrize("shape, pool_size, strides, padding, dilation", CASES)
    def test_max_pool2d_nhwc_matches_torch(self, guide, shape, pool_size, strides, padding, dilation):
        x = rand(*shape)
        mod = guide["max_pool2d_module"](
            shape, pool_size=pool_size, strides=strides, padding=padding, dilation=dilation
        )
        with accel_target.recording() as log:
            out = guide["run"](mod, x, "accel_guide")
        assert [d.implementation for d in log] == [IMPL]
        assert_close(out, torch_max_pool2d_nhwc(x, pool_size, strides, padding, dilation))

    @pytest.mark.parametrize("channels_per_lane, vectorized", [(1, True), (3, True), (0.5, False)])
    def test_schedule_vectorizes_whole_vectors_only(self, guide, channels_per_lane, vectorized):
        target = tvm.target.Target("accel")
        channels = int(topi_accel.cpu_knobs(target).lanes * channels_per_lane) + (0 if vectorized else 1)
        func = guide["max_pool2d_nhwc_func"]((1, 6, 6, channels), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), target=target)
        assert ("T.vectorized" in func.script()) == vectorized
        assert "T.parallel" in func.script()

    @pytest.mark.parametrize(
        "shape, dtype, pool_size, padding, message",
        [
            ((8, 8, 3), "float32", (2, 2), (0, 0, 0, 0), "rank 3"),
            ((1, 8, 8, 3), "int8", (2, 2), (0, 0, 0, 0), "dtype int8"),
            ((1, 8, 8, 3), "float32", (0, 2), (0, 0, 0, 0), "pool_size=(0, 2)"),
            ((1, 8, 8, 3), "float32", (2, 2), (1, -1, 0, 0), "padding=(1, -1, 0, 0)"),
            ((1, 4, 4, 3), "float32", (5, 5), (0, 0, 0, 0), "larger than the padded input"),
        ],
    )
    def test_compute_rejects_bad_input_naming_op_and_value(self, guide, shape, dtype, pool_size, padding, message):
        data = te.placeholder(shape, dtype, name="data")
        with pytest.raises(ValueError, match="max_pool2d_nhwc") as err:
            guide["max_pool2d_nhwc"](data, pool_size, (1, 1), padding, (1, 1))
        assert message in str(err.value)

    def test_ceil_mode_falls_back_with_reason_and_stays_correct(self, guide):
        x = rand(1, 8, 8, 4)
        mod = guide["max_pool2d_module"](x.shape, pool_size=(3, 3), strides=(2, 2), ceil_mode=True)
        with accel_target.recording() as log:
            out = guide["run"](mod, x, "accel_guide")
        assert len(log) == 1 and log[0].fallback and log[0].reason == f"{IMPL}: ceil_mode=True is not supported"
        assert_close(out, torch_max_pool2d_nhwc(x, (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), ceil_mode=True))

    def test_accel_target_keeps_its_kernels_and_never_picks_the_guide(self, guide):
        assert strategy.implementations(OP, tvm.target.Target("accel").keys) == []
        x = rand(1, 8, 8, 16)
        mod = guide["max_pool2d_module"](x.shape, pool_size=(2, 2), strides=(2, 2))
        with accel_target.recording() as log:
            out = guide["run"](mod, x, "accel")
        assert log == []
        assert_close(out, torch_max_pool2d_nhwc(x, (2, 2), (2, 2), (0, 0, 0, 0), (1, 1)))
        # conv2d still gets the accel kernel, under "accel" and under "accel_guide"
        xc, w = rand(1, 3, 8, 8), rand(4, 3, 3, 3)
        for target in ("accel", "accel_guide"):
            with accel_target.recording() as log:
                guide["run"](conv2d_module(xc, w, True), xc, target)
            assert [d.implementation for d in log] == ["conv2d_nhwc_ohwi.accel"]

    def test_accel_build_works_while_the_guide_kernel_is_registered(self, guide):
        x = rand(1, 8, 8, 4)
        executable = accel_target.build(guide["max_pool2d_module"](x.shape, pool_size=(2, 2)))
        assert accel_target.report(executable).count("tvm", [OP]) == 1


def test_guide_registration_is_undone_when_the_guide_ends():
    with guide_namespace():
        assert [i.name for i in strategy.implementations(OP)] == [IMPL]
    assert OP not in strategy.covered_ops()
    assert strategy.implementations(OP) == []
