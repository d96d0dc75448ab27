// The one definition of the keyed noise's Box-Muller arithmetic (noise/box_muller.hpp), shared by the host and the
// CUDA kernels: the doc comments' examples, constant evaluation, and accuracy against long double libm on a
// sample of the 2^32 inputs (the expected values below are the correctly rounded ones, by libquadmath).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

#include "branchgrpo/noise/box_muller.hpp"

using namespace branchgrpo;

namespace {

/// |got - exact| in ulps of the double nearest `exact`.
double ulp_error(double got, long double exact) {
  const auto nearest = static_cast<double>(exact);
  const double ulp = std::nextafter(std::fabs(nearest), INFINITY) - std::fabs(nearest);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - exact) / ulp);
}

}  // namespace

TEST_CASE("open_unit maps 32 bits into (0, 1) exactly", "[cuda][noise]") {
  STATIC_REQUIRE(open_unit(0) == 0x1p-33);
  STATIC_REQUIRE(open_unit(0xffffffff) == 1.0 - 0x1p-33);
  STATIC_REQUIRE(open_unit(0x80000000) == 0.5 + 0x1p-33);
}

TEST_CASE("log_open_unit gives the doc comment's values, correctly rounded", "[cuda][noise]") {
  // ln(1/2 - 2^-33) = -ln 2 - 2^-32 + O(2^-66); ln(2^-33) = -33 ln 2; ln(1 - 2^-33) = -2^-33 - 2^-67 + ...
  STATIC_REQUIRE(log_open_unit(0x7fffffff) == -0x1.62e42ff1a39efp-1);
  STATIC_REQUIRE(log_open_unit(0) == -0x1.6dfb516f20bbfp+4);
  STATIC_REQUIRE(log_open_unit(0xffffffff) == -0x1.000000004p-33);
  STATIC_REQUIRE(log_open_unit(0x80000000) == -0x1.62e42feda39efp-1);
  CHECK(log_open_unit(0x7fffffff) == Approx(-std::numbers::ln2 - 0x1p-32).epsilon(1e-15));
  CHECK(log_open_unit(0) == Approx(-33.0 * std::numbers::ln2).epsilon(1e-15));
}

TEST_CASE("sin_cos gives the doc comment's values, correctly rounded", "[cuda][noise]") {
  STATIC_REQUIRE(sin_cos(0.0) == sin_cos_pair{0.0, 1.0});
  // The double nearest pi/2 lies 6.12e-17 below pi/2.
  STATIC_REQUIRE(sin_cos(std::numbers::pi / 2) == sin_cos_pair{1.0, 0x1.1a62633145c07p-54});
  STATIC_REQUIRE(sin_cos(1.0) == sin_cos_pair{0x1.aed548f090ceep-1, 0x1.14a280fb5068cp-1});
  STATIC_REQUIRE(sin_cos(6.0) == sin_cos_pair{-0x1.1e1f18ab0a2cp-2, 0x1.eb9b7097822f5p-1});
}

TEST_CASE("box_muller gives the doc comment's values", "[cuda][noise]") {
  // radius sqrt(66 ln 2), angle 2 pi 2^-33.
  const normal_pair origin = box_muller(0, 0);
  CHECK(origin.first == Approx(std::sqrt(66.0 * std::numbers::ln2)).epsilon(1e-15));
  CHECK(origin.second == Approx(std::sqrt(66.0 * std::numbers::ln2) * 2.0 * std::numbers::pi * 0x1p-33).epsilon(1e-12));
  CHECK(origin == normal_pair{0x1.b0e08d9986a8dp+2, 0x1.53fb1e0735e5ep-28});
  // radius sqrt(2 ln 2 + 2^-31), angle pi/2 - pi 2^-32 (rounded to a double: 1e-16 off, so cos(angle) = 7.3e-10
  // only to ~1e-7 relative).
  const normal_pair quarter = box_muller(0x7fffffff, 0x3fffffff);
  CHECK(quarter.first == Approx(std::sqrt(2.0 * std::numbers::ln2) * std::numbers::pi * 0x1p-32).epsilon(1e-6));
  CHECK(quarter == normal_pair{0x1.d976f9f3eb778p-31, 0x1.2d6abe4589315p+0});
  CHECK(quarter.second == Approx(std::sqrt(2.0 * std::numbers::ln2 + 0x1p-31)).epsilon(1e-15));
}

TEST_CASE("log and sin_cos stay within 0.53 ulp of long double libm", "[cuda][noise]") {
  std::mt19937_64 random(17);
  double worst_log = 0.0, worst_sin = 0.0, worst_cos = 0.0;
  auto check = [&](std::uint32_t bits) {
    const double u = open_unit(bits);
    worst_log = std::fmax(worst_log, ulp_error(log_open_unit(bits), std::log(static_cast<long double>(u))));
    const double angle = 2.0 * std::numbers::pi * u;
    const sin_cos_pair pair = sin_cos(angle);
    worst_sin = std::fmax(worst_sin, ulp_error(pair.sine, std::sin(static_cast<long double>(angle))));
    worst_cos = std::fmax(worst_cos, ulp_error(pair.cosine, std::cos(static_cast<long double>(angle))));
  };
  for (int i = 0; i < 200000; ++i) check(static_cast<std::uint32_t>(random()));
  // The ends, and around every multiple of 2^29 (quadrant and octant boundaries of the angle, powers of 2 of u).
  for (std::uint32_t d = 0; d < 2000; ++d) {
    check(d);
    check(0xffffffffu - d);
    for (std::uint32_t j = 1; j < 8; ++j) {
      check((j << 29) + d);
      check((j << 29) - d - 1);
    }
  }
  CHECK(worst_log < 0.53);
  CHECK(worst_sin < 0.53);
  CHECK(worst_cos < 0.53);
}
