#pragma once
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"

namespace branchgrpo {

/// The official BranchGRPO code's split_noise_scale: at a split each child draws its own noise with `scale` times the
/// stepper's std. As every correlator, it writes standardized rows (here each child's own keyed N(0, 1) draw,
/// independent's rows) and returns the factor; the engine then samples mean + noise_std * scale * row and scores
/// the edge with std noise_std * scale, the std the sample was really drawn from. (The official code scored it
/// with the unscaled std: each split sample then sits ~scale standard deviations from the mean and its importance
/// ratio is wrong.)
/// Example: scale 4, the keys and elements of independent's example ->
///   out = {-1.057266, -1.515668, 0.867662, 0.734200} (independent's, 6 digits); returns 4.
/// @pre scale finite and > 0; K = group.children.size() >= 2, group.elements >= 1,
///      out.size() == K * group.elements.
/// @post out == independent's out element-wise (every row N(0, I)); returns scale.
struct scaled {
  double scale = 4.0;

  double operator()(const sibling_group& group, std::span<double> out) const {
    require(std::isfinite(scale) && scale > 0.0, "scaled scale must be positive and finite, got ", scale);
    const std::size_t k = detail::check_sibling_group(group, out, "scaled");
    for (std::size_t b = 0; b < k; ++b) detail::fill_own_row(group, b, out);
    return scale;
  }
  friend bool operator==(const scaled&, const scaled&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "scaled",
                                    summary = "own draws times scale, correctly scored (the official code's option)";
  static constexpr auto parameters() {
    return std::tuple{parameter("scale", &scaled::scale,
                                "std multiplier of split children (official split_noise_scale)",
                                rules::in_range{.low = 1e-3, .high = 1e3})};
  }
};

}  // namespace branchgrpo
