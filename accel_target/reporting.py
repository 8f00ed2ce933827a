"""What ran where: for every op, its shapes, layouts and kernel; the runtime layout transforms;
the steps of ours that failed somewhere and left it as it was (declines).

`accel_target.report(...)` returns a `Report`: printable as a table (`str(report)`), and
plain data (`report.to_dict()`, `report.to_json()`, `Report.from_dict`).

Everything is read from the IR, never matched back through formatted strings:
- which kernel an op got: the attributes the dispatcher sets on the kernels it makes
  (strategy.dispatch: IMPL, FALLBACK, SKIPPED), found in the bindings that LegalizeOps
  puts in place of the op's binding (whose variable it keeps);
- which accel kernel an elementwise op was fused into: the fusion group (FuseOps) that holds
  one of its bindings and a kernel carrying IMPL;
- which kernels run: the calls of `main` in the module the executable is made of, with
  their kind from the same attributes. An executable that `build` did not make (plain
  ``tvm.compile``) carries no attributes and offers its calls only as bytecode text: it is
  read from ``as_text()``, and its accel kernels known by the implementations' compute
  names ("conv2d_nhwc_ohwi" of "conv2d_nhwc_ohwi.accel") that its kernel names contain.
Transforms are counted by kernel name: runtime layout changes are kernels named
`transpose` or `layout_transform`, so that they stay visible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import tvm
from tvm import relax

import strategy
from strategy.dispatch import FAILED, FALLBACK, SKIPPED, describe_inputs
from strategy.layout import WEIGHT_TRANSFORM
from topi_accel.epilogue import IMPL

from .declines import Decline
from .passes.relax_util import bindings as _bindings

TRANSFORM_KERNELS = ("transpose", "layout_transform")
# kinds of OpRow: an accel kernel; TVM's kernel although an accel implementation exists (reason
# says why); computed inside an accel kernel (fused into its write-back); TVM's kernel
ACCEL, FALLBACK_KIND, FUSED, TVM = "accel", "fallback", "fused", "tvm"
_CALL = re.compile(r"^\s*call\s+(\S+)\s+in:\s*(.*?)\s+dst:")
_LAYOUT_ATTRS = ("data_layout", "kernel_layout", "out_layout", "layout")
_KERNEL_CALLS = ("relax.call_tir", "relax.call_tir_inplace")


@dataclass(frozen=True)
class KernelCounts:
    """The kernels `main` calls, in order; how many are accel's, and the layout transforms."""

    calls: tuple[str, ...]
    accel: int
    activation_transforms: int
    weight_transforms: int

    @property
    def layout_transforms(self) -> int:
        return self.activation_transforms + self.weight_transforms


def _classify(calls: Sequence[tuple[str, bool, bool]]) -> KernelCounts:
    """Count (kernel name, all inputs are constants, is an accel kernel) triples.

    A layout transform is a weight transform when it is the strategies'
    runtime weight packing or when it reads only constants (a transform
    compile time could have folded); otherwise it moves activations.
    """
    activations = weights = 0
    for name, const_input, _ in calls:
        # a transform fused into another kernel keeps its name there, and still counts
        if any(t in name for t in TRANSFORM_KERNELS):
            if WEIGHT_TRANSFORM in name or const_input:
                weights += 1
            else:
                activations += 1
    return KernelCounts(tuple(name for name, _, _ in calls), sum(a for _, _, a in calls), activations, weights)


def calls_of(mod: tvm.IRModule, ops, function: str = "main") -> list[relax.Call]:
    """The calls in `function` of any op named in `ops`, in post order."""
    found = []
    relax.analysis.post_order_visit(
        mod[function],
        lambda e: found.append(e) if isinstance(e, relax.Call) and getattr(e.op, "name", "") in ops else None,
    )
    return found


def kernel_impl(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> str | None:
    """The implementation that made kernel `gvar` of `mod` (its IMPL attribute), or None (none
    such, or not in `mod`: a kernel a later phase made)."""
    func = mod.functions.get(gvar)
    if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and IMPL in func.attrs:
        return str(func.attrs[IMPL])
    return None


def _kernel_call(mod: tvm.IRModule, expr) -> tuple[tvm.ir.GlobalVar, list] | None:
    """(kernel, inputs) of a call to a PrimFunc of `mod`: call_tir / call_tir_inplace, or, once
    lowered for the VM, a direct call whose last argument is the output; else None."""
    if not isinstance(expr, relax.Call):
        return None
    if getattr(expr.op, "name", "") in _KERNEL_CALLS:
        return expr.args[0], list(expr.args[1].fields)
    if isinstance(expr.op, tvm.ir.GlobalVar) and isinstance(mod[expr.op], tvm.tirx.PrimFunc):
        return expr.op, list(expr.args)[:-1]
    return None


def module_kernels(mod: tvm.IRModule, function: str = "main") -> KernelCounts:
    """Count the kernels `function` of a module calls (call_tir, call_tir_inplace, or the
    calls of a module lowered for the VM), accel's known by their IMPL attribute."""
    calls = []

    def visit(expr) -> None:
        found = _kernel_call(mod, expr)
        if found is None:
            return
        gvar, inputs = found
        const = bool(inputs) and all(isinstance(a, tvm.ir.expr.Constant) for a in inputs)
        calls.append((gvar.name_hint, const, kernel_impl(mod, gvar) is not None))

    relax.analysis.post_order_visit(mod[function], visit)
    return _classify(calls)


def accel_computes() -> set[str]:
    """The compute names of the registered implementations ("conv2d_nhwc_ohwi" of "conv2d_nhwc_ohwi.accel")."""
    return {impl.name.split(".")[0] for op in strategy.covered_ops() for impl in strategy.implementations(op)}


def is_accel_kernel_name(name: str, computes: set[str]) -> bool:
    """Whether a kernel name contains one of `computes` (`accel_computes()`): the only sign
    an executable without attributes gives (see the module's docstring)."""
    return any(compute in name for compute in computes)


def runtime_kernels(executable: relax.VMExecutable, function: str = "main") -> KernelCounts:
    """Count the kernels `function` of an executable calls, read from its VM bytecode text
    (TVM 0.27's VMExecutable gives no structured access to its instructions)."""
    calls, in_function, computes = [], False, accel_computes()
    for line in executable.as_text().splitlines():
        if line.startswith("@"):
            in_function = line.rstrip(":") == f"@{function}"
            continue
        match = _CALL.match(line)
        if in_function and match and not match.group(1).startswith("vm.builtin"):
            name, args = match.groups()
            inputs = [a.strip() for a in args.split(",")][:-1]  # the last argument is the output
            const = bool(inputs) and all(a.startswith("c[") for a in inputs)
            calls.append((name, const, is_accel_kernel_name(name, computes)))
    return _classify(calls)


@dataclass(frozen=True)
class OpRow:
    """One op of the model: what it got. kind: "accel", "fallback" (an accel implementation
    exists but did not match: reason says why), "fused" (computed inside an accel kernel, in
    its write-back: kernel is "fused into <implementation>") or "tvm" (TVM's own kernel). skipped: the
    implementations tried before the one taken (accel) or all of them (fallback)."""

    op: str
    inputs: tuple[str, ...]
    layouts: str
    kind: str
    kernel: str
    reason: str = ""
    skipped: tuple[tuple[str, str], ...] = ()  # (implementation, why not) tried before, best first


def _layouts(call: relax.Call) -> str:
    attrs = call.attrs
    if attrs is None:
        return ""
    found = [f"{name}={getattr(attrs, name)}" for name in _LAYOUT_ATTRS if hasattr(attrs, name)]
    return " ".join(found)


def op_bindings(mod: tvm.IRModule, function: str = "main") -> list[tuple[relax.Var, str, tuple[str, ...], str]]:
    """(variable, op, inputs, layouts) of every op call bound in `function`, in binding order."""
    rows = []
    for binding in _bindings(mod[function]):
        value = binding.value
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
            continue
        if value.op.name == "relax.call_tir":  # a kernel a graph pass chose already (fast_erf)
            inputs = describe_inputs(relax.Call(value.op, list(value.args[1].fields)))
            rows.append((binding.var, value.args[0].name_hint, inputs, ""))
        else:
            rows.append((binding.var, value.op.name, describe_inputs(value), _layouts(value)))
    return rows


def _skipped(attrs) -> tuple[tuple[str, str], ...]:
    return tuple((str(name), str(why)) for name, why in attrs[SKIPPED]) if SKIPPED in attrs else ()


def _decision(mod: tvm.IRModule, values: list) -> tuple[str | None, str, tuple] | None:
    """(implementation, "", skipped) or (None, fallback reason, skipped) from the attributes of
    the kernels the bound `values` call; None if none has them."""
    found, kernels = None, []

    def visit(expr) -> None:
        call = _kernel_call(mod, expr)
        if call is not None:
            kernels.append(call[0])

    for value in values:
        relax.analysis.post_order_visit(value, visit)
    for gvar in kernels:
        attrs, impl = mod[gvar].attrs, kernel_impl(mod, gvar)
        if impl is not None:
            return impl, "", _skipped(attrs)
        if attrs is not None and FALLBACK in attrs:
            found = (None, str(attrs[FALLBACK]), _skipped(attrs))
    return found


def segments(graph_vars, legalized: tvm.IRModule, function: str = "main") -> dict:
    """graph variable -> the bindings LegalizeOps put in place of its binding, in order (those
    up to the binding of that variable, which it keeps)."""
    wanted, out, pending = set(graph_vars), {}, []
    for binding in _bindings(legalized[function]):
        pending.append(binding)
        if binding.var in wanted:
            out[binding.var], pending = pending, []
    return out


def decisions(segmented: dict, legalized: tvm.IRModule) -> dict:
    """graph variable -> (implementation or None, fallback reason, skipped), read from the kernels
    of its bindings in `segmented` (`segments`), for the ops the dispatcher decided."""
    out = {}
    for var, bindings in segmented.items():
        found = _decision(legalized, [b.value for b in bindings])
        if found is not None:
            out[var] = found
    return out


def _original_binding(inner: relax.VarBinding, legalized: tvm.IRModule, by_callee: dict, mapped: dict, taken):
    """The variable of the legalized binding that FuseOps moved into a group as `inner`: the
    same kernel, not one already in `taken`, reading the legalized variables `mapped` gives
    for the group's own variables it reads (the group's parameters and the variables of
    another call of the same group read anything). by_callee: kernel -> (variable, inputs) of
    the legalized bindings that call it, in binding order."""
    found = _kernel_call(legalized, inner.value)
    if found is None:
        return None
    callee, args = found
    for var, inputs in by_callee.get(callee, ()):
        if var in taken or len(inputs) != len(args):
            continue
        if all(mapped[a].same_as(b) for a, b in zip(args, inputs) if isinstance(a, relax.Var) and a in mapped):
            return var
    return None


def fused_into(segmented: dict, legalized: tvm.IRModule, groups, function: str = "main") -> dict:
    """graph variable -> implementation of the accel kernel that FuseOps grouped its op with.

    segmented: `segments` of the legalized module. groups: the functions FuseOps made, once
    per call in call order (identical groups share one function: `pipeline.note_fusion`); a
    group with a kernel carrying IMPL becomes that accel kernel. A group's bindings keep the
    variables of the legalized module, but for its output, and for every call of a shared
    function after the first: those are matched kernel by kernel (`_original_binding`).
    """
    legalized_bindings = _bindings(legalized[function])
    known = {b.var for b in legalized_bindings}
    by_callee: dict = {}
    for binding in legalized_bindings:
        found = _kernel_call(legalized, binding.value)
        if found is not None:
            by_callee.setdefault(found[0], []).append((binding.var, found[1]))
    hosted = []
    for group in groups:
        inner = _bindings(group)
        impls = [kernel_impl(legalized, k[0]) for b in inner if (k := _kernel_call(legalized, b.value)) is not None]
        impl = next((i for i in impls if i is not None), None)
        if impl is not None:
            hosted.append((inner, impl))
    member: dict = {}
    calls = []  # (bindings, implementation, group variable -> legalized variable)
    for inner, impl in hosted:  # first the bindings that kept their variable (a first call)
        kept = [b.var for b in inner if b.var in known]
        first = not any(var in member for var in kept)
        if first:
            member.update((var, impl) for var in kept)
        calls.append((inner, impl, {var: var for var in kept} if first else {}))
    for inner, impl, mapped in calls:  # then the others: a group's output, the repeated calls
        for binding in inner:
            if binding.var in mapped:
                continue
            var = _original_binding(binding, legalized, by_callee, mapped, member)
            if var is not None:
                member[var] = impl
                mapped[binding.var] = var
    out = {}
    for var, bindings in segmented.items():
        impl = next((member[b.var] for b in bindings if b.var in member), None)
        if impl is not None:
            out[var] = impl
    return out


@dataclass(frozen=True)
class Report:
    """rows: what every op got; kernels: what the executable calls; declines: the steps that
    failed somewhere and left it as it was (accel_target.declines.Decline: step, where, reason)."""

    rows: tuple[OpRow, ...]
    kernels: KernelCounts | None = field(default=None)
    declines: tuple[Decline, ...] = field(default=())

    @staticmethod
    def of_modules(
        graph: tvm.IRModule,
        legalized: tvm.IRModule,
        groups: Sequence = (),
        declines: Sequence[Decline] = (),
        folds: dict | None = None,
    ) -> Report:
        """The rows of `graph`'s main (after the graph passes), with what each op got in
        `legalized` (after LegalizeOps), and the accel kernel it was fused into by the
        fusion `groups` (see `fused_into`) or by FoldViews (`folds`: its log, see
        accel_target.passes.fold_views)."""
        ops = op_bindings(graph)
        segmented = segments([var for var, *_ in ops], legalized)
        decided = decisions(segmented, legalized)
        hosts = fused_into(segmented, legalized, groups)
        taken_in = {}  # a layout op that a matmul's kernel reads or writes in place -> its implementation
        for host, (matmul, members) in (folds or {}).items():
            impl = decided.get(host, (None,))[0]
            if impl is None:  # FoldViews was declined: the host is the permute it left
                continue
            decided[matmul] = decided[host]  # the matmul's kernel, bound where its result's permute was
            # the ops the legalized module binds no more; the host itself when it is not the matmul
            taken_in.update((var, impl) for var in members if var not in segmented or var.same_as(host))
        rows = []
        for var, op, inputs, layouts in ops:
            if var in taken_in:
                rows.append(OpRow(op, inputs, layouts, FUSED, f"fused into {taken_in[var]}"))
            elif var in decided:
                impl, reason, skipped = decided[var]
                kind = ACCEL if impl is not None else FALLBACK_KIND
                rows.append(OpRow(op, inputs, layouts, kind, impl or "TVM", reason, skipped))
            elif var in hosts:
                rows.append(OpRow(op, inputs, layouts, FUSED, f"fused into {hosts[var]}"))
            else:
                rows.append(OpRow(op, inputs, layouts, TVM, "TVM"))
        return Report(tuple(rows)).with_declines(declines)

    @staticmethod
    def of_kernels(kernels: KernelCounts) -> Report:
        """A report of an executable known only by the kernels it calls: one row per call."""
        computes = accel_computes()
        rows = tuple(
            OpRow("kernel", (), "", ACCEL if is_accel_kernel_name(name, computes) else TVM, name)
            for name in kernels.calls
        )
        return Report(rows, kernels)

    def with_kernels(self, kernels: KernelCounts) -> Report:
        return replace(self, kernels=kernels)

    def with_declines(self, declines: Sequence[Decline]) -> Report:
        """This report with `declines` (the build's), then the implementations that failed on
        an op (read from the kernels: strategy.dispatch)."""
        failed = [
            Decline(impl, f"{row.op} on {', '.join(row.inputs)}", why.removeprefix(FAILED))
            for row in self.rows
            for impl, why in row.skipped
            if why.startswith(FAILED)
        ]
        return replace(self, declines=(*declines, *failed))

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

    @staticmethod
    def from_dict(data: dict) -> Report:
        """The Report `to_dict` gave (e.g. read back from a saved model's signature file)."""
        rows = tuple(
            OpRow(**{**r, "inputs": tuple(r["inputs"]), "skipped": tuple(tuple(s) for s in r.get("skipped", ()))})
            for r in data["ops"]
        )
        declines = tuple(Decline(**d) for d in data.get("declines", []))
        runtime = data.get("runtime")
        kernels = None
        if runtime is not None:
            kernels = KernelCounts(
                tuple(runtime["kernels"]),
                runtime["accel_kernels"],
                runtime["activation_transforms"],
                runtime["weight_transforms"],
            )
        return Report(rows, kernels, declines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        table = [("op", "inputs", "layouts", "kernel")]
        for r in self.rows:
            table.append((r.op.removeprefix("relax."), " ".join(r.inputs), r.layouts, _kernel_cell(r)))
        lines = [_format(table)]
        if self.kernels is not None:
            k = self.kernels
            lines.append(
                f"{len(k.calls)} kernels at run time, {k.accel} on accel; runtime layout transforms: "
                f"{k.activation_transforms} of activations, {k.weight_transforms} of weights"
            )
        lines.extend(f"declined (left as it was): {d.step} on {d.where}: {d.reason}" for d in self.declines)
        return "\n".join(lines)


def _kernel_cell(row: OpRow) -> str:
    if row.kind == FALLBACK_KIND:
        return f"TVM fallback: {row.reason}"
    return row.kernel


def _format(table) -> str:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)) + "  " + row[-1] for row in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(line.rstrip() for line in lines)
