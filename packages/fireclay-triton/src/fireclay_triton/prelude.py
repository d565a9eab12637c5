"""Text every generated kernel module starts with: imports, and small ``@triton.jit`` helpers
for the reductions (combine functions for ``tl.reduce``) and for math Triton lacks.

Math comes in two spellings. On a GPU, ops without a ``tl`` builtin go to CUDA's libdevice
(accurate to an ulp or two, like eager). Triton's interpreter (``TRITON_INTERPRET=1``, how CI
runs kernels on CPU tensors) cannot call libdevice, so there the same ops are composed from
``tl`` builtins; the ops that have no such composition here are refused with a clear error in
interpreter mode (:data:`LIBDEVICE_ONLY`).
"""

from __future__ import annotations

HEADER = """\
import triton
import triton.language as tl
{libdevice_import}

@triton.jit
def fc_sum_combine(a, b):
    return a + b


@triton.jit
def fc_prod_combine(a, b):
    return a * b


@triton.jit
def fc_maximum(a, b):
    # NaN wins, like torch.maximum and torch.max
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def fc_minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def fc_argmax_combine(v1, i1, v2, i2):
    # index -1 marks an empty lane; NaN is the largest value; ties keep the first index
    better = (v1 > v2) | ((v1 != v1) & (v2 == v2))
    same = (v1 == v2) | ((v1 != v1) & (v2 != v2))
    pick1 = (i2 < 0) | ((i1 >= 0) & (better | (same & (i1 < i2))))
    return tl.where(pick1, v1, v2), tl.where(pick1, i1, i2)


@triton.jit
def fc_argmin_combine(v1, i1, v2, i2):
    better = (v1 < v2) | ((v1 != v1) & (v2 == v2))
    same = (v1 == v2) | ((v1 != v1) & (v2 != v2))
    pick1 = (i2 < 0) | ((i1 >= 0) & (better | (same & (i1 < i2))))
    return tl.where(pick1, v1, v2), tl.where(pick1, i1, i2)


@triton.jit
def fc_ipow(a, b):
    # integer power by squaring; exponents up to 2**12 - 1 (negative exponents give 0, or 1 for a == 1)
    result = tl.full(a.shape, 1, a.dtype) + tl.zeros_like(b).to(a.dtype)
    base = a + tl.zeros_like(result)
    e = b + tl.zeros_like(result).to(b.dtype)
    for _ in tl.static_range(12):
        result = tl.where((e & 1) != 0, result * base, result)
        base = base * base
        e = e >> 1
    return tl.where(b < 0, tl.where(a == 1, 1, 0).to(a.dtype), result)


@triton.jit
def fc_random(seed, offset, normal: tl.constexpr):
    # Philox4x32-10 of (offset, 0, 0, 0) keyed by seed; the same stream as fireclay-loops' reference
    off = offset.to(tl.uint64)
    c0 = (off & 0xFFFFFFFF).to(tl.uint32)
    c1 = (off >> 32).to(tl.uint32)
    z = tl.zeros_like(c0)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, z, z)
    u0 = (w0 >> 8).to(tl.float32) * (1.0 / 16777216.0)
    if normal:
        u1 = (w1 >> 8).to(tl.float32) * (1.0 / 16777216.0)
        return tl.sqrt(-2.0 * tl.log(1.0 - u0)) * tl.cos(6.283185307179586 * u1)
    else:
        return u0
"""

# op -> (portable Triton expression or None, libdevice expression); {a}, {b} are operands
UNARY_MATH = {
    "exp": ("tl.exp({a})", "tl.exp({a})"),
    "exp2": ("tl.exp2({a})", "tl.exp2({a})"),
    "expm1": ("tl.where(tl.abs({a}) < 1e-5, {a} + 0.5 * {a} * {a}, tl.exp({a}) - 1.0)", "libdevice.expm1({a})"),
    "log": ("tl.log({a})", "tl.log({a})"),
    "log2": ("tl.log2({a})", "tl.log2({a})"),
    "log10": ("tl.log({a}) * 0.4342944819032518", "libdevice.log10({a})"),
    "log1p": ("tl.where(tl.abs({a}) < 1e-4, {a} - 0.5 * {a} * {a}, tl.log(1.0 + {a}))", "libdevice.log1p({a})"),
    "sqrt": ("tl.sqrt_rn({a})", "tl.sqrt_rn({a})"),
    "rsqrt": ("1.0 / tl.sqrt_rn({a})", "tl.rsqrt({a})"),
    "sin": ("tl.sin({a})", "tl.sin({a})"),
    "cos": ("tl.cos({a})", "tl.cos({a})"),
    "tan": ("tl.sin({a}) / tl.cos({a})", "libdevice.tan({a})"),
    "asin": ("fc_atan2({a}, tl.sqrt_rn((1.0 - {a}) * (1.0 + {a})))", "libdevice.asin({a})"),
    "acos": ("fc_atan2(tl.sqrt_rn((1.0 - {a}) * (1.0 + {a})), {a})", "libdevice.acos({a})"),
    "atan": ("fc_atan({a})", "libdevice.atan({a})"),
    "sinh": ("0.5 * (tl.exp({a}) - tl.exp(-{a}))", "libdevice.sinh({a})"),
    "cosh": ("0.5 * (tl.exp({a}) + tl.exp(-{a}))", "libdevice.cosh({a})"),
    "tanh": ("1.0 - 2.0 / (tl.exp(2.0 * {a}) + 1.0)", "libdevice.tanh({a})"),
    "asinh": ("tl.where({a} < 0, -1.0, 1.0) * tl.log(tl.abs({a}) + tl.sqrt_rn({a} * {a} + 1.0))",
              "libdevice.asinh({a})"),
    "acosh": ("tl.log({a} + tl.sqrt_rn({a} * {a} - 1.0))", "libdevice.acosh({a})"),
    "atanh": ("0.5 * tl.log((1.0 + {a}) / (1.0 - {a}))", "libdevice.atanh({a})"),
    "erf": ("tl.erf({a})", "tl.erf({a})"),
    "erfc": ("1.0 - tl.erf({a})", "libdevice.erfc({a})"),
    "lgamma": (None, "libdevice.lgamma({a})"),
    "round": ("tl.where((tl.floor({a} + 0.5) - {a} == 0.5) & (tl.floor({a} + 0.5) % 2 != 0), "
              "tl.floor({a} + 0.5) - 1.0, tl.floor({a} + 0.5))", "libdevice.nearbyint({a})"),
}
BINARY_MATH = {
    "atan2": ("fc_atan2({a}, {b})", "libdevice.atan2({a}, {b})"),
    "pow": ("fc_fpow({a}, {b})", "libdevice.pow({a}, {b})"),
}
LIBDEVICE_ONLY = sorted([k for k, (p, _) in {**UNARY_MATH, **BINARY_MATH}.items() if p is None])

PORTABLE_MATH = """

@triton.jit
def fc_atan(x):
    # Cephes' atanf: reduce to |t| <= tan(pi/8), then an odd polynomial (float32 accuracy)
    ax = tl.abs(x)
    big = ax > 2.414213562373095
    mid = (ax > 0.4142135623730950) & (~big)
    t = tl.where(big, -1.0 / tl.where(big, ax, 1.0), tl.where(mid, (ax - 1.0) / (ax + 1.0), ax))
    base = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    z = t * t
    p = (((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t + t
    r = base + p
    return tl.where(x < 0, -r, r)


@triton.jit
def fc_atan2(y, x):
    a = fc_atan(y / tl.where(x == 0, 1.0, x))
    pi = 3.141592653589793
    r = tl.where(x > 0, a, tl.where(y >= 0, a + pi, a - pi))
    at_zero = tl.where(y > 0, 0.5 * pi, tl.where(y < 0, -0.5 * pi, tl.where(1.0 / x < 0, pi, 0.0) * tl.where(1.0 / y < 0, -1.0, 1.0)))
    return tl.where(x == 0, at_zero, r)

@triton.jit
def fc_fpow(a, b):
    # a ** b from exp2/log2, with the sign of negative bases raised to integral exponents
    mag = tl.exp2(b * tl.log2(tl.abs(a)))
    integral = tl.floor(b) == b
    odd = integral & (tl.abs(b % 2.0) == 1.0)
    r = tl.where(a < 0, tl.where(integral, tl.where(odd, -mag, mag), float("nan")), mag)
    return tl.where(b == 0, 1.0, r)
"""


def header(interpret: bool) -> str:
    imports = "" if interpret else "from triton.language.extra import libdevice"
    return HEADER.format(libdevice_import=imports) + (PORTABLE_MATH if interpret else "")
