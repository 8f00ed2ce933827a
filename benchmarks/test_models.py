"""Whole models at batch 1 (tests/models/classic.py, random weights): ResNet-50, MobileNetV2 and a
2-layer BERT-base encoder; the CNNs fed channels-last to the contenders that take it."""

import functools

import pytest
from contenders import Case

from tests.models import classic
from tests.models.classic import MODELS, make


def _model(name: str):
    model, x = make(name)
    return model, (x,)


CASES = [
    Case(name, functools.partial(_model, name), channels_last=len(shape) == 4, source=classic.__file__)
    for name, (_, shape) in MODELS.items()
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_model(measure, case):
    measure(case)
