"""Register tiles kept in registers: their accumulators allocated on the stack.

A register tile's accumulators are a "local" buffer of the kernel (``<name>_acc_local``),
which LLVM keeps in vector registers only if it is a stack array. TVM 0.27's LowerTVMBuiltin
leaves on the stack only global buffers under 1 KB (``kMaxStackAlloca``) and allocates every
local one from its workspace pool, so each tile's accumulators would be stored to memory
after every chunk of its reduction (the prefetches split it), and an AVX-512 tile of 24
(1536 bytes) also zeroed by a call to memset in every tile.

`stack_register_tiles` marks every local buffer of up to STACK_TILE_BYTES of a lowered
function with TVM's own annotation for "leave on the stack" (``disable_lower_builtin``). It
has to run after TVM's StorageRewrite, which remakes allocations without their annotations,
and before LowerTVMBuiltin: accel_target.pipeline's StackRegisterTiles pass runs it there, at
the end of TVM's default TIR pipeline, on the functions built for an accel target.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

# Bytes up to which a local buffer stays on the stack: a register tile's accumulators (at
# most 32 vector registers: 2 KB with AVX-512), with room; not a scratch array.
STACK_TILE_BYTES = 4096
# tvm::tirx::transform::kDisableLowerTVMBuiltin: LowerTVMBuiltin leaves such an allocation alone
ON_STACK = "disable_lower_builtin"


def on_stack(buffer: tirx.Buffer) -> bool:
    """Whether `buffer` is local, of a static size of at most STACK_TILE_BYTES."""
    if buffer.scope() != "local" or not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
        return False
    return math.prod(int(d) for d in buffer.shape) * tvm.DataType(buffer.dtype).itemsize <= STACK_TILE_BYTES


def stack_register_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` (lowered) with its `on_stack` allocations marked ON_STACK; None if it has none."""
    marked = []

    def mark(stmt):
        if isinstance(stmt, tirx.AllocBuffer) and ON_STACK not in stmt.annotations and on_stack(stmt.buffer):
            marked.append(stmt.buffer)
            return tirx.AllocBuffer(stmt.buffer, annotations={**stmt.annotations, ON_STACK: tirx.IntImm("bool", 1)})
        return stmt

    body = tvm_ffi.structural_map(func.body, (tirx.AllocBuffer, mark), order="post")
    return func.with_body(body) if marked else None
