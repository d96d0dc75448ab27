#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <tuple>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/correlator/concept.hpp"
#include "branchgrpo/correlator/sibling_rows.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"

namespace branchgrpo {

/// BranchGRPO paper, Eq. 2: xi_b = (xi_0 + s * eta_b) / sqrt(1 + s^2), with xi_0 the parent's draw shared
/// by the siblings (parent key, stream shared) and eta_b child b's own draw (its key, stream edge).
/// Each xi_b is N(0, 1), so the SDE marginal is kept (returns 1); siblings correlate by 1 / (1 + s^2)
/// (1/17 for the default s = 4, the paper's best of {1, 2, 4, 8}). s must be > 0: s = 0 makes all
/// siblings identical and wastes the split.
/// Example: s 1, parent key {seed 7, node 0} (other fields 0), the children and elements of independent's example:
///   xi_0 = {-0.729930, -0.329199}, eta_0 = {-1.057266, -1.515668}, eta_1 = {0.867662, 0.734200} ->
///   out = (xi_0 + eta_b) / sqrt(2) = {-1.263738, -1.304518, 0.097391, 0.286379} (6 digits); returns 1.
/// @pre s finite and > 0; K = group.children.size() >= 2, group.elements >= 1,
///      out.size() == K * group.elements.
/// @post every row is N(0, I); rows b != c correlate by 1 / (1 + s^2) element-wise; returns 1.
struct correlated {
  double s = 4.0;

  double operator()(const sibling_group& group, std::span<double> out) const {
    require(std::isfinite(s) && s > 0.0, "correlated s must be positive and finite, got ", s);
    const std::size_t k = detail::check_sibling_group(group, out, "correlated");
    for (std::size_t b = 0; b < k; ++b) detail::fill_own_row(group, b, out);
    // xi_0 is drawn in chunks through a stack buffer: no allocation however large the latent.
    const noise_key shared_key = detail::stream_key(group.parent, noise_stream::shared);
    const double norm = std::sqrt(1.0 + s * s);
    std::array<double, 256> shared{};
    for (std::size_t first = 0; first < group.elements; first += shared.size()) {
      const std::size_t count = std::min(shared.size(), group.elements - first);
      fill_keyed_normal(shared_key, std::span<double>(shared.data(), count), first);
      for (std::size_t b = 0; b < k; ++b) {
        const std::span<double> row = detail::sibling_row(out, b, group.elements).subspan(first, count);
        for (std::size_t i = 0; i < count; ++i) row[i] = (shared[i] + s * row[i]) / norm;
      }
    }
    return 1.0;
  }
  friend bool operator==(const correlated&, const correlated&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "correlated",
                                    summary = "shared + own draw, marginal kept (paper Eq. 2); the default";
  static constexpr auto parameters() {
    return std::tuple{parameter("s", &correlated::s,
                                "weight of each child's own draw against the shared one (paper Eq. 2)",
                                rules::in_range{.low = 0, .high = 1e3})};
  }
};

}  // namespace branchgrpo
