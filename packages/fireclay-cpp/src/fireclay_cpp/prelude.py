"""The C++ every generated library starts with: storage types, half-precision conversions, math
with torch's semantics where C++ differs, reduction accumulators that merge (for per-thread
partials), and Philox for random numbers.

Half types are computed in float32, as Inductor does: loads widen, stores round to nearest even.
"""

from __future__ import annotations

from fireclay_loops.backend.reductions import REDUCTIONS, ReductionForm
from fireclay_shapes import CPP_PRELUDE as _INDEX_PRELUDE

# dtype -> (C++ storage type, C++ compute type)
CTYPES: dict[str, tuple[str, str]] = {
    "float64": ("double", "double"),
    "float32": ("float", "float"),
    "float16": ("_Float16", "float"),
    "bfloat16": ("uint16_t", "float"),
    "int64": ("int64_t", "int64_t"),
    "int32": ("int32_t", "int32_t"),
    "int16": ("int16_t", "int16_t"),
    "int8": ("int8_t", "int8_t"),
    "uint8": ("uint8_t", "uint8_t"),
    "bool": ("bool", "bool"),
}

# Only <cstdint> and <omp.h>: <cmath>, <vector> and <type_traits> would triple the compile time of
# a small library. Math goes through the compiler's builtins, with one overload per float type.
_MATH_FUNCTIONS = ("exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan", "asin",
                   "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "floor",
                   "ceil", "nearbyint", "trunc", "lgamma")
_MATH_FUNCTIONS2 = ("pow", "fmod", "atan2", "copysign")
_MATH = "\n".join(
    f"static inline float fc_{f}(float x) {{ return __builtin_{f}f(x); }}\n"
    f"static inline double fc_{f}(double x) {{ return __builtin_{f}(x); }}"
    for f in _MATH_FUNCTIONS) + "\n" + "\n".join(
    f"static inline float fc_{f}(float x, float y) {{ return __builtin_{f}f(x, y); }}\n"
    f"static inline double fc_{f}(double x, double y) {{ return __builtin_{f}(x, y); }}"
    for f in _MATH_FUNCTIONS2)

# glibc's vector math library (libmvec, x86-64) has SIMD versions of these: declared with the
# `simd` attribute, loops calling them vectorise (as <math.h> declares them under -ffast-math,
# which we do not use: it would change results elsewhere). Accuracy is within 4 ulp.
_LIBMVEC_2_22 = ("exp", "log", "sin", "cos", "pow")
_LIBMVEC_2_35 = ("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "erf", "erfc", "exp2", "expm1",
                 "log10", "log1p", "log2", "sinh", "tan", "tanh", "atan2")
_TWO_ARGS = ("pow", "atan2")


def _simd_declarations(names: tuple[str, ...]) -> str:
    lines = []
    for f in names:
        args = 2 if f in _TWO_ARGS else 1
        for t, suffix in (("float", "f"), ("double", "")):
            lines.append(f'extern "C" {t} {f}{suffix}({", ".join([t] * args)}) throw() '
                         '__attribute__((simd("notinbranch")));')
    return "\n".join(lines)


_VECTOR_MATH = (
    "#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) && defined(FC_LIBMVEC)\n"
    + _simd_declarations(_LIBMVEC_2_22) + "\n#if __GLIBC_PREREQ(2, 35)\n" + _simd_declarations(_LIBMVEC_2_35)
    + "\n#endif\n#endif\n")

# The functions a vectorised loop may compute with libmvec; `fc_exact_<f>` computes the same
# function with the scalar library in every loop (see _EXACT_MATH).
VECTOR_MATH = frozenset(_LIBMVEC_2_22 + _LIBMVEC_2_35)


def _exact_definitions() -> str:
    """``fc_exact_<f>`` for every vector-math function: under libmvec a call of the scalar
    library function through a second name (an assembler alias), which the compiler knows no
    vector version of; elsewhere the function itself."""
    aliased, plain = [], []
    for f in sorted(VECTOR_MATH):
        args = 2 if f in _TWO_ARGS else 1
        for t, suffix in (("float", "f"), ("double", "")):
            params = ", ".join(f"{t} {v}" for v in "xy"[:args])
            names = ", ".join("xy"[:args])
            aliased.append(f'extern "C" {t} fc_libm_{f}{suffix}({", ".join([t] * args)}) throw() '
                           f'__asm__("{f}{suffix}") __attribute__((const));')
            aliased.append(f"static inline {t} fc_exact_{f}({params}) {{ return fc_libm_{f}{suffix}({names}); }}")
            plain.append(f"static inline {t} fc_exact_{f}({params}) {{ return fc_{f}({names}); }}")
    return ("#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) && defined(FC_LIBMVEC)\n"
            + "\n".join(aliased) + "\n#else\n" + "\n".join(plain) + "\n#endif\n")


# Vector math is within 4 ulp of the scalar function, not the same bits, and a value computed in
# two loops (a kernel recomputes what a later loop reads) or two kernels is vectorised in one and
# not in the other whenever only one of the loops vectorises. Values compared with each other
# for equality (a max's gradient compares the values with their stored max and divides by how
# many are equal: none equal is 0/0) are computed with these instead, the same bits everywhere.
# exp of float is ours, inline (the same code in scalar and vector loops).
_EXACT_MATH = _exact_definitions().replace(
    "static inline float fc_exact_exp(float x) { return fc_libm_expf(x); }",
    "static inline float fc_exact_exp(float x) { return fc_exp(x); }") + r"""
template <typename T> static inline T fc_exact_sigmoid(T x) { return T(1) / (T(1) + fc_exact_exp(-x)); }
"""

# exp of float: a Cephes-style polynomial, inline, so that every loop vectorises it without a
# call. glibc's vector expf leaves its vector path for the whole vector when one argument is past
# about +-87.3 and calls the scalar function on every lane, 6-10 times slower; a masked softmax's
# rows are full of such arguments (-inf, finfo.min minus the row's max), as are silu/sigmoid of
# large inputs. Within 1 ulp of exp (libmvec: 4); results below FLT_MIN (x < -87.34) are 0, not
# subnormal: producing a subnormal costs a microcode assist per lane on x86.
_EXP = r"""
static inline float fc_exp(float x) {
  const float hi = 88.72283935546875f, lo = -87.33654022216797f;  // exp overflows past hi; exp(lo) = FLT_MIN
  float c = x > hi ? hi : x;
  c = c < lo ? lo : c;
  const float n = __builtin_floorf(c * 1.44269504088896341f + 0.5f);  // exp(x) = 2^n exp(r), |r| <= ln2/2
  float r = c - n * 0.693359375f;  // ln 2 in two parts: n * the first is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const int32_t k = (int32_t)n, k1 = k >> 1;  // 2^k as two normal factors: k runs from -126 to 128
  const int32_t bits1 = (k1 + 127) << 23, bits2 = (k - k1 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &bits1, 4);
  __builtin_memcpy(&s2, &bits2, 4);
  const float e = y * s1 * s2;
  return x > hi ? __builtin_inff() : (x < lo ? 0.0f : (x != x ? x : e));
}
static inline double fc_exp(double x) { return __builtin_exp(x); }
"""

# The accumulators of the reductions of one part (fireclay-loops' reduction forms): the state
# starts at the form's start and both add() and merge() fold by the form's op. A max or min adds
# with the NaN test on the value added (the vectorised loop: rows of amax 3x faster) and merges
# with the general form (the short scalar chain of lane and thread partials, where the other
# branched: a softmax over rows of 128 ran 1.3x slower).
_START = {"0": "T(0)", "1": "T(1)", "lowest": "fc_limits<T>::lowest()", "highest": "fc_limits<T>::highest()"}
_TRUTH_START = {"0": "false", "1": "true"}
_FOLD = {"add": "v += {x};", "mul": "v *= {x};", "maximum": "v = fc_maximum(v, {x});",
         "minimum": "v = fc_minimum(v, {x});", "logical_or": "v = v || {x};", "logical_and": "v = v && {x};"}
_ADD = {**_FOLD, "maximum": "v = fc_maximum_test_b(v, {x});", "minimum": "v = fc_minimum_test_b(v, {x});"}


def _folded_accumulator(form: ReductionForm) -> str:
    name, add, fold = f"fc_{form.kind}_acc", _ADD[form.fold], _FOLD[form.fold]
    state = "bool" if form.truth else "T"
    start = (_TRUTH_START if form.truth else _START)[form.start[0]]
    return (f"template <typename T> struct {name} {{\n"
            f"  {state} v = {start};\n"
            f"  inline void add(T x, int64_t) {{ {add.format(x='(x != T(0))' if form.truth else 'x')} }}\n"
            f"  inline void merge(const {name}& o) {{ {fold.format(x='o.v')} }}\n"
            f"  inline {state} result() const {{ return v; }}\n"
            "};\n")


_FOLDED_ACCUMULATORS = "".join(_folded_accumulator(form) for form in REDUCTIONS.values() if form.fold)

PRELUDE = _INDEX_PRELUDE + r"""
#include <omp.h>
""" + _VECTOR_MATH + _EXP + r"""

// A run of kernels uses the thread count the caller asks for (torch's), whichever thread calls.
static inline void fc_set_threads(int64_t n) { if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads((int)n); }

template <typename T> struct fc_is_float { static constexpr bool value = false; };
template <> struct fc_is_float<float> { static constexpr bool value = true; };
template <> struct fc_is_float<double> { static constexpr bool value = true; };
template <typename T> struct fc_is_bool { static constexpr bool value = false; };
template <> struct fc_is_bool<bool> { static constexpr bool value = true; };
template <typename T> struct fc_limits {  // signed integers (uint8_t and bool below)
  static constexpr T lowest() { return (T)((uint64_t)1 << (sizeof(T) * 8 - 1)); }
  static constexpr T highest() { return (T)~lowest(); }
};
template <> struct fc_limits<float> {
  static constexpr float lowest() { return -__builtin_inff(); }
  static constexpr float highest() { return __builtin_inff(); }
};
template <> struct fc_limits<double> {
  static constexpr double lowest() { return -__builtin_inf(); }
  static constexpr double highest() { return __builtin_inf(); }
};
template <> struct fc_limits<bool> {
  static constexpr bool lowest() { return false; }
  static constexpr bool highest() { return true; }
};
template <> struct fc_limits<uint8_t> {
  static constexpr uint8_t lowest() { return 0; }
  static constexpr uint8_t highest() { return 255; }
};
#define FC_INF __builtin_inf()
#define FC_NAN __builtin_nan("")
template <typename T> static inline bool fc_isnan(T x) { if constexpr (fc_is_float<T>::value) return __builtin_isnan(x); else return false; }
template <typename T> static inline bool fc_isinf(T x) { if constexpr (fc_is_float<T>::value) return __builtin_isinf(x); else return false; }
""" + _MATH + r"""

static inline float fc_bf16_to_float(uint16_t v) {
  uint32_t bits = ((uint32_t)v) << 16; float f; __builtin_memcpy(&f, &bits, 4); return f;
}
static inline uint16_t fc_float_to_bf16(float f) {
  uint32_t bits; __builtin_memcpy(&bits, &f, 4);
  if (__builtin_isnan(f)) return 0x7FC0;
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest, ties to even
  return (uint16_t)(bits >> 16);
}
static inline float fc_round_bf16(float f) { return fc_bf16_to_float(fc_float_to_bf16(f)); }
static inline float fc_round_f16(float f) { return (float)(_Float16)f; }

// `m ? a : b` for a condition that does not change along the vectorised loop (a padded
// window's row is in or out as a whole), as a select of bits: GCC will not vectorise a `?:` on a
// loop-invariant condition, but does this. Exact: every bit comes from a or from b, whatever
// the other holds (NaN included).
static inline float fc_blend(int64_t m, float a, float b) {
  uint32_t ua, ub; __builtin_memcpy(&ua, &a, 4); __builtin_memcpy(&ub, &b, 4);
  const uint32_t mm = (uint32_t)0 - (uint32_t)(m != 0);
  const uint32_t r = (ua & mm) | (ub & ~mm); float f; __builtin_memcpy(&f, &r, 4); return f;
}
static inline double fc_blend(int64_t m, double a, double b) {
  uint64_t ua, ub; __builtin_memcpy(&ua, &a, 8); __builtin_memcpy(&ub, &b, 8);
  const uint64_t mm = (uint64_t)0 - (uint64_t)(m != 0);
  const uint64_t r = (ua & mm) | (ub & ~mm); double f; __builtin_memcpy(&f, &r, 8); return f;
}
static inline int64_t fc_blend(int64_t m, int64_t a, int64_t b) {
  const int64_t mm = -(int64_t)(m != 0); return (a & mm) | (b & ~mm);
}
static inline int32_t fc_blend(int64_t m, int32_t a, int32_t b) {
  const int32_t mm = -(int32_t)(m != 0); return (a & mm) | (b & ~mm);
}
// NaN propagates: `a >= b ? a : b` picks b when b is NaN, the test on a covers a; one select
// and one test, no branches, so reduction loops over them vectorise.
template <typename T> static inline T fc_maximum(T a, T b) {
  if constexpr (fc_is_float<T>::value) { T m = a >= b ? a : b; return a != a ? a : m; }
  return a < b ? b : a;
}
template <typename T> static inline T fc_minimum(T a, T b) {
  if constexpr (fc_is_float<T>::value) { T m = a <= b ? a : b; return a != a ? a : m; }
  return a < b ? a : b;
}
// The same results (ties give a) with the NaN test on b. Where b is a number known to the
// compiler (a clamp's bound: relu6's, hardswish's 0 and 6) the test folds away and one select is
// left, where a test on a, the value just computed, stays, and GCC chains the masks of
// consecutive ones (a hardswish ran 3-4x slower). A reduction's add() tests each new value rather
// than its running one (rows of amax 3x faster). Not for two computed values in scalar code: in
// the loops of an NCHW max pool after a ReLU, GCC branches on this form (2x slower).
template <typename T> static inline T fc_maximum_test_b(T a, T b) {
  if constexpr (fc_is_float<T>::value) { T m = b > a ? b : a; return b != b ? b : m; }
  return a < b ? b : a;
}
template <typename T> static inline T fc_minimum_test_b(T a, T b) {
  if constexpr (fc_is_float<T>::value) { T m = b < a ? b : a; return b != b ? b : m; }
  return a < b ? a : b;
}
// Kernel checks (fireclay-loops' ops.check_bounds / check_nonzero): a failed check records
// itself in the run's error slot `err` = {site + 1, value, bound} (the first failure wins, from
// any thread) and gives a value that is safe to go on with; the run stops after the kernel and
// the wrapper raises. Nothing throws inside an OpenMP region.
__attribute__((noinline, cold)) static void fc_check_failed(int64_t* err, int64_t site, int64_t value,
                                                            int64_t bound) {
  int64_t none = 0;
  if (__atomic_compare_exchange_n(&err[0], &none, site + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    err[1] = value;
    err[2] = bound;
  }
}
static inline int64_t fc_check_bounds(int64_t v, int64_t lo, int64_t n, bool live, int64_t site, int64_t* err) {
  if (__builtin_expect(live && (v < lo || v >= n), 0)) { fc_check_failed(err, site, v, n); return 0; }
  return v;
}
// The indices a loop reads, checked before it runs: `low`/`high` are the least and greatest
// (a min/max reduction over them, which vectorises where a check per index does not).
static inline bool fc_bounds_ok(int64_t low, int64_t high, int64_t lo, int64_t n, int64_t site, int64_t* err) {
  if (__builtin_expect(low < lo || high >= n, 0)) { fc_check_failed(err, site, low < lo ? low : high, n); return false; }
  return true;
}
// The indices a loop reads, when they are one contiguous run `p[0..count)` of an int64 buffer and
// the bound is [0, n): checked as 32-bit words, each low word below n and each high word zero. One
// unsigned 32-bit max per 8 words vectorises to a single instruction; AVX2 has no 64-bit min or max,
// which the scan above needs four instructions for. A failure is looked for again one index at a
// time, for the value the error names; so is everything when n is beyond 32 bits.
typedef uint32_t fc_index_word __attribute__((may_alias));
static inline bool fc_indices_ok(const int64_t* p, int64_t count, int64_t n, int64_t site, int64_t* err) {
  if (n <= ((int64_t)1 << 32)) {
    const fc_index_word* w = (const fc_index_word*)p;
    uint32_t m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t words = 2 * count;
    int64_t k = 0;
    for (; k + 8 <= words; k += 8)
      for (int j = 0; j < 8; j++) m[j] = m[j] < w[k + j] ? w[k + j] : m[j];
    for (; k < words; k++) m[k & 7] = m[k & 7] < w[k] ? w[k] : m[k & 7];  // (k & 7 keeps a word's half)
    const int lo = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 0 : 1;
    uint32_t low = 0, high = 0;
    for (int j = 0; j < 8; j += 2) { low = low < m[j + lo] ? m[j + lo] : low; high |= m[j + 1 - lo]; }
    if (__builtin_expect(high == 0 && (int64_t)low < n, 1)) return true;
  }
  for (int64_t k = 0; k < count; k++)
    if (p[k] < 0 || p[k] >= n) { fc_check_failed(err, site, p[k], n); return false; }
  return true;
}
template <typename T> static inline T fc_check_nonzero(T v, bool live, int64_t site, int64_t* err) {
  if (__builtin_expect(live && v == 0, 0)) fc_check_failed(err, site, 0, 0);
  return v;
}

template <typename T> static inline T fc_floordiv_v(T a, T b) {
  if constexpr (fc_is_float<T>::value) { return fc_floor(a / b); }
  else { return b == 0 ? T(0) : (T)fc_floordiv((int64_t)a, (int64_t)b); }  // eager raises; never trap
}
template <typename T> static inline T fc_remainder(T a, T b) {
  if constexpr (fc_is_float<T>::value) {
    T r = fc_fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
  } else { return b == 0 ? T(0) : (T)fc_mod((int64_t)a, (int64_t)b); }
}
template <typename T> static inline T fc_fmod(T a, T b) {
  if constexpr (fc_is_float<T>::value) { return fc_fmod(a, b); } else { return b == 0 ? T(0) : (T)(a % b); }
}
template <typename T> static inline T fc_pow(T a, T b) {
  if constexpr (fc_is_float<T>::value) { return fc_pow(a, b); }
  else {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
  }
}
template <typename T> static inline T fc_sign(T x) {
  if constexpr (fc_is_bool<T>::value) { return x; }
  else if constexpr (fc_is_float<T>::value) { return x > 0 ? T(1) : (x < 0 ? T(-1) : x); }
  else { return (T)((x > 0) - (x < 0)); }
}
template <typename T> static inline T fc_abs(T x) {
  if constexpr (fc_is_bool<T>::value) { return x; } else { return x < 0 ? -x : x; }
}
template <typename T> static inline T fc_sigmoid(T x) { return T(1) / (T(1) + fc_exp(-x)); }
""" + _EXACT_MATH + r"""template <typename T> static inline T fc_relu(T x) { return x < 0 ? T(0) : x; }

// Accumulators: add() folds one value in, merge() folds another thread's partial in (in thread
// order, each thread holding a contiguous ascending chunk, so argmax keeps the first index).
""" + _FOLDED_ACCUMULATORS + r"""// argmax/argmin: NaN wins (as in torch), the first index wins ties.
template <typename T, bool IsMax> struct fc_arg_acc {
  T v = T(0); int64_t idx = -1;
  static inline bool better(T x, int64_t xi, T best, int64_t bi) {
    if (bi < 0) return true;
    if constexpr (fc_is_float<T>::value) {
      bool xn = x != x, bn = best != best;
      if (xn || bn) return xn && (!bn || xi < bi);
    }
    if (x == best) return xi < bi;
    return IsMax ? x > best : x < best;
  }
  inline void add(T x, int64_t i) { if (better(x, i, v, idx)) { v = x; idx = i; } }
  inline void merge(const fc_arg_acc& o) { if (o.idx >= 0 && better(o.v, o.idx, v, idx)) { v = o.v; idx = o.idx; } }
  inline int64_t result() const { return idx < 0 ? 0 : idx; }
};
template <typename T> using fc_argmax_acc = fc_arg_acc<T, true>;
template <typename T> using fc_argmin_acc = fc_arg_acc<T, false>;
// Welford's running mean and sum of squared deviations; merge is Chan's parallel update.
template <typename T> struct fc_welford_acc {
  T mean = T(0), m2 = T(0), n = T(0);
  inline void add(T x, int64_t) { n += T(1); T d = x - mean; mean += d / n; m2 += d * (x - mean); }
  inline void merge(const fc_welford_acc& o) {
    if (o.n == T(0)) return;
    if (n == T(0)) { *this = o; return; }
    T total = n + o.n, d = o.mean - mean;
    mean += d * (o.n / total);
    m2 += o.m2 + d * d * (n * o.n / total);
    n = total;
  }
  inline T get(int i) const { return i == 0 ? mean : (i == 1 ? m2 : n); }
};

// Philox4x32-10 of (counter, 0, 0, 0) keyed by seed; the same stream as fireclay-loops' reference.
static inline void fc_philox(uint64_t seed, uint64_t counter, uint32_t out[4]) {
  uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int i = 0; i < 10; i++) {
    uint64_t p0 = (uint64_t)c0 * 0xD2511F53u, p1 = (uint64_t)c2 * 0xCD9E8D57u;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
static inline float fc_rand(uint64_t seed, int64_t offset) {
  uint32_t w[4]; fc_philox(seed, (uint64_t)offset, w);
  return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}
static inline float fc_randn(uint64_t seed, int64_t offset) {
  uint32_t w[4]; fc_philox(seed, (uint64_t)offset, w);
  float u0 = (float)(w[0] >> 8) * (1.0f / 16777216.0f), u1 = (float)(w[1] >> 8) * (1.0f / 16777216.0f);
  return fc_sqrt(-2.0f * fc_log(1.0f - u0)) * fc_cos(2.0f * 3.14159265358979323846f * u1);
}
"""
