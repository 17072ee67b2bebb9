"""A cache-line prefetch hint for the compiled pool kernels (LLVM's llvm.prefetch: read, keep in all levels).

The pool's kernels visit block rows and key-table slots at addresses spread over megabytes. Where a loop knows
the address it will need a few iterations ahead (the free queue's ring, a request's block list, its keys), asking
for that line now lets the misses overlap instead of each stalling the loop in turn. A hint only: it changes no
value; called from plain Python (the kernels' py_func, KVLAB_NUMBA=0) it does nothing.

Also the two memory orderings the host tiers' helper thread needs (kvlab.serving.compiledrun's log): `store_release`
publishes a position after the entries it covers, `load_acquire` reads it before them (LLVM atomics; plain reads
and writes in plain Python, where the helper does not run).
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

    def _ptr(context, builder, aryty, ary, i, ity):
        """Pointer to ary[i] (1-D) or to row ary[i]'s first item (2-D), i unchecked."""
        a = context.make_array(aryty)(context, builder, ary)
        at = context.cast(builder, i, ity, types.intp)
        inds = [at] + [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
        return cgutils.get_item_pointer(context, builder, aryty, a, inds, wraparound=False)

    @intrinsic
    def _prefetch(typingctx, ary, i):
        def codegen(context, builder, sig, args):
            ptr = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
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


def load_acquire(ary, i):
    """ary[i] read with acquire ordering (what another thread stored before its release is seen after)."""
    return ary[i]


def store_release(ary, i, v):
    """ary[i] = v with release ordering (what this thread stored before is seen by an acquire that reads v)."""
    ary[i] = v


if ENABLED:
    @intrinsic
    def _load_acquire(typingctx, ary, i):
        def codegen(context, builder, sig, args):
            ptr = _ptr(context, builder, sig.args[0], args[0], args[1], sig.args[1])
            return builder.load_atomic(ptr, "acquire", sig.args[0].dtype.bitwidth // 8)
        return ary.dtype(ary, i), codegen

    @intrinsic
    def _store_release(typingctx, ary, i, v):
        def codegen(context, builder, sig, args):
            aryty = sig.args[0]
            ptr = _ptr(context, builder, aryty, args[0], args[1], sig.args[1])
            val = context.cast(builder, args[2], sig.args[2], aryty.dtype)
            builder.store_atomic(val, ptr, "release", aryty.dtype.bitwidth // 8)
            return context.get_dummy_value()
        return types.void(ary, i, v), codegen

    @overload(load_acquire, inline="always")
    def _load_acquire_compiled(ary, i):
        if isinstance(ary, types.Array) and ary.ndim == 1 and isinstance(ary.dtype, types.Integer):
            return lambda ary, i: _load_acquire(ary, i)
        return None

    @overload(store_release, inline="always")
    def _store_release_compiled(ary, i, v):
        if isinstance(ary, types.Array) and ary.ndim == 1 and isinstance(ary.dtype, types.Integer):
            return lambda ary, i, v: _store_release(ary, i, v)
        return None
