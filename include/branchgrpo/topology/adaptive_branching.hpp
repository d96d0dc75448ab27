#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/state.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// What adaptive_branching remembers of one prompt: how often it was rolled out, the spread (population std) of its
/// leaf rewards, decayed over visits, its last mean reward, and how much that mean moved at the last visit.
struct prompt_record {
  double visits = 0;
  double spread = 0;
  double mean = 0;
  double gain = 0;
  friend bool operator==(const prompt_record&, const prompt_record&) = default;
};

/// Dynamic branching per prompt (the BranchGRPO paper's next step, "dynamic branching density"; SuperFlow's group
/// size by reward variance, arXiv 2512.17951): a stateful topology. Its plan is the envelope, split_schedule
/// {split_steps, {branching}}; each iteration every prompt's tree gets a level j in [0, S] (S = the envelope's
/// splits): its last j splits branch, the first S - j continue as a chain (rollout_tree::leave_out keeps their first
/// child). Level 0 is one chain, level S the whole envelope; a lower level has a longer shared prefix and fewer leaves.
/// The levels share a budget of `budget` denoiser evaluations per prompt on average: every tree starts as a chain and
/// the next level goes, while it fits, to the prompt with the highest priority
///   priority = spread + gain_weight * |gain|   (a prompt not seen yet: infinite; ties: the lower level, then the
///                                               earlier tree)
/// so prompts whose rewards disagree, or still move, get the branches, and prompts that every leaf scores alike stay
/// cheap. observe() updates the records from an iteration's kept trees (the whole forest, so every rank agrees):
///   spread = std of the tree's sampled leaf rewards at the first visit, then decay * spread + (1 - decay) * std;
///   gain = mean - previous mean (0 at the first visit); mean = the tree's mean leaf reward.
/// The records are its state (save_state / load_state: checkpoints resume it exactly).
/// Example: the dense envelope ({0, 3, 6, 9}, K 2, 20 steps; level costs 20, 30, 53, 102, 203), budget 120, so
///   240 evaluations for two trees. Two unseen prompts rise level by level together (priority infinite, the lower
///   level first) to {3, 3} (204); the next step (+101) does not fit. A seen prompt with spread 0 and gain 0 beside an
///   unseen one: the unseen tree takes every level (203), the seen one gets what is left: levels {1, 4}, 233.
/// @pre budget >= one chain's evaluations (else invalid_input: "adaptive_branching budget = B is below one chain per
///      prompt (C evaluations over N steps)"); branching >= 2; decay in [0, 1]; gain_weight >= 0.
/// @post every level in [0, S]; the levels' evaluations sum to at most budget x trees.
struct adaptive_branching {
  std::vector<int> split_steps = {0, 3, 6, 9};      ///< the envelope's splits
  int branching = 2;                                ///< children at a split that branches
  int budget = 120;                                 ///< denoiser evaluations per prompt per iteration, on average
  double gain_weight = 1.0;                         ///< weight of |gain since the last visit| beside the spread
  double decay = 0.5;                               ///< share of a prompt's past spread kept at each visit
  std::map<std::int64_t, prompt_record> prompts{};  ///< state: one record per prompt seen

  /// The envelope: split_schedule{split_steps, {branching}}(steps).
  tree_plan operator()(int steps) const {
    require(branching >= 2, "adaptive_branching branching ", branching, " is below 2");
    return split_schedule{.split_steps = split_steps, .branching = {branching}}(steps);
  }

  /// The evaluations of one tree of `plan` (the envelope, as shaped) at each level 0..S.
  /// Example: the dense envelope over 20 steps -> {20, 30, 53, 102, 203}.
  [[nodiscard]] static std::vector<std::int64_t> level_costs(const tree_plan& plan) {
    const std::vector<int> splits = plan.branching_steps();
    std::vector<std::int64_t> costs;
    for (std::size_t level = 0; level <= splits.size(); ++level) {
      tree_plan shaped = plan;
      for (std::size_t i = 0; i + level < splits.size(); ++i) shaped.branching[static_cast<std::size_t>(splits[i])] = 1;
      costs.push_back(shaped.evaluations());
    }
    return costs;
  }

  /// Each tree's level this iteration (trees: every tree of the iteration, in order).
  [[nodiscard]] std::vector<int> split_levels(const tree_plan& plan, std::span<const tree_info> trees) const {
    const std::vector<std::int64_t> costs = level_costs(plan);
    require(budget >= costs.front(), "adaptive_branching budget = ", budget, " is below one chain per prompt (",
            costs.front(), " evaluations over ", plan.steps, " steps)");
    const int top = static_cast<int>(costs.size()) - 1;
    std::vector<double> priority;
    for (const tree_info& info : trees) {
      const auto found = prompts.find(info.prompt);
      priority.push_back(found == prompts.end() ? std::numeric_limits<double>::infinity()
                                                : found->second.spread + gain_weight * std::abs(found->second.gain));
    }
    std::vector<int> levels(trees.size(), 0);
    std::int64_t left = static_cast<std::int64_t>(budget - costs.front()) * static_cast<std::int64_t>(trees.size());
    for (;;) {
      std::size_t best = trees.size();
      for (std::size_t t = 0; t < trees.size(); ++t) {
        if (levels[t] == top) continue;
        const auto at = static_cast<std::size_t>(levels[t]);
        if (costs[at + 1] - costs[at] > left) continue;
        if (best == trees.size() || priority[t] > priority[best] ||
            (priority[t] == priority[best] && levels[t] < levels[best]))
          best = t;
      }
      if (best == trees.size()) return levels;
      const auto at = static_cast<std::size_t>(levels[best]);
      left -= costs[at + 1] - costs[at];
      ++levels[best];
    }
  }

  /// Updates the records from an iteration: `scores` every leaf's reward of `forest` (leaves() order), `kept` the
  /// trees whose rewards are all finite (scored_leaves). Only sampled leaves count.
  void observe(const rollout_tree& forest, std::span<const double> scores, std::span<const std::int32_t> kept) {
    require(decay >= 0.0 && decay <= 1.0, "adaptive_branching decay ", decay, " is not in [0, 1]");
    const std::span<const std::int32_t> leaves = forest.leaves();
    const std::int32_t per_tree = forest.leaves_per_tree();
    for (const std::int32_t t : kept) {
      std::vector<double> sampled;
      for (std::int32_t i = t * per_tree; i < (t + 1) * per_tree; ++i)
        if (forest.sampled(leaves[static_cast<std::size_t>(i)])) sampled.push_back(scores[static_cast<std::size_t>(i)]);
      double mean = 0.0, squares = 0.0;
      for (const double r : sampled) mean += r;
      mean /= static_cast<double>(sampled.size());
      for (const double r : sampled) squares += (r - mean) * (r - mean);
      const double spread = std::sqrt(squares / static_cast<double>(sampled.size()));
      prompt_record& record = prompts[forest.info(t).prompt];
      record.gain = record.visits > 0 ? mean - record.mean : 0.0;
      record.spread = record.visits > 0 ? decay * record.spread + (1.0 - decay) * spread : spread;
      record.mean = mean;
      record.visits += 1;
    }
  }

  /// The records as {"prompt.<id>": {visits, spread, mean, gain}} (concept Stateful).
  [[nodiscard]] component_state save_state() const {
    component_state state;
    for (const auto& [prompt, r] : prompts)
      state["prompt." + std::to_string(prompt)] = {r.visits, r.spread, r.mean, r.gain};
    return state;
  }
  /// Replaces the records with what save_state returned.
  /// @pre every key is "prompt.<integer id>" with 4 finite values (else invalid_input naming it, nothing changed).
  void load_state(const component_state& state) {
    std::map<std::int64_t, prompt_record> loaded;
    for (const auto& [key, values] : state) {
      const std::int64_t prompt = prompt_state_key(key, "adaptive_branching");
      require(
          values.size() == 4 && std::all_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); }),
          "adaptive_branching state ", key, " must hold 4 finite values (visits, spread, mean, gain)");
      loaded[prompt] = {.visits = values[0], .spread = values[1], .mean = values[2], .gain = values[3]};
    }
    prompts = std::move(loaded);
  }

  friend bool operator==(const adaptive_branching&, const adaptive_branching&) = default;

  // Its key in configs and on the command line, what it is for, and the parameters a config sets
  // (core/policy_list.hpp, core/parameters.hpp).
  static constexpr std::string_view name = "adaptive_branching",
                                    summary = "splits per prompt from its reward spread, under an evaluation budget";
  static constexpr auto parameters() {
    return std::tuple{
        parameter("split_steps", &adaptive_branching::split_steps, "the envelope's split steps, ascending",
                  rules::non_empty{.low = 0}),
        parameter("branching", &adaptive_branching::branching, "children at a split that branches", rules::at_least{2}),
        parameter("budget", &adaptive_branching::budget, "denoiser evaluations per prompt per iteration, on average",
                  rules::at_least{1}),
        parameter("gain_weight", &adaptive_branching::gain_weight, "weight of the reward's move since the last visit",
                  rules::in_range{.low = 0, .high = 1e3}),
        parameter("decay", &adaptive_branching::decay, "share of a prompt's past spread kept per visit",
                  rules::unit_interval{})};
  }
};

/// Leaves the first S - level splits of tree t of `forest` out (their nodes continue as chains through their first
/// child): the shape adaptive_branching gave the tree.
/// Example: the dense envelope, level 2 -> the splits at steps 0 and 3 continue as chains, those at 6 and 9 branch:
///   4 sampled leaves, 53 evaluations.
/// @pre 0 <= level <= S; the tree has nothing left out yet.
inline void apply_split_level(rollout_tree& forest, std::int32_t t, int level) {
  const std::vector<int> splits = forest.plan().branching_steps();
  require(level >= 0 && level <= static_cast<int>(splits.size()), "split level ", level, " is not in [0, ",
          splits.size(), "]");
  for (std::size_t i = 0; i + static_cast<std::size_t>(level) < splits.size(); ++i) {
    std::vector<std::int32_t> later;
    const node_range at = forest.nodes_at_depth(t, splits[i]);
    for (std::int32_t n = at.begin; n < at.end; ++n)
      if (forest.sampled(n)) {
        const node_range children = forest.children(n);
        for (std::int32_t c = children.begin + 1; c < children.end; ++c) later.push_back(c);
      }
    forest.leave_out(later);
  }
}

}  // namespace branchgrpo
