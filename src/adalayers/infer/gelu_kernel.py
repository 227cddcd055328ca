"""The exact GELU of float32 arrays, compiled (numba) into one loop that the compiler vectorises.

    GELU(x) = x Phi(x) = x erfc(-x / sqrt 2) / 2       (torch's default, not the tanh approximation)

erfc(a), a = |x| / sqrt 2 >= 0, by Numerical Recipes' erfcc, a Chebyshev fit of relative error < 1.2e-7:

    t = 1 / (1 + a/2),   erfc(a) = t exp(-a^2 + P(t)),   P a polynomial of degree 9 (_C)

and 1 + erf(y) taken as erfc(|y|) for y < 0, so the small values of the negative side keep their precision.
The exponential is infer/fast_exp.py's, inline, so that the loop has no call in it and vectorises (numpy's
formula took ~25 passes over the array); below y = -87 (|x| > ~13) Phi is flushed to 0, as float32's normal
range ends.

gelu_kernel(x, out) is numba's, gelu_one(x) one value (inline in other kernels: read_kernel's), gelu(x) the
array function (any shape, float32 out). 8-17x numpy's formula on the decode steps' and prefills' arrays
(19 layers x rows x 640, gemma3-270m), equal to it within 2.4e-7 (tests/test_numpy_heads.py holds it to
math.erfc in float64).
"""
from __future__ import annotations

import numba
import numpy as np

from adalayers.infer.fast_exp import exp_neg

# erfcc's coefficients, P(t) = _C[0] + t (_C[1] + t (... + t _C[9]))
_C = np.array([-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
               -0.82215223, 0.17087277], np.float32)
_SQRT_HALF = np.float32(0.7071067811865476)


@numba.njit(inline="always", error_model="numpy")
def gelu_one(x):
    """GELU(x) of one float32 value (inline: the loops that call it stay vectorised)."""
    one, half, two = np.float32(1.0), np.float32(0.5), np.float32(2.0)
    a = abs(x) * _SQRT_HALF
    t = one / (one + half * a)
    p = _C[9]
    for j in range(8, -1, -1):
        p = _C[j] + t * p
    q = t * exp_neg(p - a * a)              # erfc(a) = t e^(P(t) - a^2)
    return half * x * ((two - q) if x >= 0 else q)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def gelu_kernel(x, out):
    """out[i] = GELU(x[i]) for 1-d float32 x and out."""
    for i in range(x.size):
        out[i] = gelu_one(x[i])
    return out


def gelu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GELU of an array of any shape and float dtype, as float32: a new array, or into `out` (float32, C-contiguous,
    x's shape; x itself may be it, at the cost of the vectorised loop: the compiler's overlap check then takes the
    scalar one, about 3x slower)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if out is None:
        out = np.empty(np.shape(x), np.float32)
    elif out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != np.shape(x):
        raise ValueError(f"gelu: out must be C-contiguous float32 of shape {np.shape(x)}")
    gelu_kernel(flat, out.reshape(-1))
    return out
