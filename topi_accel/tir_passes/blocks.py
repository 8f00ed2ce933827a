"""What the rewrites of scheduled functions (topi_accel.tir_passes.reductions, topi_accel.tir_passes.wholetiles,
topi_accel.amx, accel_target.passes.inplace) share: substituting variables, new blocks with their
regions, a root block with fields replaced, and a walk that rebuilds only what a rewrite of
loops changed. TVM 0.27 offers no Python substitution of TIR variables;
`PrimFunc.specialize` does it for the function's parameters, so `substitute` makes the
variables parameters of a throwaway function."""

from __future__ import annotations

from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx

# Expression nodes a block's value may reach by inlining a block it reads more than once: each
# read gets a copy of that block's expression, so a chain of such inlines grows exponentially
# and stalls TVM's passes (TVM's fast_exp reads its input 18 times: a sigmoid of a biased conv
# is ~700 nodes, of another sigmoid ~6000; eight steps of x * x + x or sigmoid took a minute).
# A block read once per element is always inlined.
MAX_INLINED_NODES = 4096


def substitute(node, mapping: dict):
    """`node` (an expression or a statement) with the variables of `mapping` replaced."""
    variables = list(mapping)
    body = node if isinstance(node, tirx.Stmt) else tirx.Evaluate(node)
    moved = tirx.PrimFunc(variables, body).specialize(mapping).body
    return moved if isinstance(node, tirx.Stmt) else moved.value


def root_replaced(func: tirx.PrimFunc, **fields) -> s_tir.SBlockRealize:
    """`func`'s body (a scheduled function's root block) with the root block's `fields`
    (``body``, ``match_buffers``, ...) replaced."""
    realize = func.body
    root = realize.block
    names = ("iter_vars", "reads", "writes", "name_hint", "body", "init", "alloc_buffers", "match_buffers")
    values = {name: fields.get(name, getattr(root, name)) for name in names}
    block = s_tir.SBlock(*values.values(), annotations=root.annotations)
    return s_tir.SBlockRealize(realize.iter_values, realize.predicate, block)


def _value_size(expr, buffer) -> tuple[int, int] | None:
    """(nodes of `expr`, loads of `buffer` in it), counted as a tree; None beyond
    2 * MAX_INLINED_NODES nodes."""
    nodes, loads = [0], [0]

    def visit(node):
        nodes[0] += 1
        if nodes[0] > 2 * MAX_INLINED_NODES:
            raise OverflowError
        if buffer is not None and getattr(node, "source", None) is not None and node.source.same_as(buffer):
            loads[0] += isinstance(node, tvm.ir.expr.TensorLoad)
        return node

    try:
        tvm_ffi.structural_map(expr, (object, visit), order="pre")
    except Exception:  # noqa: BLE001 - the visitor's OverflowError, as TVM's FFI re-raises it
        if nodes[0] <= 2 * MAX_INLINED_NODES:
            raise
        return None
    return nodes[0], loads[0]


def inlining_stays_small(sch: s_tir.Schedule, producer, consumer) -> bool:
    """Whether inlining block `producer` into block `consumer` (compute_inline), or `consumer`
    into `producer` (reverse_compute_inline), leaves the consumer's value within
    MAX_INLINED_NODES nodes where it reads the producer's output more than once, and copies no
    ``Let`` (FastMath binds what it reads several times; two copies of one would define its
    variable twice, which TIR rejects: a leaky ReLU reads its input twice)."""
    made, used = sch.get(producer), sch.get(consumer)
    if not (isinstance(made.body, tirx.BufferStore) and isinstance(used.body, tirx.BufferStore)):
        return True  # not an elementwise step's store: as TVM inlines it
    counted = _value_size(used.body.value, made.body.buffer)
    if counted is None:
        return False
    size, reads = counted
    if reads <= 1:
        return True
    if contains(made.body.value, tirx.Let):
        return False
    own = _value_size(made.body.value, None)
    return own is not None and size + reads * own[0] <= MAX_INLINED_NODES


def contains(root, kind: type, test: Callable = lambda node: True) -> bool:
    """Whether a node of type `kind` in `root` passes `test` (the walk stops at the first)."""
    hit = lambda node: tvm_ffi.VisitInterrupt() if test(node) else None  # noqa: E731
    return tvm_ffi.structural_walk(root, (kind, hit), order="pre") is not None


def fresh_iter_vars(iter_vars, *nodes):
    """Copies of `iter_vars` (new variables) and `nodes` in terms of them: each block made from
    pieces of one defines its block variables anew (TIR defines a variable once)."""
    new = [tirx.IterVar(iv.dom, tirx.Var(iv.var.name, iv.var.ty.dtype), iv.iter_type) for iv in iter_vars]
    mapping = {old.var: iv.var for old, iv in zip(iter_vars, new)}
    return new, [substitute(n, mapping) for n in nodes]


def block_realize(name, iter_vars, values, body, buffers, init=None, annotations=None) -> s_tir.SBlockRealize:
    """A block of `body` with its read and write regions detected, realized at `values`."""
    block = s_tir.SBlock(iter_vars, [], [], name, body, init)
    reads, writes = s_tir.analysis.get_sblock_read_write_region(block, {b: b for b in buffers})
    return s_tir.SBlockRealize(
        values, True, s_tir.SBlock(iter_vars, reads, writes, name, body, init, [], [], annotations or {})
    )


def block_buffers(func: tirx.PrimFunc) -> list:
    """The buffers the blocks of `func` allocate, read or write."""
    found = []

    def visit(stmt):
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s)
        elif isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            found.extend([*block.alloc_buffers, *(r.source for r in (*block.reads, *block.writes))])
            visit(block.body)
        elif isinstance(stmt, tirx.For):
            visit(stmt.body)

    visit(func.body)
    return found


def rewrite_loops(stmt: tirx.Stmt, at_loop: Callable[[tirx.For], tirx.Stmt | None]) -> tirx.Stmt:
    """`stmt` with each loop (through sequences, blocks and loops) replaced by `at_loop(loop)`
    where that is not None, the loops inside it visited otherwise; what did not change is
    kept as it was."""

    def recurse(s):
        return rewrite_loops(s, at_loop)

    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([recurse(s) for s in stmt.seq])
    if isinstance(stmt, s_tir.SBlockRealize):
        b = stmt.block
        body = recurse(b.body)
        if body.same_as(b.body):
            return stmt
        block = s_tir.SBlock(
            b.iter_vars, b.reads, b.writes, b.name_hint, body, b.init, b.alloc_buffers, b.match_buffers, b.annotations
        )
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, tirx.For):
        replaced = at_loop(stmt)
        if replaced is not None:
            return replaced
        body = recurse(stmt.body)
        if body.same_as(stmt.body):
            return stmt
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations)
    return stmt


def lower_blocks() -> tvm.transform.Pass:
    """TVM's s_tir lowering (its default pipeline's first passes) up to a block-free function
    with flat buffers and int32 indices where they fit, for rewrites of lowered loops (the
    build runs these passes again: a no-op by then)."""
    return tvm.transform.Sequential(
        [
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerMatchBuffer(),  # the AMX kernels' operands (topi_accel.amx)
            # as TVM's pipeline does before flattening: compacting a buffer that a row-by-row
            # kernel computes per row leaves indices such as `row - row`, on which FlattenBuffer
            # divides by zero (reshape-transpose chains computed row by row)
            s_tir.transform.StmtSimplify(),
            s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.FlattenBuffer(),
            tirx.transform.NarrowDataType(32),
            s_tir.transform.CompactBufferAllocation(),
        ]
    )
