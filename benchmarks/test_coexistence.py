"""Coexistence (benchmarks/coexistence.py): each model timed alone and right after a
numpy product and a PyTorch conv, in the same process; run.py's "coexistence" suite takes the
slowdown (after / alone) of each round's process; 21 calls there (--calls)."""

import coexistence
import pytest


@pytest.mark.parametrize("mode", ["alone", "after"])
@pytest.mark.parametrize("model", coexistence.MODELS)
def test_coexistence(measure, settings, model, mode):
    before = coexistence.Work() if mode == "after" else None
    measure(coexistence.case(model), before=before)
