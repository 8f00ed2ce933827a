"""The model zoo: the timm CNNs and hybrids and the Keras applications that tests/models checks
for correctness, timed against their peers (the cases: zoo_models.py)."""

import pytest
from zoo_models import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_zoo(measure, case):
    measure(case)
