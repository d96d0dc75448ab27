#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// Pref-GRPO's win rate (arXiv 2508.20751) of each row against the other rows of its group (one tree's leaves,
/// `groups`): w_i = (wins_i + tie ties_i) / (m_i - 1), where the group's m_i finite scores other than i are its
/// opponents, a win is s_i > s_j and a tie s_i == s_j. A row with a non-finite score gets NaN (its tree is dropped
/// anyway) and is nobody's opponent; a row without opponents gets `tie` (neither better nor worse).
/// Example: one group {0.2, 0.5, 0.5, 0.9}, tie 0.5 -> {0, 0.5, 0.5, 1}: 0.5 beats 0.2 and ties the other 0.5,
///   (1 + 0.5) / 3 = 0.5. Two groups of 2, {1, 2, 7, 7} -> {0, 1, 0.5, 0.5}.
/// @pre scores.size() == groups.rows() (else invalid_input naming both); tie in [0, 1].
/// @post every finite result in [0, 1]; with tie 0.5, a group's m >= 2 finite results sum to m / 2 (each pair
///       gives 1 between its two rows).
inline std::vector<double> win_rates(std::span<const double> scores, const leaf_groups& groups, double tie = 0.5) {
  require(scores.size() == groups.rows(), "win_rate: ", scores.size(), " scores for ", groups.rows(), " rows (",
          groups.keys.size(), " groups of ", groups.leaves_per_tree, ")");
  require(tie >= 0 && tie <= 1, "win_rate tie ", tie, " is outside [0, 1]");
  std::vector<double> out(scores.size(), std::numeric_limits<double>::quiet_NaN());
  const auto size = static_cast<std::size_t>(groups.leaves_per_tree);
  for (std::size_t first = 0; first < scores.size(); first += size) {
    std::size_t finite = 0;
    for (std::size_t j = first; j < first + size; ++j) finite += std::isfinite(scores[j]) ? 1 : 0;
    for (std::size_t i = first; i < first + size; ++i) {
      if (!std::isfinite(scores[i])) continue;
      if (finite < 2) {
        out[i] = tie;
        continue;
      }
      double won = 0;
      for (std::size_t j = first; j < first + size; ++j) {
        if (j == i || !std::isfinite(scores[j])) continue;
        won += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? tie : 0.0;
      }
      out[i] = won / static_cast<double>(finite - 1);
    }
  }
  return out;
}

/// A groupwise reward from any pointwise one: each leaf scores its win rate within its tree (win_rates). Against
/// reward hacking: a leaf gains only by beating its siblings, not by inflating a scale the scorer rewards without
/// bound, and every group's rewards have the same spread whatever the scorer's scale.
/// Example: win_rate<mode_reward<>>{.score = {}} on one tree whose 4 leaves score {0.2, 0.5, 0.5, 0.9} ->
///   {0, 0.5, 0.5, 1}.
/// @pre Pointwise returns one score per row; tie in [0, 1].
template <class Pointwise>
struct win_rate {
  Pointwise score{};
  double tie = 0.5;  ///< what a tie (or a leaf without finite opponents) counts

  template <class Tensor>
  requires requires(Pointwise& s, const Tensor& leaves, std::span<const std::int64_t> prompts) {
    { s(leaves, prompts) } -> std::same_as<std::vector<double>>;
  }
  std::vector<double> operator()(const Tensor& leaves, std::span<const std::int64_t> prompts,
                                 const leaf_groups& groups) {
    const std::vector<double> pointwise = score(leaves, prompts);
    require(pointwise.size() == prompts.size(), "win_rate: the pointwise reward returned ", pointwise.size(),
            " scores for ", prompts.size(), " rows");
    return win_rates(pointwise, groups, tie);
  }
};

}  // namespace branchgrpo
