#pragma once
// The toy's data: a 2-D mixture of Gaussians on a ring, and the keyed draws every toy component samples from.
// All toy randomness is the keyed Philox normal of noise/keyed_normal.hpp (portable, unlike the
// implementation-defined std:: distributions); a uniform is Phi(z) = erfc(-z / sqrt 2) / 2 of such a normal.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"

namespace branchgrpo {

/// What a toy draw is for: the `tree` field of its noise key (far above any rollout's tree keys), so the
/// toy's own draws never coincide with a rollout's under the same seed.
enum class toy_draw : std::uint32_t {
  ring_sample = 0xFFFF0000u,  ///< samples of ring_mixture::sample
  feature = 0xFFFF0001u,      ///< random Fourier feature frequencies and phases
  fit_sample = 0xFFFF0002u,   ///< the flow-matching samples of the base fit
};

/// The keyed N(0, 1) draws number `index` of kind `kind`: key {seed, iteration 0, tree kind, node index,
/// step 0, stream auxiliary}, elements 0 .. out.size() - 1.
inline void toy_normals(std::uint64_t seed, toy_draw kind, std::uint32_t index, std::span<double> out) {
  fill_keyed_normal({.seed = seed,
                     .iteration = 0,
                     .tree = static_cast<std::uint32_t>(kind),
                     .node = index,
                     .step = 0,
                     .stream = noise_stream::auxiliary},
                    out);
}

/// U(0, 1) from a standard normal: Phi(z).
/// Example: normal_to_uniform(0) == 0.5; normal_to_uniform(1.959964) ~= 0.975.
inline double normal_to_uniform(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

/// The target mode of a prompt: prompt mod `modes`, in [0, modes) also for negative prompts.
/// Example: prompt_mode(10, 8) == 2; prompt_mode(-1, 8) == 7.
/// @pre modes >= 1.
inline int prompt_mode(std::int64_t prompt, int modes) {
  require(modes >= 1, "the number of modes must be at least 1, got ", modes);
  const std::int64_t m = prompt % modes;
  return static_cast<int>(m < 0 ? m + modes : m);
}

/// `modes` isotropic Gaussians of standard deviation `std` with equal weights, mode k at radius `radius`
/// and angle 2 pi k / modes: m_k = radius (cos, sin)(2 pi k / modes).
/// Example: ring_mixture{} (8 modes, radius 2, std 0.15): mode(0) == {2, 0}, mode(2) == {0, 2} (to rounding),
///   mode(5) == {-sqrt 2, -sqrt 2}; neighbouring modes are 2 * 2 sin(pi / 8) = 1.531 apart (10.2 std).
/// @pre modes >= 1; radius and std positive and finite (checked by validate()).
struct ring_mixture {
  int modes = 8;
  double radius = 2.0;
  double std = 0.15;

  void validate() const {
    require(modes >= 1, "ring_mixture modes must be at least 1, got ", modes);
    require(std::isfinite(radius) && radius > 0.0, "ring_mixture radius must be positive and finite, got ", radius);
    require(std::isfinite(std) && std > 0.0, "ring_mixture std must be positive and finite, got ", std);
  }

  /// Unit vector of mode k's angle 2 pi k / modes (k is taken mod modes).
  [[nodiscard]] std::array<double, 2> direction(std::int64_t k) const {
    const double angle = 2.0 * std::numbers::pi * prompt_mode(k, modes) / modes;
    return {std::cos(angle), std::sin(angle)};
  }

  /// Centre of mode k (k mod modes).
  [[nodiscard]] std::array<double, 2> mode(std::int64_t k) const {
    const auto d = direction(k);
    return {radius * d[0], radius * d[1]};
  }

  /// A point from three standard normals: the mode is floor(modes * Phi(draws[0])), the offset std * draws[1, 2].
  [[nodiscard]] std::array<double, 2> point(std::span<const double, 3> draws) const {
    const int k = std::min(modes - 1, static_cast<int>(normal_to_uniform(draws[0]) * modes));
    const auto m = mode(k);
    return {m[0] + std * draws[1], m[1] + std * draws[2]};
  }

  /// `count` points, row-major {x_0, y_0, x_1, y_1, ...}; point i uses toy_normals(seed, ring_sample, i)
  /// (3 elements). Deterministic in (seed, i) and independent of count.
  /// @pre valid parameters, 0 <= count < 2^32.
  [[nodiscard]] std::vector<double> sample(std::uint64_t seed, std::int64_t count) const {
    validate();
    require(count >= 0 && count <= std::int64_t{0xFFFFFFFF}, "ring sample count must be in [0, 2^32), got ", count);
    std::vector<double> out(static_cast<std::size_t>(count) * 2);
    std::array<double, 3> draws{};
    for (std::int64_t i = 0; i < count; ++i) {
      toy_normals(seed, toy_draw::ring_sample, static_cast<std::uint32_t>(i), draws);
      const auto p = point(draws);
      out[static_cast<std::size_t>(2 * i)] = p[0];
      out[static_cast<std::size_t>(2 * i + 1)] = p[1];
    }
    return out;
  }

  /// Distance from (x, y) to the nearest mode centre.
  [[nodiscard]] double distance_to_nearest_mode(double x, double y) const {
    double best = std::numeric_limits<double>::infinity();
    for (int k = 0; k < modes; ++k) {
      const auto m = mode(k);
      best = std::min(best, std::hypot(x - m[0], y - m[1]));
    }
    return best;
  }

  friend bool operator==(const ring_mixture&, const ring_mixture&) = default;
};

}  // namespace branchgrpo
