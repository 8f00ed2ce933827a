"""WriteInPlace: a kernel whose write-back adds a tensor that dies with it writes over that tensor.

A ResNet block ends in ``relu(conv(x) + bias + shortcut)``: the accel conv computes
it in its write-back, reading ``shortcut[i]`` and writing ``out[i]`` for every
element ``i``. When nothing reads ``shortcut`` afterwards, the kernel can write
``out`` over it: one tensor fewer in memory, and the write-back touches cache
lines it has just read instead of fresh ones.

TVM's own ``DataflowUseInplaceCalls`` makes elementwise ops in place before
fusion, which leaves them as in-place loops of their own that no schedule can
inline into a kernel's write-back; this pass works after the accel schedules:

* the kernel (an accel kernel: topi_accel.epilogue.accel_impl, single output) must read
  the input only in the block that writes its output, at the same element it writes,
  and read the output nowhere (`in_place_input`);
* the input must be a tensor made by a kernel of the same function, this call its
  last reader; if a reshape made it (a view of its input once lowered), the same
  holds for the reshape's input, with the reshape its last reader;
* no other kernel reads the input as its data with every thread reading all of it (a conv
  whose threads split the channel blocks over every row: its output block is annotated
  topi_accel.conv2d.THREADS_READ_WHOLE_INPUT). Both cores then hold the input's lines, and
  every line written over first has the other core's copy invalidated: ResNet-50's stage-3
  bottlenecks (a 14x14x1024 residual) ran slower in place than written to a fresh tensor,
  while those of stages 1 and 2, whose convs split rows, ran faster;
* the call becomes ``call_tir_inplace`` of a copy of the kernel that reads the
  input from the output buffer (`read_from_output`); the input is passed last, in
  the output's place.

A kernel on which the analysis or the rewrite raises keeps its calls as they were
(declined, see accel_target.declines.decline).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, s_tir
from tvm.relax.expr_functor import PyExprMutator, mutator

import topi_accel
from topi_accel.tir_passes.blocks import root_replaced

from ..declines import attempt

STEP = "WriteInPlace"
_CALLS = ("relax.call_tir", "relax.call_tir_inplace")


def in_place_input(func: tvm.tirx.PrimFunc, num_inputs: int) -> int | None:
    """Index of an input of `func` (params: inputs, then one output) that its output could
    overwrite: same shape and dtype, read only by the one block that writes the output,
    at the element that block writes, by a block without reduction; None if there is none."""
    out = func.params[num_inputs].name
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in topi_accel.epilogue.all_blocks(sch)]
    writers = [b for b in blocks if any(w.source.name == out for w in b.writes)]
    if len(writers) != 1 or any(r.source.name == out for b in blocks for r in b.reads):
        return None
    writer = writers[0]
    if writer.init is not None or any(int(v.iter_type) != 0 for v in writer.iter_vars):
        return None  # a reduction reads its inputs again after its first write
    write = next(w for w in writer.writes if w.source.name == out)
    out_type = func.params[num_inputs].ty
    for index, param in enumerate(func.params[:num_inputs]):
        if not hasattr(param.ty, "shape"):  # a scalar: a shape variable (topi_accel.symbolic)
            continue
        if not (tvm_ffi.structural_equal(param.ty.shape, out_type.shape) and param.ty.dtype == out_type.dtype):
            continue
        readers = [b for b in blocks if any(r.source.name == param.name for r in b.reads)]
        reads = [r for r in writer.reads if r.source.name == param.name]
        if readers == [writer] and reads and all(tvm_ffi.structural_equal(r.region, write.region) for r in reads):
            return index
    return None


def read_from_output(func: tvm.tirx.PrimFunc, index: int) -> tvm.tirx.PrimFunc:
    """`func` without its parameter `index`: it reads that tensor from its output buffer (the
    last parameter), which has the same shape and dtype.

    The parameter becomes a match_buffer of the whole output in the root block, an alias
    that TVM's LowerMatchBuffer then substitutes everywhere (it leaves the function
    schedulable, its blocks and annotations as they were).
    """
    param, output = func.params[index], func.params[-1]
    whole = tvm.tirx.BufferRegion(output, [tvm.ir.Range.from_min_extent(0, d) for d in output.ty.shape])
    aliases = [*func.body.block.match_buffers, s_tir.MatchBufferRegion(param, whole)]
    params = [p for i, p in enumerate(func.params) if i != index]
    aliased = tvm.tirx.PrimFunc(params, root_replaced(func, match_buffers=aliases), func.ret_type, func.attrs)
    return s_tir.transform.LowerMatchBuffer()(tvm.IRModule({"main": aliased}))["main"]


def _last_reads(func: relax.Function) -> dict:
    """variable of `func` -> the binding variable of its last reader (none for the
    variables the function returns: they are read after every binding)."""
    last = {}

    def reads(expr) -> list:
        found = []
        relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
        return found

    for block in func.body.blocks:
        for binding in block.bindings:
            last.update(dict.fromkeys(reads(binding.value), binding.var))
    for var in reads(func.body.body):
        last.pop(var, None)
    return last


def _threads_read_whole_input(func) -> bool:
    """A kernel marked so by its schedule (topi_accel.conv2d.THREADS_READ_WHOLE_INPUT)."""
    if not isinstance(func, tvm.tirx.PrimFunc):
        return False
    try:
        sch = s_tir.Schedule(func)
        blocks = topi_accel.epilogue.all_blocks(sch)
    except Exception:  # noqa: BLE001 (a function TVM cannot schedule: lowered, no blocks)
        return False
    return any(topi_accel.conv2d.THREADS_READ_WHOLE_INPUT in sch.get(b).annotations for b in blocks)


def _read_whole(mod: tvm.IRModule, func: relax.Function) -> set:
    """The variables of `func` that a kernel reads as its data (first argument) with every
    thread reading all of it."""
    marked, found = {}, set()

    def visit(expr):
        if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in _CALLS):
            return
        gvar, args = expr.args[0], expr.args[1].fields
        if gvar not in marked:
            marked[gvar] = _threads_read_whole_input(mod[gvar])
        if marked[gvar] and args and isinstance(args[0], relax.Var):
            found.add(args[0])

    relax.analysis.post_order_visit(func, visit)
    return found


@mutator
class _InPlace(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, last_reads: dict, read_whole: set):
        super().__init__(mod)
        self.mod_, self.last_reads, self.read_whole = mod, last_reads, read_whole
        self.binding = None  # the variable the visited call is bound to
        self.candidates = {}  # kernel -> the index `in_place_input` gives (None: none, or not accel's)
        self.rewritten = {}  # kernel -> GlobalVar of its in-place copy

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        self.binding = binding.var
        super().visit_var_binding_(binding)

    @staticmethod
    def _candidate(func: tvm.tirx.PrimFunc, num_inputs: int) -> int | None:
        """`in_place_input` of an accel kernel; None for any other."""
        return in_place_input(func, num_inputs) if topi_accel.epilogue.accel_impl(func) is not None else None

    def _fresh(self, var, reader) -> bool:
        """`var` is a tensor a kernel of this function made, read for the last time by
        `reader`, and by no kernel whose every thread reads all of it (`_read_whole`); when a
        reshape made it (a view, once lowered), so is the reshape's input."""
        if (
            not isinstance(var, relax.Var)
            or self.last_reads.get(var) is None
            or not self.last_reads[var].same_as(reader)
            or var in self.read_whole
        ):
            return False
        producer = self.lookup_binding(var)
        if not (isinstance(producer, relax.Call) and getattr(producer.op, "name", "") in _CALLS):
            return False
        if relax.analysis.has_reshape_pattern(self.builder_.get()[producer.args[0]]):
            return self._fresh(producer.args[1].fields[0], var)
        return True

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if getattr(call.op, "name", "") != "relax.call_tir" or not isinstance(call.ty_args[0], relax.TensorType):
            return call
        gvar, args = call.args[0], list(call.args[1].fields)
        if gvar not in self.candidates:  # a model calls one kernel many times: analyse it once
            self.candidates[gvar] = attempt(STEP, gvar.name_hint, self._candidate, self.mod_[gvar], len(args))
        index = self.candidates[gvar]
        if index is None or sum(a.same_as(args[index]) for a in args) > 1 or not self._fresh(args[index], self.binding):
            return call  # (a tensor passed twice would change under the other parameter too)
        if gvar not in self.rewritten:
            in_place = attempt(STEP, gvar.name_hint, read_from_output, self.mod_[gvar], index)
            if in_place is None:
                self.candidates[gvar] = None
                return call
            self.rewritten[gvar] = self.builder_.add_func(in_place, f"{gvar.name_hint}_in_place")
        # the kernel's parameters lost `index`; the overwritten tensor goes in the output's place
        args = args[:index] + args[index + 1 :] + [args[index]]
        return relax.call_tir_inplace(self.rewritten[gvar], relax.Tuple(args), len(args) - 1, call.ty_args[0])


@tvm.transform.module_pass(opt_level=0, name="WriteInPlace")
def write_in_place(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every accel kernel call that can, writes its output over an input that dies with it."""
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            rewriter = _InPlace(mod, _last_reads(func), _read_whole(mod, func))
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
            mod = rewriter.builder_.get()
    return mod
