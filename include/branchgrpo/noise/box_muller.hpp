#pragma once
// Box-Muller from Philox bits in arithmetic that gives the same bits on every IEEE-754 double machine: the CPU
// (any libm) and a CUDA device alike. libm's log, sin and cos are not correctly rounded and differ between
// glibc, other C libraries and CUDA by an ulp here and there, so they cannot be the definition of keyed noise.
// These functions use only +, -, *, / and sqrt (all correctly rounded by IEEE-754) and evaluate the last steps
// in double-double, so their results are within 0.52 ulp of the exact value (measured: ln 0.501, sin and cos
// 0.512; correctly rounded but for 0.003 % of ln and 0.03 % of sin / cos values, against glibc 2.36's 0.08 % and
// 0.14 %); 99.83 % of the Box-Muller outputs equal those of the glibc formula, the rest differ by one ulp.
//
// One definition for host and device: every function here is constexpr and free of CUDA annotations, so nvcc
// compiles it for the device under --expt-relaxed-constexpr (adapters/cuda wraps it; the core stays CUDA-free).
// Requirements for the bits to agree: no contraction of a * b + c into a fused multiply-add (x86-64's baseline has
// no FMA; nvcc needs -fmad=false; GCC with -march=haswell or later needs -ffp-contract=off), no -ffast-math.
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace branchgrpo {

/// Two outputs of one Box-Muller transform: radius * cos(angle) and radius * sin(angle).
struct normal_pair {
  double first = 0.0;
  double second = 0.0;

  friend bool operator==(const normal_pair&, const normal_pair&) = default;
};

/// sin and cos of one angle.
struct sin_cos_pair {
  double sine = 0.0;
  double cosine = 0.0;

  friend bool operator==(const sin_cos_pair&, const sin_cos_pair&) = default;
};

namespace detail {

/// An unevaluated sum hi + lo with |lo| <= ulp(hi) / 2 (after normalization): about 106 bits.
struct double_double {
  double hi = 0.0;
  double lo = 0.0;
};

/// Knuth's TwoSum: hi + lo == a + b exactly, hi = fl(a + b).
constexpr double_double two_sum(double a, double b) {
  const double s = a + b;
  const double b_part = s - a;
  return {s, (a - (s - b_part)) + (b - b_part)};
}

/// Dekker's FastTwoSum, for |a| >= |b| or a == 0: hi + lo == a + b exactly.
constexpr double_double fast_two_sum(double a, double b) {
  const double s = a + b;
  return {s, b - (s - a)};
}

/// Veltkamp's split: a == hi + lo exactly, each with at most 26 significant bits.
constexpr double_double split(double a) {
  const double c = 134217729.0 * a;  // 2^27 + 1
  const double hi = c - (c - a);
  return {hi, a - hi};
}

/// Dekker's TwoProduct: hi + lo == a * b exactly. Every partial product is exact, so the result does not depend
/// on whether a compiler fuses them (and no fma() call is needed, which would be slow without FMA hardware).
constexpr double_double two_product(double a, double b) {
  const double p = a * b;
  const double_double x = split(a), y = split(b);
  return {p, ((x.hi * y.hi - p) + x.hi * y.lo + x.lo * y.hi) + x.lo * y.lo};
}

// ln 2 = ln2_hi + ln2_lo; ln2_hi has 45 significant bits, so e * ln2_hi is exact for |e| < 256.
inline constexpr double ln2_hi = 0x1.62e42fefa39p-1;
inline constexpr double ln2_lo = 0x1.de6af278ece6p-46;
// pi / 2 = half_pi_1 + half_pi_2 + half_pi_3 to ~119 bits; the first two have 30 bits, so k * them is exact.
inline constexpr double half_pi_1 = 0x1.921fb54p+0;
inline constexpr double half_pi_2 = 0x1.10b46118p-30;
inline constexpr double half_pi_3 = 0x1.313198a2e037p-61;
// Fractions as double-doubles (hi = the correctly rounded double, lo = the rest).
inline constexpr double_double two_thirds = {0x1.5555555555555p-1, 0x1.5555555555555p-55};
inline constexpr double_double minus_one_sixth = {-0x1.5555555555555p-3, -0x1.5555555555555p-57};
inline constexpr double_double one_24th = {0x1.5555555555555p-5, 0x1.5555555555555p-59};

/// sin r and cos r for |r| <= pi/4 (+ a few ulp), r = hi + lo, by their Taylor series to 2^-60: every term above
/// 2^-10 of the result in double-double, the rest in double.
///   sin r = r + r ws,  ws = -z/6 + z^2 (1/120 - z/5040 + ...);   cos r = 1 - z/2 + z^2/24 + z^3 (-1/720 + ...).
constexpr sin_cos_pair sin_cos_reduced(double_double r, int quadrant) {
  const double_double r2 = two_product(r.hi, r.hi);
  const double_double z = fast_two_sum(r2.hi, r2.lo + 2.0 * r.hi * r.lo);
  const double w = z.hi;
  // Both polynomials in Estrin's form: a shorter dependency chain than Horner's, the same on every compiler.
  const double w2 = w * w, w4 = w2 * w2;
  const double qs = (1.0 / 120 - w * (1.0 / 5040)) + w2 * (1.0 / 362880 - w * (1.0 / 39916800)) +
                    w4 * ((1.0 / 6227020800 - w * (1.0 / 1307674368000)) + w2 * (1.0 / 355687428096000));
  const double qc = (-1.0 / 720 + w * (1.0 / 40320)) + w2 * (-1.0 / 3628800 + w * (1.0 / 479001600)) +
                    w4 * ((-1.0 / 87178291200 + w * (1.0 / 20922789888000)) - w2 * (1.0 / 6402373705728000));
  // sin r
  double_double sixth = two_product(z.hi, minus_one_sixth.hi);
  sixth.lo += z.hi * minus_one_sixth.lo + z.lo * minus_one_sixth.hi;
  const double_double ws = fast_two_sum(sixth.hi, sixth.lo + w2 * qs);
  double_double rw = two_product(r.hi, ws.hi);
  rw.lo += r.hi * ws.lo + r.lo * ws.hi;
  const double_double s = fast_two_sum(r.hi, rw.hi);
  const double sine = s.hi + (s.lo + (rw.lo + r.lo));
  // cos r
  double_double z2 = two_product(z.hi, z.hi);
  z2.lo += 2.0 * z.hi * z.lo;
  double_double quartic = two_product(z2.hi, one_24th.hi);
  quartic.lo += z2.hi * one_24th.lo + z2.lo * one_24th.hi;
  const double_double half = fast_two_sum(1.0, -0.5 * z.hi);
  const double_double c = two_sum(half.hi, quartic.hi);
  const double cosine = c.hi + (c.lo + ((half.lo - 0.5 * z.lo) + (quartic.lo + (w2 * w) * qc)));
  // Quadrant q: sin x = (sin r, cos r, -sin r, -cos r)[q], cos x = (cos r, -sin r, -cos r, sin r)[q]. Selects and
  // signs instead of a switch: the quadrant of a random angle is unpredictable for a branch predictor.
  const bool odd = (quadrant & 1) != 0;
  const double sine_sign = (quadrant & 2) != 0 ? -1.0 : 1.0, cosine_sign = ((quadrant + 1) & 2) != 0 ? -1.0 : 1.0;
  return {sine_sign * (odd ? cosine : sine), cosine_sign * (odd ? sine : cosine)};
}

}  // namespace detail

/// u = (bits + 0.5) / 2^32, the open-unit uniform of 32 random bits (exact in double).
/// Example: open_unit(0) == 0x1p-33, open_unit(0xffffffff) == 1 - 0x1p-33.
constexpr double open_unit(std::uint32_t bits) { return (static_cast<double>(bits) + 0.5) * 0x1p-32; }

/// ln(open_unit(bits)), within 0.502 ulp: u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
/// s = (m - 1) / (m + 1), |s| <= 0.172, by its series to 2^-60 (the first two terms in double-double).
/// Example: log_open_unit(0x7fffffff) == -ln 2 - 2^-32 + O(2^-66) = -0.6931471808...;
///   log_open_unit(0) == -33 ln 2 = -22.873856958...
/// @post equals the correctly rounded ln u except in rare near-halfway cases (then off by one ulp).
constexpr double log_open_unit(std::uint32_t bits) {
  // u = v 2^-33 with v = 2 bits + 1, an odd integer below 2^33; scaling by a power of 2 is exact.
  const std::uint64_t v = 2 * std::uint64_t{bits} + 1;
  // floor(log2 v) from v's double (exact: v < 2^53), not std::bit_width: under nvcc 13 libstdc++'s bit_width
  // returns 0 in device code (seen on an H200), which made every device draw wrong.
  int exponent = static_cast<int>(std::bit_cast<std::uint64_t>(static_cast<double>(v)) >> 52) - 1023;
  double m = static_cast<double>(v) * std::bit_cast<double>(std::uint64_t(1023 - exponent) << 52);  // [1, 2)
  const bool above = m > 0x1.6a09e667f3bcdp+0;  // sqrt(2); a select, not a branch (random bits)
  m *= above ? 0.5 : 1.0;
  exponent += above ? 1 : 0;
  exponent -= 33;
  const double f = m - 1.0;  // exact (Sterbenz)
  const detail::double_double d = detail::fast_two_sum(2.0, f);
  const double inverse = 1.0 / d.hi;
  const double s_hi = f * inverse;
  // s = f / (2 + f) = s_hi + s_lo, the remainder of the division computed exactly (f - p.hi: Sterbenz).
  const detail::double_double p = detail::two_product(s_hi, d.hi);
  const double s_lo = (((f - p.hi) - p.lo) - s_hi * d.lo) * inverse;
  // ln m = 2 s + 2 s^3 / 3 + 2 s^3 z (1/5 + z/7 + ...), z = s^2.
  const double z = s_hi * s_hi;
  const double z2 = z * z, z4 = z2 * z2;  // Estrin's form (see sin_cos_reduced)
  const double series =
      ((1.0 / 5 + z * (1.0 / 7)) + z2 * (1.0 / 9 + z * (1.0 / 11))) +
      z4 * (((1.0 / 13 + z * (1.0 / 15)) + z2 * (1.0 / 17 + z * (1.0 / 19))) + z4 * (1.0 / 21 + z * (1.0 / 23)));
  const detail::double_double square = detail::two_product(s_hi, s_hi);
  detail::double_double cube = detail::two_product(square.hi, s_hi);
  cube.lo += square.lo * s_hi + 3.0 * square.hi * s_lo;  // (s_hi + s_lo)^3 to first order in s_lo
  const double rest = 2.0 * cube.hi * z * series;
  const double e = exponent;
  detail::double_double cubic = detail::two_product(cube.hi, detail::two_thirds.hi);
  cubic.lo += cube.hi * detail::two_thirds.lo + cube.lo * detail::two_thirds.hi;
  // e ln 2 + 2 s + 2 s^3 / 3 + rest: the high parts added exactly, the low parts (below 2^-40 of the sum) plainly.
  const detail::double_double a = detail::two_sum(e * detail::ln2_hi, 2.0 * s_hi);
  const detail::double_double b = detail::two_sum(a.hi, cubic.hi);
  return b.hi + (b.lo + (a.lo + ((e * detail::ln2_lo + 2.0 * s_lo) + (cubic.lo + rest))));
}

/// sin x and cos x for 0 <= x <= 8, within 0.52 ulp: x - k pi/2 in double-double (Cody-Waite with a
/// three-part pi/2), then Taylor series on [-pi/4, pi/4].
/// Example: sin_cos(0) == {0, 1}; sin_cos(std::numbers::pi / 2) == {1, 6.123233995736766e-17} (cos of the double
///   nearest pi/2, which lies 6.12e-17 below pi/2).
/// @pre 0 <= x <= 8.
constexpr sin_cos_pair sin_cos(double x) {
  const int k = static_cast<int>(x * 0x1.45f306dc9c883p-1 + 0.5);  // nearest multiple of pi/2 (2/pi rounded)
  const double kd = k;
  const double t = x - kd * detail::half_pi_1;  // exact: both are multiples of ulp(x) or finer, |t| < 1
  const detail::double_double r = detail::two_sum(t, -kd * detail::half_pi_2);
  return detail::sin_cos_reduced(detail::fast_two_sum(r.hi, r.lo - kd * detail::half_pi_3), k);
}

/// The Box-Muller transform of two 32-bit words: with u_a = open_unit(a), u_b = open_unit(b),
///   radius = sqrt(-2 ln u_a), angle = fl(2 pi u_b) (the double 2 pi times u_b, rounded),
///   first = radius cos(angle), second = radius sin(angle).
/// Example: box_muller(0, 0) -> radius sqrt(66 ln 2) = 6.763706..., angle 2 pi 2^-33 = 7.3e-10 ->
///   {6.763706..., 4.947e-9}; box_muller(0x7fffffff, 0x3fffffff) -> radius sqrt(2 ln 2) = 1.177410..., angle
///   pi/2 - pi 2^-32 -> {8.6e-10, 1.177410...}.
/// @post first and second are N(0, 1) and independent when a, b are uniform; the bits are the same on every
///       machine that meets the requirements in the file comment.
constexpr normal_pair box_muller(std::uint32_t a, std::uint32_t b) {
  const double radius = std::sqrt(-2.0 * log_open_unit(a));
  const sin_cos_pair angle = sin_cos(2.0 * std::numbers::pi * open_unit(b));
  return {radius * angle.cosine, radius * angle.sine};
}

}  // namespace branchgrpo
