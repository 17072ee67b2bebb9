"""A cache-line prefetch hint for the compiled pool kernels (LLVM's llvm.prefetch: read, keep in all levels).

The pool's kernels visit block rows and key-table slots at addresses spread over megabytes. Where a loop knows
the address it will need a few iterations ahead (the free queue's ring, a request's block list, its keys), asking
for that line now lets the misses overlap instead of each stalling the loop in turn. A hint only: it changes no
value; called from plain Python (the kernels' py_func, KVLAB_NUMBA=0) it does nothing.
"""
from __future__ import annotations

from ..sim.kernels import ENABLED


def prefetch(ary, i):
    """Ask for the cache line holding ary[i] (1-D) or row ary[i] (2-D); i is not checked. Plain Python: nothing."""


if ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.core.extending import intrinsic, overload

    @intrinsic
    def _prefetch(typingctx, ary, i):
        def codegen(context, builder, sig, args):
            aryty, ity = sig.args
            a = context.make_array(aryty)(context, builder, args[0])
            at = context.cast(builder, args[1], ity, types.intp)
            inds = [at] + [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
            ptr = cgutils.get_item_pointer(context, builder, aryty, a, inds, wraparound=False)
            i32, i8p = ir.IntType(32), ir.IntType(8).as_pointer()
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])  # read, high locality, data
            return context.get_dummy_value()
        return types.void(ary, i), codegen

    @overload(prefetch, inline="always")
    def _prefetch_compiled(ary, i):
        if isinstance(ary, types.Array) and ary.ndim in (1, 2) and isinstance(i, types.Integer):
            return lambda ary, i: _prefetch(ary, i)
        return None
