#pragma once
// The noise level sigma of each denoising step of a rectified-flow model: x_sigma = (1 - sigma) x0 + sigma eps.
// Step i moves a latent from sigmas[i] to sigmas[i + 1]; sigmas[0] is the noisiest level.
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"

namespace branchgrpo {

/// A validated, strictly decreasing sequence of noise levels in [0, 1]; steps() transitions.
class sigma_schedule {
 public:
  /// Accepts a user-given schedule.
  /// Example: sigma_schedule({1.0, 0.5, 0.0}).steps() == 2.
  /// @pre at least two values, all finite and in [0, 1], strictly decreasing.
  /// @post sigma(i) == values[i].
  explicit sigma_schedule(std::vector<double> values) : sigmas_(std::move(values)) {
    require(sigmas_.size() >= 2, "a sigma schedule needs at least 2 values, got ", sigmas_.size());
    for (std::size_t i = 0; i < sigmas_.size(); ++i) {
      const double value = sigmas_[i];
      require(std::isfinite(value) && value >= 0.0 && value <= 1.0, "sigma[", i, "] = ", value, " is outside [0, 1]");
      require(i == 0 || value < sigmas_[i - 1], "sigma schedule does not decrease at index ", i, ": ", sigmas_[i - 1],
              " then ", value);
    }
  }

  [[nodiscard]] int steps() const { return static_cast<int>(sigmas_.size()) - 1; }
  [[nodiscard]] double sigma(int index) const { return sigmas_.at(static_cast<std::size_t>(index)); }
  [[nodiscard]] std::span<const double> values() const { return sigmas_; }

  friend bool operator==(const sigma_schedule&, const sigma_schedule&) = default;

 private:
  std::vector<double> sigmas_;
};

/// Linear 1 -> 0 over `steps` steps, then the SD3 time shift s * sig / (1 + (s - 1) * sig).
/// Example: shifted_linear_schedule(2, 3.0) -> {1.0, 0.75, 0.0}  (0.5 shifted: 1.5 / 2); Wan 2.1 text-to-video's
///   shift 5: shifted_linear_schedule(2, 5.0) -> {1.0, 0.8333, 0.0}  (2.5 / 3). Larger shifts keep more of the
///   steps at high noise, which video and high-resolution latents (more tokens) need.
/// @pre 1 <= steps <= max_steps (checked before anything is allocated), shift > 0 and finite.
/// @post strictly decreasing from 1 to 0 with steps + 1 values.
inline sigma_schedule shifted_linear_schedule(int steps, double shift = 3.0) {
  check_step_count(steps);
  require(std::isfinite(shift) && shift > 0.0, "time shift must be positive and finite, got ", shift);
  std::vector<double> sigmas(static_cast<std::size_t>(steps) + 1);
  for (int i = 0; i <= steps; ++i) {
    const double linear = 1.0 - static_cast<double>(i) / steps;
    sigmas[static_cast<std::size_t>(i)] = shift * linear / (1.0 + (shift - 1.0) * linear);
  }
  return sigma_schedule(std::move(sigmas));
}

}  // namespace branchgrpo
