"""FollowLayouts, the last step of SimplifyLayouts: a runtime permute moved down through the ops
that follow their input's layout, wherever that leaves fewer runtime transposes.

ConvertLayout (TVM 0.27) hands an op without layout inference (leakyrelu, softplus, where,
clip, log_softmax, cumsum, ...) its operands back in NCHW, and what comes after it stays NCHW
until the next conv asks for NHWC again: conv -> add -> permute -> leakyrelu -> maxpool ->
permute -> conv. Here any op follows the layout of its input by what it is
(`follow_rules.follow`: elementwise by `op_kinds.is_elementwise`, reductions and other ops of
axes, pooling and resize by their layout attribute), whether TVM registered an inference for it
or not, and the permute moves through it.

The *region* of a permute ``P = permute_dims(x, perm)``: in binding order, each op that reads a
tensor of the region as an operand carried with the layout, and follows, joins it; its result
is a tensor of the region with the permutation `Follow.out_perm`. Another operand of such an op
that is the same permute of something joins as a second entry. Computed from the sources
instead, the region ends:

- at a permute of one of its tensors: one permute of the source (none when they cancel);
- at any other reader of one of its tensors (a reshape, a matmul, the block's output): that
  tensor is permuted back for it, once;
- an operand that is neither is converted: a constant at compile time, a tensor by a reshape
  where only size-1 axes move, else by a permute.

A region is rewritten when the runtime transposes it removes (entries that no longer have a
reader, permutes that cancel) outnumber those it adds (`_Region.gain`); disjoint regions of a
round are rewritten together, and rounds repeat while one applies.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array, static_shape

from .follow_rules import Follow, follow, inverse, reshape_orders, source_shape
from .relax_util import PERMUTE, moves_only_unit_axes, op_name, permute_axes, with_function

MAX_ROUNDS = 8  # each round moves permutes as far as one region reaches; chains need a few


def transposes(perm: list[int], shape) -> int:
    """Runtime transposes of ``permute_dims`` by `perm` of a tensor of `shape` (its source's):
    0 for the identity or a permute of only size-1 axes (a reshape), else 1."""
    if list(perm) == sorted(perm):
        return 0
    dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in shape or []]
    return 0 if dims and None not in dims and moves_only_unit_axes(dims, perm) else 1


def _is_constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Constant) and isinstance(expr.ty, relax.TensorType)


def _shape(expr) -> list | None:
    shape = getattr(expr.ty, "shape", None)
    return None if shape is None else list(shape)


class _Block:
    """A dataflow block's bindings: the index of each variable's, the variables each reads, the
    bindings that read each variable, and the variables read outside the block (`escaping`)."""

    def __init__(self, block: relax.DataflowBlock, escaping: set):
        self.bindings, self.escaping = list(block.bindings), escaping
        self.index = {b.var: i for i, b in enumerate(self.bindings)}
        self.reads, self.users = [], {b.var: [] for b in self.bindings}
        for i, binding in enumerate(self.bindings):
            self.reads.append(self._read(binding.value))
            for var in self.reads[-1]:
                self.users[var].append(i)

    def _read(self, value) -> list:
        """The block's variables that `value` reads, once each."""
        found = []
        relax.analysis.post_order_visit(value, lambda e: found.append(e) if e in self.index else None)
        return list(dict.fromkeys(found))

    def value(self, var) -> relax.Expr | None:
        i = self.index.get(var)
        return None if i is None else self.bindings[i].value


class _Region:
    """The region of the permute bound at `seed` (see the module docstring)."""

    def __init__(self, block: _Block, seed: int, orders: dict | None = None):
        binding = block.bindings[seed]
        self.block, self.orders = block, orders or {}  # reshape binding -> order of its groups
        self.cost, self.fork = 0, None  # transposes the ops add; (reshape, perm) that could differ
        self.perms = {binding.var: permute_axes(binding.value)}  # tensor of the region -> permutation
        self.entries = {binding.var: binding.value.args[0]}  # permute -> what it permutes
        self.ops: dict[int, tuple[Follow, list[int]]] = {}  # binding -> (rule, operands' permutation)
        self.items: set[int] = set()  # fields of a tuple of the region
        self.permutes: dict[int, list[int]] = {}  # binding of a permute -> axes from the source
        self.sides: dict = {}  # operand converted -> its transposes
        for i in range(seed + 1, len(block.bindings)):
            read = [v for v in block.reads[i] if v in self.perms]
            if read:
                self._take(i, read)

    def _take(self, i: int, read: list) -> None:
        """Binding `i`, which reads the region's tensors `read`, into the region if it follows."""
        var, value = self.block.bindings[i].var, self.block.bindings[i].value
        if op_name(value) == PERMUTE:
            self.permutes[i] = [self.perms[value.args[0]][a] for a in permute_axes(value)]
        elif isinstance(value, relax.TupleGetItem):
            self.items.add(i)
            self.perms[var] = self.perms[value.tuple_value]
        elif isinstance(value, relax.Call):
            perm = self.perms[read[0]]
            rule = follow(value, perm, self.orders.get(i))
            if rule is not None and self._carry(value, rule, perm, read):
                self.ops[i] = (rule, perm)
                self.perms[var] = rule.out_perm
                self.cost += rule.cost
                if rule.cost and self.fork is None and i not in self.orders:
                    self.fork = (i, perm)

    def _carry(self, call: relax.Call, rule: Follow, perm: list[int], read: list) -> bool:
        """Whether the carried operands of `call` can all be had in the source layout; new
        entries and converted operands are noted."""
        operands = [call.args[p] if isinstance(p, int) else call.args[p[0]].fields[p[1]] for p in rule.carried]
        if any(not any(v.same_as(o) for o in operands) or self.perms[v] != perm for v in read):
            return False  # a tensor of the region read where it does not carry the layout
        for operand in operands:
            if operand in self.perms:
                continue
            source = self.block.value(operand)
            if op_name(source) == PERMUTE and permute_axes(source) == perm and not _is_constant(source.args[0]):
                self.perms[operand], self.entries[operand] = perm, source.args[0]
            elif not _is_constant(operand) and operand.ty.ndim > 0:
                shape = _shape(operand)
                if shape is None:
                    return False
                self.sides[operand] = transposes(inverse(perm), [1] * (len(perm) - len(shape)) + shape)
        return True

    def bindings(self) -> set[int]:
        """The bindings the rewrite touches."""
        index = self.block.index
        return {index[v] for v in self.entries if v in index} | set(self.ops) | self.items | set(self.permutes)

    def exits(self, var) -> bool:
        """Whether a tensor computed in the region is read outside it (kept for those readers)."""
        handled = set(self.ops) | self.items | set(self.permutes)
        return var in self.block.escaping or any(u not in handled for u in self.block.users[var])

    def gain(self) -> int:
        """Runtime transposes removed minus those added by rewriting the region."""
        gain = -sum(self.sides.values()) - self.cost
        for var, perm in self.perms.items():
            if isinstance(var.ty, relax.TupleType):
                if self.exits(var):
                    return -1  # (a split's tuple read as a whole)
                continue
            moved = transposes(perm, source_shape(_shape(var), perm) if _shape(var) is not None else None)
            if var in self.entries:
                gain += 0 if self.exits(var) else moved
            elif self.exits(var):
                gain -= moved
        for i, axes in self.permutes.items():
            value = self.block.bindings[i].value
            source = source_shape(_shape(value.args[0]), self.perms[value.args[0]]) if _shape(value.args[0]) else None
            gain += transposes(permute_axes(value), _shape(value.args[0])) - transposes(axes, source)
        return gain


def _regions(func: relax.Function) -> list[_Region]:
    """The disjoint regions of `func` worth rewriting, first seeds first."""
    chosen, taken = [], set()
    blocks = list(func.body.blocks)
    for b, block in enumerate(blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        outside = [func.body.body] + [x.value for other in blocks[:b] + blocks[b + 1 :] for x in other.bindings]
        indexed = _Block(block, _vars_of(outside))
        for i, binding in enumerate(indexed.bindings):
            value = binding.value
            if op_name(value) != PERMUTE or _is_constant(value.args[0]) or (b, i) in taken:
                continue
            if transposes(permute_axes(value), _shape(value.args[0])) == 0:
                continue
            region = _best_region(indexed, i)
            touched = {(b, j) for j in region.bindings()}
            if region.gain() > 0 and not touched & taken:
                chosen.append(region)
                taken |= touched
    return chosen


def _best_region(block: _Block, seed: int) -> _Region:
    """The region of the permute at `seed`, its first reshape that needs a permute of its own
    made in each order of its groups (`follow_rules.reshape_orders`): the one of most gain."""
    region = _Region(block, seed)
    if region.fork is None:
        return region
    i, perm = region.fork
    tried = [_Region(block, seed, {i: order}) for order in reshape_orders(block.bindings[i].value, perm)]
    return max([region, *tried], key=lambda r: r.gain())


def _vars_of(exprs: list) -> set:
    """The variables the expressions `exprs` read."""
    found = set()
    for expr in exprs:
        relax.analysis.post_order_visit(expr, lambda e: found.add(e) if isinstance(e, relax.Var) else None)
    return found


@mutator
class _Follower(PyExprMutator):
    """The regions' ops computed from their sources, their tensors permuted back where read
    outside them."""

    def __init__(self, mod: tvm.IRModule, regions: list[_Region]):
        super().__init__(mod)
        self.sources: dict = {}  # tensor of a region -> (its source, permutation)
        self.converted: dict = {}  # (operand, permutation) -> converted operand
        self.at: dict = {}  # variable bound by a binding of a region -> (region, binding index)
        for region in regions:
            for var, source in region.entries.items():
                self.sources[var] = (source, region.perms[var])
            for i in set(region.ops) | region.items | set(region.permutes):
                self.at[region.block.bindings[i].var] = (region, i)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        found = self.at.get(binding.var)
        if found is None:
            super().visit_var_binding_(binding)
            return
        region, i = found
        value = binding.value
        if i in region.permutes:
            self._bind(binding.var, self._source(value.args[0]), region.permutes[i])
            return
        if i in region.items:
            source = self.builder_.emit(relax.TupleGetItem(self._source(value.tuple_value), value.index))
        else:
            rule, perm = region.ops[i]
            source = self.builder_.emit(rule.rebuild(self._operands(value, rule, perm)))
        perm = region.perms[binding.var]
        self.sources[binding.var] = (source, perm)
        if region.exits(binding.var):
            self._bind(binding.var, source, perm)

    def _source(self, var):
        """The source of a tensor of a region (its variable as this rewrite binds it)."""
        return self.visit_expr(self.sources[var][0])

    def _operands(self, call: relax.Call, rule: Follow, perm: list[int]) -> list:
        """`call`'s arguments with the carried ones in the source layout (a tuple's as a list)."""
        args = [list(a.fields) if isinstance(a, relax.Tuple) else a for a in call.args]
        carried = {(p, None) if isinstance(p, int) else tuple(p) for p in rule.carried}
        for i, arg in enumerate(args):
            if isinstance(arg, list):
                args[i] = [self._operand(f, perm, (i, j) in carried) for j, f in enumerate(arg)]
            else:
                args[i] = self._operand(arg, perm, (i, None) in carried)
        return args

    def _operand(self, operand, perm: list[int], carried: bool):
        """An argument of a call of a region: in the source layout if it is `carried`."""
        if not carried:
            return self.visit_expr(operand)
        if operand in self.sources and self.sources[operand][1] == perm:
            return self._source(operand)
        if operand.ty.ndim == 0:
            return self.visit_expr(operand)
        key = (operand, tuple(perm))
        if key not in self.converted:
            self.converted[key] = self._converted(self.visit_expr(operand), perm)
        return self.converted[key]

    def _converted(self, operand, perm: list[int]):
        if _is_constant(operand):
            array = constant_array(operand)
            return array_constant(
                np.transpose(array.reshape((1,) * (len(perm) - array.ndim) + array.shape), inverse(perm))
            )
        shape = _shape(operand)
        full = [1] * (len(perm) - len(shape)) + shape
        if len(shape) < len(perm):
            operand = self.builder_.emit(relax.op.reshape(operand, full))
        return self.builder_.emit(_permuted(operand, inverse(perm), source_shape(full, perm)))

    def _bind(self, var, source, perm: list[int]) -> None:
        """`var` bound to `source` permuted by `perm` (a reshape where that is all); `var` read
        as `source` where it is nothing (the block's output variables stay bound)."""
        value = self.builder_.normalize(_permuted(source, perm, _shape(var)))
        if isinstance(value, relax.Var) and isinstance(var, relax.DataflowVar):
            self.set_var_remap(var, value)
        else:
            self.builder_.emit_normalized(relax.VarBinding(var, value))


def _permuted(source, perm: list[int], shape):
    """``permute_dims(source, perm)`` of result shape `shape`, as a reshape or nothing where it
    moves only size-1 axes."""
    if list(perm) == sorted(perm):
        return source
    dims = static_shape(source)
    if dims is not None and moves_only_unit_axes(dims, perm):
        return relax.op.reshape(source, shape)
    return relax.op.permute_dims(source, perm)


def follow_layouts(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every region of a runtime permute worth it rewritten (see the module docstring),
    its bindings canonicalized first (a field of a tuple built in place, as PyTorch's max pooling
    with indices leaves it, read as the tensor itself); `mod` itself when there is none."""
    original = mod
    for _ in range(MAX_ROUNDS):
        mod = relax.transform.CanonicalizeBindings()(mod)
        changed = False
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function):
                continue
            func = relax.analysis.remove_all_unused(func)
            regions = _regions(func)
            if regions:
                rewriter = _Follower(with_function(mod, gvar, func), regions)
                mod = with_function(mod, gvar, relax.analysis.remove_all_unused(rewriter.visit_expr(func)))
                changed = True
        if not changed:
            break
        original = mod
    return original
