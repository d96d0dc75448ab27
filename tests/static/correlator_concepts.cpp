// Static tier: every correlator models NoiseCorrelator; wrong types do not.
#include <span>

#include "branchgrpo/correlator.hpp"

namespace {

using namespace branchgrpo;

static_assert(NoiseCorrelator<independent>);
static_assert(NoiseCorrelator<scaled>);
static_assert(NoiseCorrelator<correlated>);
static_assert(NoiseCorrelator<antithetic>);
static_assert(NoiseCorrelator<orthogonal>);

// Defaults from the paper (s = 4) and the official code (split_noise_scale 4).
static_assert(correlated{}.s == 4.0);
static_assert(scaled{}.scale == 4.0);

struct returns_void {
  void operator()(const sibling_group&, std::span<double>) const {}
  friend bool operator==(const returns_void&, const returns_void&) = default;
};

struct returns_float {
  float operator()(const sibling_group&, std::span<double>) const { return 1.0f; }
  friend bool operator==(const returns_float&, const returns_float&) = default;
};

struct takes_floats {
  double operator()(const sibling_group&, std::span<float>) const { return 1.0; }
  friend bool operator==(const takes_floats&, const takes_floats&) = default;
};

struct not_const {
  double operator()(const sibling_group&, std::span<double>) { return 1.0; }
  friend bool operator==(const not_const&, const not_const&) = default;
};

struct not_comparable {
  double operator()(const sibling_group&, std::span<double>) const { return 1.0; }
};

static_assert(!NoiseCorrelator<int>);
static_assert(!NoiseCorrelator<returns_void>);
static_assert(!NoiseCorrelator<returns_float>);
static_assert(!NoiseCorrelator<takes_floats>);
static_assert(!NoiseCorrelator<not_const>);
static_assert(!NoiseCorrelator<not_comparable>);

}  // namespace
