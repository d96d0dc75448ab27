#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/advantage/concept.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/state.hpp"
#include "branchgrpo/fusion/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo {

/// Per-reward advantages (MixGRPO's advantage_aggr, Flow-Factory's gdpo), on trees: each part c of a reward made
/// of weighted parts is fused on the tree and normalized on its own, and the node's advantage is the weighted sum
///   A(n) = sum_c w_c N_c(tree, {leaf_c, F(tree, leaf_c)})(n)
/// instead of N(tree, {r, F(tree, r)})(n) with r = sum_c w_c leaf_c. A part of a small spread then moves the
/// policy as much as one of a large spread, and no part hides behind another's scale. It composes any Fusion F with
/// any Normalizer N; a stateful N keeps one state per part (`parts`, made from `normalizer` at the first call).
/// With no parts in the view (a reward that reports none) it is N(tree, {leaf, F(tree, leaf)}): the plain stage.
/// Example: the 7-node binary tree (root; 1, 2; leaves 3, 4 under 1 and 5, 6 under 2), uniform_mean, depth_wise,
///   parts a = {1, 3, 2, 6} with weight 1 and b = {0, 2, 4, 6} with weight 0.5:
///   N(a) = {0, -1/sqrt 2, 1/sqrt 2, -0.92582, 0, -0.46291, 1.38873} (fused {3, 2, 4, 1, 3, 2, 6}),
///   N(b) = {0, -1/sqrt 2, 1/sqrt 2, -1.16190, -0.38730, 0.38730, 1.16190} (fused {3, 1, 5, 0, 2, 4, 6}),
///   A = N(a) + 0.5 N(b) = {0, -1.06066, 1.06066, -1.50677, -0.19365, -0.26926, 1.96968};
///   the plain stage on r = {1, 4, 4, 9} gives {0, -0.70711, 0.70711, -1.05529, -0.15076, -0.15076, 1.35680}.
/// @pre every part's leaf scores have tree.leaf_count() values and finite weights; the parts keep their count and
///      order from call to call (else invalid_input naming the counts); N's and F's own preconditions.
/// @post result.size() == tree.node_count(); roots 0 when N gives roots 0.
template <Fusion F, Normalizer N>
struct per_reward {
  F fusion{};
  N normalizer{};
  /// State: one normalizer per part, copies of `normalizer` made at the first call (stateful normalizers keep
  /// their statistics per part).
  std::vector<N> parts{};

  std::vector<double> operator()(const rollout_tree& tree, const reward_view& rewards) {
    const std::size_t count = rewards.components.empty() ? 1 : rewards.components.size();
    if (parts.empty()) parts.assign(count, normalizer);
    require(parts.size() == count, "per_reward was set up for ", parts.size(), " reward parts, this call has ", count);
    if (rewards.components.empty()) {
      const std::vector<double> fused = fusion(tree, rewards.leaf);
      return parts.front()(tree, reward_view{.leaf = rewards.leaf, .fused = fused});
    }
    std::vector<double> total(static_cast<std::size_t>(tree.node_count()), 0.0);
    for (std::size_t c = 0; c < count; ++c) {
      const leaf_component& part = rewards.components[c];
      require(part.leaf.size() == static_cast<std::size_t>(tree.leaf_count()), "per_reward part '", part.name, "' has ",
              part.leaf.size(), " leaf scores for ", tree.leaf_count(), " leaves");
      require(std::isfinite(part.weight), "per_reward part '", part.name, "' has weight ", part.weight);
      const std::vector<double> fused = fusion(tree, part.leaf);
      const std::vector<double> advantages = parts[c](tree, reward_view{.leaf = part.leaf, .fused = fused});
      require(advantages.size() == total.size(), "per_reward: the normalizer returned ", advantages.size(),
              " advantages for ", total.size(), " nodes");
      for (std::size_t n = 0; n < total.size(); ++n) total[n] += part.weight * advantages[n];
    }
    return total;
  }

  /// The number of parts under "parts" and each part's state under "part.<c>.<key>" (concept Stateful, when N
  /// is). Example: two per_prompt_running parts after one call on prompt 0 -> {"parts": {2},
  ///   "part.0.prompt.0": ..., "part.1.prompt.0": ...}.
  [[nodiscard]] component_state save_state() const requires Stateful<N> {
    component_state state{{"parts", {static_cast<double>(parts.size())}}};
    for (std::size_t c = 0; c < parts.size(); ++c)
      for (auto& [key, values] : parts[c].save_state()) state["part." + std::to_string(c) + "." + key] = values;
    return state;
  }

  /// Restores what save_state returned: the parts are made from `normalizer` and loaded.
  /// @pre "parts" holds one whole count and every other key is "part.<c>.<key>" with c below it (else
  ///      invalid_input naming it, nothing changed).
  void load_state(const component_state& state) requires Stateful<N> {
    const auto count_entry = state.find("parts");
    require(count_entry != state.end() && count_entry->second.size() == 1 && count_entry->second[0] >= 0 &&
                count_entry->second[0] <= 1e6 && count_entry->second[0] == std::floor(count_entry->second[0]),
            "per_reward state needs 'parts' = one whole count");
    std::vector<component_state> split(static_cast<std::size_t>(count_entry->second[0]));
    for (const auto& [key, values] : state) {
      if (key == "parts") continue;
      constexpr std::size_t prefix = 5;  // "part."
      const std::size_t dot = key.find('.', prefix);
      bool valid = key.starts_with("part.") && dot != std::string::npos && dot > prefix && dot - prefix <= 6;
      std::size_t c = 0;
      for (std::size_t i = prefix; valid && i < dot; ++i) {
        valid = key[i] >= '0' && key[i] <= '9';
        c = c * 10 + static_cast<std::size_t>(key[i] - '0');
      }
      require(valid && c < split.size(), "per_reward state key '", key, "' is not part.<index below ", split.size(),
              ">.<key>");
      split[c][key.substr(dot + 1)] = values;
    }
    std::vector<N> loaded(split.size(), normalizer);
    for (std::size_t c = 0; c < split.size(); ++c) loaded[c].load_state(split[c]);
    parts = std::move(loaded);
  }

  friend bool operator==(const per_reward&, const per_reward&) = default;
};

}  // namespace branchgrpo
