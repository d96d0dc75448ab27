#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/advantage/scale_guards.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Which nodes share the statistics of one depth: those of one tree (the official code) or those of
/// every tree in the batch.
enum class normalization_scope { per_tree, per_batch };

/// The scopes' names in configs: per_tree, per_batch.
inline constexpr std::array<enum_choice<normalization_scope>, 2> normalization_scope_names = {
    {{"per_tree", normalization_scope::per_tree}, {"per_batch", normalization_scope::per_batch}}};
constexpr const auto& enum_choices(normalization_scope) { return normalization_scope_names; }

inline const char* to_string(normalization_scope scope) {
  return scope == normalization_scope::per_tree ? "per_tree" : "per_batch";
}

namespace detail {

/// Throws naming the first non-finite fused reward among nodes `range` shifted by `offset`.
inline void check_node_rewards(std::span<const double> fused, node_range range, std::int32_t offset) {
  for (std::int32_t n = range.begin + offset; n < range.end + offset; ++n)
    if (!std::isfinite(fused[static_cast<std::size_t>(n)]))
      fail("fused reward of node ", n, " is ", fused[static_cast<std::size_t>(n)]);
}

/// Eq. 4 for the nodes of one depth over trees [first, last): `level` holds tree 0's nodes, tree t's are
/// shifted by t * stride. Mean and variance come from one pass over the deviations from the group's first
/// value (two independent sums; the shift keeps the variance free of cancellation). Returns false, with
/// `out` untouched, when the sums are not finite (a NaN or infinite reward, or an overflow).
inline bool normalize_depth(const double* fused, double* out, node_range level, std::int32_t stride, std::int32_t first,
                            std::int32_t last, double epsilon, double min_std) {
  const double shift = fused[level.begin + first * stride];
  double sum = 0.0;
  double squares = 0.0;
  for (std::int32_t t = first; t < last; ++t)
    for (std::int32_t n = level.begin + t * stride; n < level.end + t * stride; ++n) {
      const double deviation = fused[n] - shift;
      sum += deviation;
      squares += deviation * deviation;
    }
  if (!std::isfinite(squares)) return false;
  const auto m = static_cast<double>(std::int64_t{level.size()} * (last - first));
  const double sigma = std::sqrt(std::max(0.0, (squares - sum * sum / m) / (m - 1.0)));
  if (sigma < min_std) return true;  // advantages stay 0
  const double mean = shift + sum / m;
  const double scale = 1.0 / (sigma + epsilon);
  for (std::int32_t t = first; t < last; ++t)
    for (std::int32_t n = level.begin + t * stride; n < level.end + t * stride; ++n) out[n] = (fused[n] - mean) * scale;
  return true;
}

}  // namespace detail

/// Paper Eq. 4: A(n) = (r(n) - mu_d) / (sigma_d + epsilon) over the fused rewards of the nodes at depth d
/// (of one tree, or of all trees for per_batch); sigma the unbiased std (torch.std, divide by m - 1).
/// A = 0 for roots, for every node of a depth that holds one node, and when sigma < min_std. A depth of
/// two nodes always gives -+0.7071 whatever the gap between them (a property of Eq. 4, kept as is).
/// Example: the 7-node tree of uniform_mean (root 0; 1, 2; leaves 3, 4 under 1, 5, 6 under 2), fused
///   {3, 2, 4, 1, 3, 2, 6}, per_tree ->
///   {0, -0.70711, 0.70711, -0.92582, 0, -0.46291, 1.38873}
///   (depth 1: mu 3, sigma sqrt(2); depth 2: mu 3, sigma sqrt(14 / 3) = 2.16025).
/// @pre epsilon, min_std finite and >= 0, not both 0; rewards.fused.size() == tree.node_count(), finite.
/// @post result.size() == tree.node_count(); roots 0; inside each normalized group the advantages sum to
///   0 (up to rounding).
struct depth_wise {
  normalization_scope scope = normalization_scope::per_tree;
  double epsilon = 1e-8;
  double min_std = 1e-6;

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) const {
    require(scope == normalization_scope::per_tree || scope == normalization_scope::per_batch, "depth_wise scope ",
            static_cast<int>(scope), " is not a normalization_scope");
    detail::check_scale_guards("depth_wise", epsilon, min_std);
    require(rewards.fused.size() == static_cast<std::size_t>(tree.node_count()), "got ", rewards.fused.size(),
            " fused rewards for ", tree.node_count(), " nodes");
    std::vector<double> advantages(static_cast<std::size_t>(tree.node_count()), 0.0);
    const std::int32_t stride = tree.nodes_per_tree();
    const double* const fused = rewards.fused.data();
    double* const out = advantages.data();
    // Roots have no edge and are not normalized, but their rewards must be valid all the same.
    const node_range roots = tree.nodes_at_depth(0, 0);
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) detail::check_node_rewards(rewards.fused, roots, t * stride);
    for (int d = 1; d <= tree.steps(); ++d) {              // depth 0 holds the roots, which have no edge
      const node_range level = tree.nodes_at_depth(0, d);  // tree t's: shifted by t * stride
      const bool per_batch = scope == normalization_scope::per_batch;
      const std::int32_t group = per_batch ? tree.tree_count() : 1;
      if (std::int64_t{level.size()} * group < 2) {  // one node: advantage 0, but the reward must be valid
        for (std::int32_t t = 0; t < tree.tree_count(); ++t)
          detail::check_node_rewards(rewards.fused, level, t * stride);
        continue;
      }
      for (std::int32_t first = 0; first < tree.tree_count(); first += group)
        if (!detail::normalize_depth(fused, out, level, stride, first, first + group, epsilon, min_std)) {
          for (std::int32_t t = first; t < first + group; ++t)
            detail::check_node_rewards(rewards.fused, level, t * stride);
          fail("depth_wise: the fused rewards at depth ", d, " overflow when squared");
        }
    }
    return advantages;
  }
  friend bool operator==(const depth_wise&, const depth_wise&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "depth_wise", summary = "z-score per depth (paper Eq. 4); the default";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("scope", &depth_wise::scope, "per_tree (paper) or per_batch (every tree of the iteration at once)",
                  rules::any{}),
        parameter("epsilon", &depth_wise::epsilon, "added to the std before dividing", rules::non_negative{}),
        parameter("min_std", &depth_wise::min_std, "a depth whose std is below this gets advantage 0",
                  rules::non_negative{})};
  }
};

}  // namespace branchgrpo
