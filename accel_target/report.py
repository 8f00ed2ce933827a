"""What ran where: the strategy decisions and the kernels an executable calls."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tvm import relax

from strategy import Decision
from strategy.layout import WEIGHT_TRANSFORM

ACCEL_KERNELS = ("conv2d_nhwc_ohwi", "dense_kn")
TRANSFORM_KERNELS = ("transpose", "layout_transform")
_CALL = re.compile(r"^\s*call\s+(\S+)\s+in:\s*(.*?)\s+dst:")


@dataclass(frozen=True)
class KernelCounts:
    """The kernels `main` of an executable calls, in order, classified by name."""

    calls: tuple[str, ...]
    accel: int
    activation_transforms: int
    weight_transforms: int

    @property
    def layout_transforms(self) -> int:
        return self.activation_transforms + self.weight_transforms


def runtime_kernels(executable: relax.VMExecutable, function: str = "main") -> KernelCounts:
    """Count the kernels `function` calls, read from the VM bytecode.

    A layout transform is a weight transform when it is the strategies'
    runtime weight packing or when its input is a constant (a transform
    compile time could have folded); otherwise it moves activations.
    """
    calls, accel, activations, weights = [], 0, 0, 0
    in_function = False
    for line in executable.as_text().splitlines():
        if line.startswith("@"):
            in_function = line.rstrip(":") == f"@{function}"
            continue
        match = _CALL.match(line)
        if not in_function or not match or match.group(1).startswith("vm.builtin"):
            continue
        name, args = match.groups()
        calls.append(name)
        if name.startswith(ACCEL_KERNELS):
            accel += 1
        elif any(t in name for t in TRANSFORM_KERNELS):
            if WEIGHT_TRANSFORM in name or args.split(",")[0].strip().startswith("c["):
                weights += 1
            else:
                activations += 1
    return KernelCounts(tuple(calls), accel, activations, weights)


def format_table(decisions: Sequence[Decision]) -> str:
    """The decisions as a text table: op, inputs, kernel chosen or fallback and why."""
    rows = [("op", "inputs", "kernel")]
    for d in decisions:
        kernel = d.implementation or f"TVM fallback: {d.reason}"
        rows.append((d.op, " ".join(d.inputs), kernel))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
