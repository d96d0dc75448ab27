#pragma once
// Rewards of the toy: how close a leaf lands to the mode its prompt names.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/toy/ring_data.hpp"

namespace branchgrpo {

/// A Gaussian bump on the prompt's target mode m_p (p mod ring.modes):
///   r(x, p) = exp(-|x - m_p|^2 / (2 width^2)),  in (0, 1], 1 exactly on the mode.
/// With the default ring (radius 2) a sample on the neighbouring mode (1.531 away) scores
/// exp(-1.531^2 / 0.5) = 0.0093, on the centre exp(-8) = 0.00034: the reward separates the modes sharply.
/// Example: width 0.5, ring_mixture{}: x = {2, 0.5}, prompt 0 (m_0 = {2, 0}) -> exp(-0.25 / 0.5) = 0.606531;
///   x = {2, 0}, prompt 8 (mode 0) -> 1; x = {0, 0}, prompt 3 -> exp(-4 / 0.5) = exp(-8) = 0.000335.
/// @pre width positive and finite; ring valid; one prompt per row; rows of 2 elements.
/// @post one reward per row; a row with a non-finite element scores NaN (a failed leaf, which the trainer
///       drops), every other row scores in [0, 1].
template <Backend B = host_backend>
struct mode_reward {
  double width = 0.5;
  ring_mixture ring{};
  B backend{};

  /// r of one point.
  [[nodiscard]] double score(double x, double y, std::int64_t prompt) const {
    const auto m = ring.mode(prompt);
    const double squared = (x - m[0]) * (x - m[0]) + (y - m[1]) * (y - m[1]);
    return std::exp(-squared / (2.0 * width * width));
  }

  std::vector<double> operator()(const typename B::tensor& leaves, std::span<const std::int64_t> prompts) {
    require(std::isfinite(width) && width > 0.0, "mode_reward width must be positive and finite, got ", width);
    ring.validate();
    const std::vector<double> host = backend.to_host(leaves);
    const std::int64_t rows = backend.rows(leaves);
    require(static_cast<std::int64_t>(host.size()) == 2 * rows, "mode_reward needs latents of 2 elements, got ",
            host.size(), " values for ", rows, " rows");
    require(static_cast<std::int64_t>(prompts.size()) == rows, "mode_reward got ", prompts.size(), " prompts for ",
            rows, " rows");
    std::vector<double> out(static_cast<std::size_t>(rows));
    for (std::size_t r = 0; r < out.size(); ++r) {
      const double x = host[2 * r], y = host[2 * r + 1];
      out[r] = std::isfinite(x) && std::isfinite(y) ? score(x, y, prompts[r]) : std::nan("");
    }
    return out;
  }
  friend bool operator==(const mode_reward&, const mode_reward&) = default;
};

}  // namespace branchgrpo
