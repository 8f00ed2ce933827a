"""Strassen's two kernels of sums (topi_accel/strassen.py) against numpy."""

import math

import numpy as np
import pytest

import topi_accel
from tests.helpers import assert_close, isa_params, rand, run_primfunc


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
@pytest.mark.parametrize("target", isa_params())
@pytest.mark.parametrize("h, k", [(5, 24), (64, 384), (3, 7)], ids=str)
def test_strassen_lefts_stacks_the_seven_left_operands(h, k, target, parallel):
    x = rand(2 * h, 2 * k)
    a11, a12, a21, a22 = x[:h, :k], x[:h, k:], x[h:, :k], x[h:, k:]
    expected = np.stack([a11 + a22, a21 + a22, a11, a22, a11 + a12, a21 - a11, a12 - a22])
    out = run_primfunc(topi_accel.strassen_lefts_func(h, k, parallel=parallel), [x], (7, h, k), target)
    np.testing.assert_array_equal(out, expected)  # one float32 sum or copy per element


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
@pytest.mark.parametrize("target", isa_params())
@pytest.mark.parametrize("rows, n", [((10,), 48), ((2, 64), 1536), ((1, 6), 14)], ids=str)
def test_strassen_combine_sums_the_seven_products_into_the_four_blocks(rows, n, target, parallel):
    h = math.prod(rows) // 2
    products = rand(7, h, n // 2)
    p1, p2, p3, p4, p5, p6, p7 = products
    expected = np.block([[p1 + p4 - p5 + p7, p3 + p5], [p2 + p4, p1 - p2 + p3 + p6]]).reshape(*rows, n)
    func = topi_accel.strassen_combine_func(rows, n, parallel=parallel)
    out = run_primfunc(func, [products], (*rows, n), target)
    assert_close(out, expected)


def test_strassen_combine_needs_even_rows_and_outputs():
    with pytest.raises(ValueError, match=r"strassen_combine: rows \[1, 5\] \(5\) and outputs 8 must be even"):
        topi_accel.strassen_combine_func((1, 5), 8)
