"""The zoo suite's cases (benchmarks/test_zoo.py): the timm models and Keras applications that
tests/models tests, built by the same definitions (tests/models/timm_zoo.py, keras_zoo.py).

- ``timm-NAME``: the timm model on its [1, 3, 64, 64] image, channels-last (accel builds with
  ``input_layout="NHWC"``, PyTorch and inductor run it in ``channels_last``).
- ``keras-NAME``: the Keras application (its skeleton filled with seeded weights) run by PyTorch
  ops node by node (tests/models/onnx_in_torch.py), since every contender starts from a PyTorch
  model. Its input is NHWC already, [1, 64, 64, 3]: no contender converts it.
"""

from __future__ import annotations

import functools

from contenders import Case

from tests.models import keras_zoo, timm_zoo


def _keras(name: str):
    """(the Keras application `name` as a PyTorch module, (its NHWC input,))."""
    import torch

    from tests.models.onnx_in_torch import OnnxGraph

    return OnnxGraph(keras_zoo.load(name)).eval(), (torch.from_numpy(keras_zoo.example_input(name)),)


# (a case's cache key covers one source file: timm_zoo.py for the timm models, the skeleton for
# a Keras application)
TIMM_CASES = [
    Case(f"timm-{name}", functools.partial(timm_zoo.make, name), channels_last=True, source=timm_zoo.__file__)
    for name in timm_zoo.TIMM
]
KERAS_CASES = [
    Case(f"keras-{name}", functools.partial(_keras, name), source=str(keras_zoo.path(name))) for name in keras_zoo.KERAS
]
CASES = TIMM_CASES + KERAS_CASES
