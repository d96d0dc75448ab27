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

/// Which nodes share the statistics of one depth: those of one tree (the official code), those of every tree in
/// the batch; or each tree's own mean at the depth with a std that keeps the size of the gaps: the within-tree std
/// pooled over the batch's trees (pooled), or the std of the tree's own leaves (leaf_scaled).
enum class normalization_scope { per_tree, per_batch, pooled, leaf_scaled };

/// The scopes' names in configs: per_tree, per_batch, pooled, leaf_scaled.
inline constexpr std::array<enum_choice<normalization_scope>, 4> normalization_scope_names = {
    {{"per_tree", normalization_scope::per_tree},
     {"per_batch", normalization_scope::per_batch},
     {"pooled", normalization_scope::pooled},
     {"leaf_scaled", normalization_scope::leaf_scaled}}};
constexpr const auto& enum_choices(normalization_scope) { return normalization_scope_names; }

inline const char* to_string(normalization_scope scope) {
  switch (scope) {
    case normalization_scope::per_tree:
      return "per_tree";
    case normalization_scope::per_batch:
      return "per_batch";
    case normalization_scope::pooled:
      return "pooled";
    case normalization_scope::leaf_scaled:
      return "leaf_scaled";
  }
  return "?";
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

/// Eq. 4 per tree for the nodes of one depth of trees [first, first + Lanes), one group per tree: the same
/// sums, in the same order, as normalize_depth with last == first + 1, but the trees' sums are independent
/// chains that the processor overlaps. Returns false, with `out` untouched, when a tree's sums are not finite.
template <int Lanes>
inline bool normalize_depth_per_tree(const double* fused, double* out, node_range level, std::int32_t stride,
                                     std::int32_t first, double epsilon, double min_std) {
  std::array<double, Lanes> shift{}, sum{}, squares{};
  std::array<std::int32_t, Lanes> base{};
  for (int l = 0; l < Lanes; ++l) {
    base[static_cast<std::size_t>(l)] = level.begin + (first + l) * stride;
    shift[static_cast<std::size_t>(l)] = fused[base[static_cast<std::size_t>(l)]];
  }
  for (std::int32_t i = 0; i < level.size(); ++i)
    for (std::size_t l = 0; l < Lanes; ++l) {
      const double deviation = fused[base[l] + i] - shift[l];
      sum[l] += deviation;
      squares[l] += deviation * deviation;
    }
  bool finite = true;
  for (std::size_t l = 0; l < Lanes; ++l) finite = finite && std::isfinite(squares[l]);
  if (!finite) return false;
  const auto m = static_cast<double>(std::int64_t{level.size()});
  for (std::size_t l = 0; l < Lanes; ++l) {
    const double sigma = std::sqrt(std::max(0.0, (squares[l] - sum[l] * sum[l] / m) / (m - 1.0)));
    double* const to = out + base[l];
    if (sigma < min_std) {  // advantages 0
      std::fill(to, to + level.size(), 0.0);
      continue;
    }
    const double mean = shift[l] + sum[l] / m;
    const double scale = 1.0 / (sigma + epsilon);
    const double* const from = fused + base[l];
    for (std::int32_t i = 0; i < level.size(); ++i) to[i] = (from[i] - mean) * scale;
  }
  return true;
}

/// The nodes of one depth of every tree, each tree centred on its own mean at that depth and divided by its own
/// scale: A(n) = (r(n) - mu_t) / (sigma[t] + epsilon); a tree whose sigma[t] < min_std gets 0.
inline void centre_per_tree(const double* fused, double* out, node_range level, std::int32_t stride,
                            std::span<const double> sigma, double epsilon, double min_std) {
  const auto m = static_cast<double>(std::int64_t{level.size()});
  for (std::size_t t = 0; t < sigma.size(); ++t) {
    const std::int32_t begin = level.begin + static_cast<std::int32_t>(t) * stride;
    const std::int32_t end = begin + level.size();
    double sum = 0.0;
    for (std::int32_t n = begin; n < end; ++n) sum += fused[n];
    const double mean = sum / m;
    const double scale = sigma[t] < min_std ? 0.0 : 1.0 / (sigma[t] + epsilon);
    for (std::int32_t n = begin; n < end; ++n) out[n] = (fused[n] - mean) * scale;
  }
}

/// pooled's scale at one depth: sigma_pooled^2 = sum_t sum_n (r(n) - mu_t)^2 / (T (m - 1)), the within-tree
/// variance pooled over the T trees (m nodes each at that depth). Not finite when a sum overflows.
inline double pooled_std(const double* fused, node_range level, std::int32_t stride, std::int32_t trees) {
  const auto m = static_cast<double>(std::int64_t{level.size()});
  double squares = 0.0;
  for (std::int32_t t = 0; t < trees; ++t) {
    const std::int32_t begin = level.begin + t * stride, end = level.end + t * stride;
    double sum = 0.0;
    for (std::int32_t n = begin; n < end; ++n) sum += fused[n];
    const double mean = sum / m;
    for (std::int32_t n = begin; n < end; ++n) squares += (fused[n] - mean) * (fused[n] - mean);
  }
  return std::sqrt(squares / (static_cast<double>(trees) * (m - 1.0)));
}

/// depth_wise per_tree: every depth of every tree, trees four at a time, with the roots and one-node depths
/// set to 0 (`out` need not be cleared). Returns false at the first non-finite reward or sum, with `out`
/// partly written: the caller then reports the error as the depth-by-depth pass does.
inline bool normalize_per_tree(const rollout_tree& tree, const double* fused, double* out, double epsilon,
                               double min_std) {
  const std::int32_t stride = tree.nodes_per_tree();
  const std::int32_t trees = tree.tree_count();
  for (std::int32_t t = 0; t < trees; ++t) {  // roots: no edge, advantage 0, but a valid reward
    const node_range roots = tree.nodes_at_depth(t, 0);
    for (std::int32_t n = roots.begin; n < roots.end; ++n) {
      if (!std::isfinite(fused[n])) return false;
      out[n] = 0.0;
    }
  }
  for (int d = 1; d <= tree.steps(); ++d) {
    const node_range level = tree.nodes_at_depth(0, d);  // tree t's: shifted by t * stride
    if (level.size() < 2) {                              // one node: advantage 0, but a valid reward
      for (std::int32_t t = 0; t < trees; ++t)
        for (std::int32_t n = level.begin + t * stride; n < level.end + t * stride; ++n) {
          if (!std::isfinite(fused[n])) return false;
          out[n] = 0.0;
        }
      continue;
    }
    std::int32_t t = 0;
    for (; t + 4 <= trees; t += 4)
      if (!normalize_depth_per_tree<4>(fused, out, level, stride, t, epsilon, min_std)) return false;
    for (; t < trees; ++t)
      if (!normalize_depth_per_tree<1>(fused, out, level, stride, t, epsilon, min_std)) return false;
  }
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
///   pooled keeps each tree's own mean but pools the within-tree variance over the trees: with a second tree
///   whose depth 1 is {1, 5}, depth 1 gives -+0.44721 in the first tree and -+0.89443 in the second (sigma^2 =
///   (1 + 1 + 4 + 4) / 2), where per_tree gives -+0.70711 to both (tests/unit/test_advantage.cpp). Its why:
///   docs/results.md#why-branch-loses-per-iteration.
/// @pre epsilon, min_std finite and >= 0, not both 0; rewards.fused.size() == tree.node_count(), finite.
/// @post result.size() == tree.node_count(); roots 0; inside each normalized group the advantages sum to
///   0 (up to rounding).
/// The overload with `out` writes the same advantages into a caller's buffer (reused across iterations, no
/// allocation): @pre out.size() == tree.node_count(), out does not overlap rewards; @post out == the vector
/// overload's result bit for bit, every element written (on invalid_input its contents are unspecified).
/// per_tree takes one pass over each depth of four trees at a time, the same sums in the same order.
struct depth_wise {
  normalization_scope scope = normalization_scope::per_tree;
  double epsilon = 1e-8;
  double min_std = 1e-6;

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) const {
    std::vector<double> advantages(static_cast<std::size_t>(tree.node_count()), 0.0);
    (*this)(tree, rewards, advantages);
    return advantages;
  }

  void operator()(const rollout_tree& tree, const reward_view& rewards, std::span<double> out) const {
    require(scope == normalization_scope::per_tree || scope == normalization_scope::per_batch ||
                scope == normalization_scope::pooled || scope == normalization_scope::leaf_scaled,
            "depth_wise scope ", static_cast<int>(scope), " is not a normalization_scope");
    detail::check_scale_guards("depth_wise", epsilon, min_std);
    require(rewards.fused.size() == static_cast<std::size_t>(tree.node_count()), "got ", rewards.fused.size(),
            " fused rewards for ", tree.node_count(), " nodes");
    require(out.size() == static_cast<std::size_t>(tree.node_count()), "got room for ", out.size(), " advantages for ",
            tree.node_count(), " nodes");
    const double* const fused = rewards.fused.data();
    // per_tree: one pass that also checks every reward; on an invalid one, the pass below names it.
    if (scope == normalization_scope::per_tree && detail::normalize_per_tree(tree, fused, out.data(), epsilon, min_std))
      return;
    std::fill(out.begin(), out.end(), 0.0);
    const std::int32_t stride = tree.nodes_per_tree();
    double* const advantages = out.data();
    // Roots have no edge and are not normalized, but their rewards must be valid all the same.
    const node_range roots = tree.nodes_at_depth(0, 0);
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) detail::check_node_rewards(rewards.fused, roots, t * stride);
    // leaf_scaled: every depth of a tree is divided by the std of that tree's leaves (its prompt's reward spread).
    std::vector<double> tree_sigma(static_cast<std::size_t>(tree.tree_count()), 0.0);
    if (scope == normalization_scope::leaf_scaled) {
      const node_range leaves = tree.nodes_at_depth(0, tree.steps());
      for (std::int32_t t = 0; t < tree.tree_count(); ++t) {
        detail::check_node_rewards(rewards.fused, leaves, t * stride);
        if (leaves.size() < 2) continue;                                            // one leaf: no spread, advantages 0
        const double sigma = detail::pooled_std(fused + t * stride, leaves, 0, 1);  // tree t's leaves alone
        require(std::isfinite(sigma), "depth_wise: the leaf rewards of tree ", t, " overflow when squared");
        tree_sigma[static_cast<std::size_t>(t)] = sigma;
      }
    }
    for (int d = 1; d <= tree.steps(); ++d) {              // depth 0 holds the roots, which have no edge
      const node_range level = tree.nodes_at_depth(0, d);  // tree t's: shifted by t * stride
      const bool per_batch = scope == normalization_scope::per_batch;
      const std::int32_t group = per_batch ? tree.tree_count() : 1;
      // One node (per tree for pooled and leaf_scaled, whose groups are trees): advantage 0, but the reward must
      // be valid.
      if (std::int64_t{level.size()} * group < 2) {
        for (std::int32_t t = 0; t < tree.tree_count(); ++t)
          detail::check_node_rewards(rewards.fused, level, t * stride);
        continue;
      }
      if (scope == normalization_scope::pooled || scope == normalization_scope::leaf_scaled) {
        for (std::int32_t t = 0; t < tree.tree_count(); ++t)
          detail::check_node_rewards(rewards.fused, level, t * stride);
        if (scope == normalization_scope::pooled) {
          const double sigma = detail::pooled_std(fused, level, stride, tree.tree_count());
          require(std::isfinite(sigma), "depth_wise: the fused rewards at depth ", d, " overflow when squared");
          std::fill(tree_sigma.begin(), tree_sigma.end(), sigma);
        }
        detail::centre_per_tree(fused, advantages, level, stride, tree_sigma, epsilon, min_std);
        continue;
      }
      for (std::int32_t first = 0; first < tree.tree_count(); first += group)
        if (!detail::normalize_depth(fused, advantages, level, stride, first, first + group, epsilon, min_std)) {
          for (std::int32_t t = first; t < first + group; ++t)
            detail::check_node_rewards(rewards.fused, level, t * stride);
          fail("depth_wise: the fused rewards at depth ", d, " overflow when squared");
        }
    }
  }
  friend bool operator==(const depth_wise&, const depth_wise&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "depth_wise", summary = "z-score per depth (paper Eq. 4); the default";
  static constexpr auto parameters() {
    return std::tuple{parameter("scope", &depth_wise::scope,
                                "per_tree (paper), per_batch (all trees at once); own tree's mean with a std pooled "
                                "over the trees (pooled) or of the tree's leaves (leaf_scaled)",
                                rules::any{}),
                      parameter("epsilon", &depth_wise::epsilon, "added to the std before dividing",
                                rules::in_range{.low = 0, .high = 1}),
                      parameter("min_std", &depth_wise::min_std, "a depth whose std is below this gets advantage 0",
                                rules::in_range{.low = 0, .high = 1})};
  }
};

}  // namespace branchgrpo
