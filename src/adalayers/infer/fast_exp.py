"""e^y of a float32 y <= 0 with no call in it, for numba loops that the compiler vectorises (compiled inline).

libm's expf, one call per element, stops LLVM's vectorizer; written out it is a few multiplies and adds:

    y = n ln2 + r,  n = round(y / ln2)   (ln2 in two parts, Cody-Waite: n _LN2_HI is exact)
    e^r = sum_{j<=7} r^j / j!            (|r| <= ln2 / 2: relative error < 3e-9)
    2^n                                  from its float32 bits, (n + 127) << 23 reinterpreted (an LLVM bitcast)

Below y = -87 the result is flushed to 0 (float32's normal range ends at 2^-126) and NaN stays NaN (a head fed
NaN states fails its read's check); y > 0 is not handled (the callers' arguments are a running maximum's
differences or -a^2 terms, never positive).
Used by gelu_kernel (the exact GELU's erfc) and online_softmax (the per-step update's two exponentials);
tests/test_numpy_heads.py holds it to math.exp in float64.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_TAYLOR = np.array([1.0, 1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040], np.float32)  # e^r = sum r^j / j!
_LN2_HI = np.float32(0.693145751953125)       # ln 2 = _LN2_HI + _LN2_LO, _LN2_HI exact in few bits: n _LN2_HI exact
_LN2_LO = np.float32(1.428606765330187e-06)
_LOG2E = np.float32(1.4426950408889634)
FLOOR = np.float32(-87.0)                     # e^y below it is 0 here


@intrinsic
def _float32_of_bits(typingctx, bits):
    """An int32's bits read as a float32 (no conversion: a bitcast the vectorizer keeps in registers)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@numba.njit(inline="always", error_model="numpy")
def exp_neg(y):
    """e^y for a float32 y <= 0, as float32; 0 below FLOOR."""
    under = y < FLOOR
    y = max(y, FLOOR)
    n = np.floor(y * _LOG2E + np.float32(0.5))
    r = (y - n * _LN2_HI) - n * _LN2_LO
    e = _TAYLOR[7]
    for j in range(6, -1, -1):
        e = _TAYLOR[j] + r * e
    scale = _float32_of_bits((np.int32(n) + np.int32(127)) << np.int32(23))  # 2^n, n in [-126, 0]
    return np.float32(0.0) if under else e * scale


@numba.njit(nogil=True, cache=True, error_model="numpy")
def exp_neg_array(y, out):
    """out[i] = exp_neg(y[i]) for 1-d float32 arrays (the tests' entry; kernels call exp_neg inline)."""
    for i in range(y.size):
        out[i] = exp_neg(y[i])
    return out
