"""What ran where: for every op, its shapes, layouts and kernel; the runtime layout transforms;
the steps of ours that failed somewhere and left it as it was (declines).

`report(executable_or_module)` returns a `Report`: printable as a table
(`str(report)`), and plain data (`report.to_dict()`, `report.to_json()`).
Transform counts always come from what the executable (or lowered module)
calls, so the report cannot claim less than what runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import tvm
from tvm import relax

import strategy
import topi_accel
from strategy import Decision
from strategy.dispatch import describe_inputs
from strategy.layout import WEIGHT_TRANSFORM
from strategy.registry import Decline

ACCEL_KERNELS = topi_accel.epilogue.OUTPUT_BLOCKS  # each compute's kernel is named after it
TRANSFORM_KERNELS = ("transpose", "layout_transform")
_CALL = re.compile(r"^\s*call\s+(\S+)\s+in:\s*(.*?)\s+dst:")
_LAYOUT_ATTRS = ("data_layout", "kernel_layout", "out_layout", "layout")


@dataclass(frozen=True)
class KernelCounts:
    """The kernels `main` calls, in order, classified by name."""

    calls: tuple[str, ...]
    accel: int
    activation_transforms: int
    weight_transforms: int

    @property
    def layout_transforms(self) -> int:
        return self.activation_transforms + self.weight_transforms


def is_accel_kernel(name: str) -> bool:
    """Whether a kernel name is an accel compute's (fused_conv2d_nhwc_ohwi3_add_relu too)."""
    return any(k in name for k in ACCEL_KERNELS)


def _classify(calls: Sequence[tuple[str, bool]]) -> KernelCounts:
    """Count (kernel name, all inputs are constants) pairs.

    A layout transform is a weight transform when it is the strategies'
    runtime weight packing or when it reads only constants (a transform
    compile time could have folded); otherwise it moves activations.
    """
    accel = activations = weights = 0
    for name, const_input in calls:
        if is_accel_kernel(name):
            accel += 1
        # a transform fused into another kernel keeps its name there, and still counts
        if any(t in name for t in TRANSFORM_KERNELS):
            if WEIGHT_TRANSFORM in name or const_input:
                weights += 1
            else:
                activations += 1
    return KernelCounts(tuple(name for name, _ in calls), accel, activations, weights)


def runtime_kernels(executable: relax.VMExecutable, function: str = "main") -> KernelCounts:
    """Count the kernels `function` of an executable calls, read from its VM bytecode."""
    calls, in_function = [], False
    for line in executable.as_text().splitlines():
        if line.startswith("@"):
            in_function = line.rstrip(":") == f"@{function}"
            continue
        match = _CALL.match(line)
        if in_function and match and not match.group(1).startswith("vm.builtin"):
            name, args = match.groups()
            inputs = [a.strip() for a in args.split(",")][:-1]  # the last argument is the output
            calls.append((name, bool(inputs) and all(a.startswith("c[") for a in inputs)))
    return _classify(calls)


def calls_of(mod: tvm.IRModule, ops, function: str = "main") -> list[relax.Call]:
    """The calls in `function` of any op named in `ops`, in post order."""
    found = []
    relax.analysis.post_order_visit(
        mod[function],
        lambda e: found.append(e) if isinstance(e, relax.Call) and getattr(e.op, "name", "") in ops else None,
    )
    return found


def module_kernels(mod: tvm.IRModule, function: str = "main") -> KernelCounts:
    """Count the kernels `function` of a lowered IRModule calls (call_tir, call_tir_inplace)."""
    calls = []
    for call in calls_of(mod, ("relax.call_tir", "relax.call_tir_inplace"), function):
        inputs = list(call.args[1].fields)
        const = bool(inputs) and all(isinstance(a, tvm.ir.expr.Constant) for a in inputs)
        calls.append((call.args[0].name_hint, const))
    return _classify(calls)


@dataclass(frozen=True)
class OpRow:
    """One op of the model: what it got. kind: "accel", "fallback" (an accel
    implementation exists but did not match: reason says why) or "tvm" (no
    accel implementation for this op)."""

    op: str
    inputs: tuple[str, ...]
    layouts: str
    kind: str
    kernel: str
    reason: str = ""


@dataclass(frozen=True)
class Report:
    """rows: what every op got; kernels: what the executable calls; declines: the steps that
    failed somewhere and left it as it was (strategy.registry.Decline: step, where, reason)."""

    rows: tuple[OpRow, ...]
    kernels: KernelCounts | None = field(default=None)
    declines: tuple[Decline, ...] = field(default=())

    @staticmethod
    def from_rows(
        rows: Sequence[tuple[str, tuple[str, ...], str]],
        decisions: Sequence[Decision],
        target_keys,
        declines: Sequence[Decline] = (),
    ) -> Report:
        """Join the graph's op calls with the strategy decisions, in order (the dispatcher
        records a decision for every op with an implementation for `target_keys`)."""
        covered = {op for op in strategy.covered_ops() if strategy.implementations(op, target_keys)}
        pending = list(decisions)
        out = []
        for op, inputs, layouts in rows:
            # the next decision for this op and these inputs (calls outside main's top level,
            # in branches or other functions, have decisions but no row: skip them)
            found = (
                next((i for i, d in enumerate(pending) if d.op == op and d.inputs == inputs), None)
                if op in covered
                else None
            )
            if found is None:
                out.append(OpRow(op, inputs, layouts, "tvm", "TVM", ""))
                continue
            d, pending = pending[found], pending[found + 1 :]
            kind = "fallback" if d.fallback else "accel"
            out.append(OpRow(op, inputs, layouts, kind, d.implementation or "TVM", d.reason))
        return Report(tuple(out), declines=tuple(declines))

    def with_kernels(self, kernels: KernelCounts) -> Report:
        return replace(self, kernels=kernels)

    def with_declines(self, declines: Sequence[Decline]) -> Report:
        return replace(self, declines=tuple(declines))

    def count(self, kind: str, ops: Sequence[str] | None = None) -> int:
        return sum(r.kind == kind and (ops is None or r.op in ops) for r in self.rows)

    def to_dict(self) -> dict:
        out = {"ops": [asdict(r) for r in self.rows], "declines": [asdict(d) for d in self.declines]}
        if self.kernels is not None:
            k = self.kernels
            out["runtime"] = {
                "kernels": list(k.calls),
                "accel_kernels": k.accel,
                "activation_transforms": k.activation_transforms,
                "weight_transforms": k.weight_transforms,
            }
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        table = [("op", "inputs", "layouts", "kernel")]
        for r in self.rows:
            kernel = r.kernel if r.kind != "fallback" else f"TVM fallback: {r.reason}"
            table.append((r.op.removeprefix("relax."), " ".join(r.inputs), r.layouts, kernel))
        lines = [_format(table)]
        if self.kernels is not None:
            k = self.kernels
            lines.append(
                f"{len(k.calls)} kernels at run time, {k.accel} on accel; runtime layout transforms: "
                f"{k.activation_transforms} of activations, {k.weight_transforms} of weights"
            )
        lines.extend(f"declined (left as it was): {d.step} on {d.where}: {d.reason}" for d in self.declines)
        return "\n".join(lines)


def _format(table) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(line.rstrip() for line in lines)


def _layouts(call: relax.Call) -> str:
    attrs = call.attrs
    if attrs is None:
        return ""
    found = [f"{name}={getattr(attrs, name)}" for name in _LAYOUT_ATTRS if hasattr(attrs, name)]
    return " ".join(found)


def op_rows(mod: tvm.IRModule, function: str = "main") -> list[tuple[str, tuple[str, ...], str]]:
    """(op, inputs, layouts) of every op call in `function`, in binding order."""
    rows = []
    for block in mod[function].body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                if value.op.name == "relax.call_tir":  # a kernel a graph pass chose already (fast_erf)
                    rows.append(
                        (value.args[0].name_hint, describe_inputs(relax.Call(value.op, list(value.args[1].fields))), "")
                    )
                else:
                    rows.append((value.op.name, describe_inputs(value), _layouts(value)))
    return rows
