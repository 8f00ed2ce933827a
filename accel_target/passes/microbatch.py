"""MicroBatch: the leading layers of a batch run one sample at a time, the rest on the batch.

A batch of N images streams N times each early layer's activations through memory: ResNet-50's
56x56x256 float32 layers write 26 MB per layer at batch 8 against 3.2 MB at batch 1, which stays
in cache for the next layer, while their weights are small (64 KB). Late layers are the other way
round: 9.4 MB of weights against 0.2 MB of activations per sample, read once per batch instead of
once per sample. At batch 8 the rule below runs ResNet-50's 56x56, 28x28 and 14x14 stages per
sample and its 7x7 one on the batch.

The pass rewrites ``main``: its first input, of a static batch N >= 2, is split along the batch
after the layout transforms that lead from it (one transform of the whole batch, as before); the
leading ops run once per sample (the same kernels at batch 1, one copy of the ops per sample in
``main``); their results are concatenated along the batch for the rest. The leading part is a
run of ops that treat each sample apart (`per_sample`), cut where one tensor carries everything
that follows (a block boundary), and it grows block by block while a block's activation of the
whole batch (its input tensor, N samples) weighs at least its weights: past that point reading
the weights once per sample costs more than streaming the batch's activations. It is only worth
it where the batch's activations leave the caches (`MIN_BATCH_BYTES`); anything else, and any
model where the rule keeps no block, is left as it was.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import static_shape

from .op_kinds import is_elementwise
from .relax_util import op_name

# a batch's activation entering the leading part must be at least this big (bytes) for the split:
# smaller ones stay in the caches across layers anyway (of the order of a core's L2, 1-2 MB)
MIN_BATCH_BYTES = 4 * 2**20
# weights: the constant operand of these ops
WEIGHTED = {"relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul"}
WINDOWED = {"relax.nn.conv2d", "relax.nn.conv1d", "relax.nn.max_pool2d", "relax.nn.avg_pool2d"}


def _bytes(expr) -> int:
    return math.prod(static_shape(expr)) * tvm.DataType(str(expr.ty.dtype)).bits // 8


def _keeps_batch_axis(call: relax.Call) -> bool:
    """The op's layout attributes put the batch first (NCHW, NHWC, NCW, NWC)."""
    for name in ("data_layout", "layout", "out_layout"):
        value = getattr(call.attrs, name, None)
        if value is not None and not str(value).startswith("N"):
            return False
    return True


def per_sample(call: relax.Call, batched: set, batch: int) -> bool:
    """Whether `call` computes sample i of its result from sample i of its `batched` operands
    alone, its other operands constants that are not batched (weights, biases)."""
    name = op_name(call)
    out = static_shape(call)
    if name is None or out is None or out[:1] != [batch]:
        return False
    operands = list(call.args[0].fields) if name == "relax.concat" else list(call.args)
    for index, arg in enumerate(operands):
        if isinstance(arg, relax.Var):
            if arg not in batched or (static_shape(arg) or [])[:1] != [batch]:
                return False
        elif isinstance(arg, Constant):
            shape = static_shape(arg) or []
            weight = name in WEIGHTED and index == 1
            if not weight and len(shape) == len(out) and shape[:1] != [1]:
                return False  # a constant with a batch of its own
        elif isinstance(getattr(arg, "ty", None), (relax.TensorType, relax.TupleType)):
            return False  # (shapes and other attribute-like operands pass)
    if is_elementwise(call):  # (sample i of the result from sample i of each operand)
        return True
    if name in WINDOWED:
        return _keeps_batch_axis(call) and not isinstance(call.args[0], Constant)
    if name == "relax.permute_dims":
        return int(call.attrs.axes[0]) == 0 if call.attrs.axes is not None else False
    if name == "relax.matmul":
        return isinstance(call.args[1], Constant) and len(static_shape(call.args[1])) == 2
    if name == "relax.concat":
        return int(call.attrs.axis) % len(out) != 0
    if name in ("relax.mean", "relax.sum", "relax.max"):
        return call.attrs.axis is not None and all(int(a) % len(static_shape(call.args[0])) for a in call.attrs.axis)
    if name == "relax.reshape":
        return (static_shape(call.args[0]) or [])[:1] == [batch]
    return False


def dataflow_bindings(func: relax.Function) -> list[relax.VarBinding] | None:
    """The bindings of `func`'s one dataflow block (None for any other body)."""
    blocks = func.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        return None
    bindings = list(blocks[0].bindings)
    return bindings if all(isinstance(b, relax.VarBinding) for b in bindings) else None


def plan(func: relax.Function) -> tuple[relax.Var, list[relax.VarBinding], relax.Var] | None:
    """(the batched tensor to split, the bindings that run per sample, the tensor they end at)
    for `func`, or None when the split does not apply (see the module's docstring)."""
    bindings = dataflow_bindings(func)
    shape = static_shape(func.params[0]) if bindings is not None and func.params else None
    if not shape or shape[0] < 2:
        return None
    batch = shape[0]
    last_read = {}
    for index, binding in enumerate(bindings):
        last_read.update(dict.fromkeys(relax.analysis.free_vars(binding.value), index))
    last_read.update(dict.fromkeys(relax.analysis.free_vars(func.body.body), len(bindings)))
    # the split: after the layout transforms of the input, one transform of the whole batch
    start, first = func.params[0], 0
    while (
        first < len(bindings)
        and op_name(bindings[first].value) == "relax.permute_dims"
        and bindings[first].value.args[0].same_as(start)
        and last_read.get(start) == first
        and per_sample(bindings[first].value, {start}, batch)
    ):
        start, first = bindings[first].var, first + 1
    # the per-sample run from there, and the points where one tensor carries all of it
    batched, live, cuts, weights = {start}, {start}, [(first - 1, start, 0)], 0
    for index in range(first, len(bindings)):
        binding = bindings[index]
        if not set(relax.analysis.free_vars(binding.value)) & batched or not per_sample(binding.value, batched, batch):
            break
        batched.add(binding.var)
        if op_name(binding.value) in WEIGHTED and isinstance(binding.value.args[1], Constant):
            weights += _bytes(binding.value.args[1])
        live = {v for v in live | {binding.var} if last_read.get(v, -1) > index}
        if live == {binding.var} and last_read[binding.var] < len(bindings):
            cuts.append((index, binding.var, weights))
    # grow block by block while the batch's activation entering a block weighs its weights
    end, largest = None, 0
    for (_, entry, before), (index, var, after) in zip(cuts, cuts[1:]):
        activation = _bytes(entry)  # of the whole batch
        if activation < after - before:
            break
        end, largest = (index, var), max(largest, activation)
    if end is None or largest < MIN_BATCH_BYTES:
        return None
    return start, bindings[first : end[0] + 1], end[1]


def _per_sample_call(call: relax.Call, remap: dict) -> relax.Call:
    """`call` on the samples' variables `remap` gives, a reshape to a shape of one sample."""
    args = []
    for arg in call.args:
        if isinstance(arg, relax.Var):
            arg = remap[arg]
        elif isinstance(arg, relax.Tuple):
            arg = relax.Tuple([remap[a] for a in arg.fields])
        elif isinstance(arg, relax.ShapeExpr) and op_name(call) == "relax.reshape":
            arg = relax.ShapeExpr([1, *arg.values[1:]])
        args.append(arg)
    return relax.Call(call.op, args, call.attrs)


@mutator
class _Split(PyExprMutator):
    """main with `head` (bindings from `start` to `end`) emitted once per sample of `start`,
    where its first binding was, and `end` bound to their results concatenated."""

    def __init__(self, mod: tvm.IRModule, start: relax.Var, head: list, end: relax.Var):
        super().__init__(mod)
        self.start, self.head, self.end = start, head, end
        self.skipped = {b.var for b in head[1:]}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var.same_as(self.head[0].var):
            self._emit_samples()
        elif binding.var not in self.skipped:
            super().visit_var_binding_(binding)

    def _emit_samples(self) -> None:
        batch = static_shape(self.start)[0]
        samples = self.builder_.emit(relax.op.split(self.visit_expr(self.start), batch, axis=0), "samples")
        results = []
        for i in range(batch):
            remap = {self.start: self.builder_.emit(relax.TupleGetItem(samples, i), f"sample{i}")}
            for binding in self.head:
                remap[binding.var] = self.builder_.emit(_per_sample_call(binding.value, remap), binding.var.name)
            results.append(remap[self.end])
        joined = self.builder_.emit(relax.op.concat(results, axis=0), self.end.name)
        self.set_var_remap(self.end, joined)


@tvm.transform.module_pass(opt_level=0, name="MicroBatch")
def micro_batch(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """main's leading layers per sample where `plan` finds them worth it (see the module's docstring)."""
    if "main" not in mod or not isinstance(mod["main"], relax.Function):
        return mod
    found = plan(mod["main"])
    if found is None:
        return mod
    rewriter = _Split(mod, *found)
    rewriter.builder_.update_func(mod.get_global_var("main"), rewriter.visit_expr(mod["main"]))
    return rewriter.builder_.get()
