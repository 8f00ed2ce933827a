"""Let transformers and timm import beside PyPI's torchvision with the CPU build of torch.

PyPI's torchvision is a CUDA build: its C ops do not load with torch's CPU build, and
``import torchvision`` (which transformers and timm do where it is installed) then fails in
torchvision's fake registrations: ``operator torchvision::nms does not exist``. Declaring the
two op schemas it registers against, before that import, is enough; calling them raises (no
model of the tests does).
"""

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARIES = []  # dropping a Library unregisters its ops


def _unavailable(*args, **kwargs):
    raise NotImplementedError("torchvision's C ops are not loaded (a CUDA build beside the CPU torch)")


def install() -> None:
    """Declare torchvision::nms and ::qnms unless torchvision's own C ops did; idempotent."""
    missing = [name for name in _SCHEMAS if not hasattr(torch.ops.torchvision, name)]
    if not missing:
        return
    library = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        library.define(_SCHEMAS[name])
        library.impl(name, _unavailable, "CompositeExplicitAutograd")
    _LIBRARIES.append(library)
