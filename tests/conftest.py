"""The torchvision shim (tests/torchvision_shim.py), before any test imports transformers or
timm; and Hypothesis profiles: "ci" (the default) draws the same examples on every run, so that a
test run is repeatable; "explore" draws new, and more, examples each time:

    python -m pytest tests/test_fuzz.py --hypothesis-profile=explore
"""

from hypothesis import HealthCheck, settings

from tests import torchvision_shim

torchvision_shim.install()

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "print_blob": True}
settings.register_profile("ci", derandomize=True, max_examples=40, **_COMMON)
settings.register_profile("explore", max_examples=400, **_COMMON)
settings.load_profile("ci")
