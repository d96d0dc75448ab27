#pragma once
// A tree plan: the level-uniform shape every topology policy produces. All nodes at one denoising step have
// the same number of children and their outgoing edges the same kind, which is true of every rollout
// structure used by DanceGRPO, Flow-GRPO(-Fast), MixGRPO and BranchGRPO.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/core/parameters.hpp"

namespace branchgrpo {

/// How a transition is sampled: SDE edges draw noise and are trainable; ODE edges are deterministic. A skip
/// edge costs no denoiser call: the ODE edge before it already integrated past its step (a solver's larger step,
/// MixGRPO-Flash), so it carries its parent's latent unchanged. Only SDE edges are trained.
enum class edge_kind : std::uint8_t { sde, ode, skip };

inline const char* to_string(edge_kind kind) {
  return kind == edge_kind::sde ? "sde" : kind == edge_kind::ode ? "ode" : "skip";
}

/// How the ODE edges of a plan are integrated (rollout/engine.hpp, schedule/steppers.hpp ode_step):
///   euler          one Euler step per ODE edge (first order); the default of every topology
///   dpm_solver_2m  DPM-Solver++(2M): second order from the data prediction of the previous evaluated ODE step of
///                  the same deterministic run (MixGRPO-Flash), first order where there is none
enum class ode_solver : std::uint8_t { euler, dpm_solver_2m };

inline constexpr std::array<enum_choice<ode_solver>, 2> ode_solver_names = {
    {{"euler", ode_solver::euler}, {"dpm_solver_2m", ode_solver::dpm_solver_2m}}};
constexpr const auto& enum_choices(ode_solver) { return ode_solver_names; }

/// Leaves of one tree are limited to 2^24 so that node indices and noise keys stay in 32 bits.
inline constexpr std::int64_t max_leaves_per_tree = std::int64_t{1} << 24;

/// The shape of one rollout tree over `steps` denoising transitions.
/// Example: steps 3, roots 1, branching {2, 1, 2}, kinds {sde, ode, sde}: 1 root, 2 nodes after step 0,
/// 2 after step 1, 4 leaves after step 2.
/// Example: steps 4, branching {2, 1, 1, 1}, kinds {sde, ode, skip, ode}: 9 nodes; evaluations 1 + 2 + 2 = 5 (the
/// skip step's 2 nodes are not evaluated), the ODE edge at step 1 integrates from sigma(1) to sigma(3).
struct tree_plan {
  int steps = 0;                       ///< denoising transitions from the root (step 0) to the leaves (step `steps`)
  int roots = 1;                       ///< independent roots per tree (sequential sampling without a shared root)
  std::vector<int> branching;          ///< children per node at each step, size `steps`, each >= 1
  std::vector<edge_kind> kinds;        ///< kind of the edges leaving step s, size `steps`; a split is always SDE
  ode_solver ode = ode_solver::euler;  ///< how the ODE edges are integrated

  friend bool operator==(const tree_plan&, const tree_plan&) = default;

  /// The number of nodes at step s (s in [0, steps]) of one tree.
  [[nodiscard]] std::int64_t node_count_at_step(int s) const {
    std::int64_t count = roots;
    for (int i = 0; i < s; ++i) count *= branching[static_cast<std::size_t>(i)];
    return count;
  }
  /// Leaves of one tree: the nodes at step `steps`.
  [[nodiscard]] std::int64_t leaf_count() const { return node_count_at_step(steps); }
  /// Nodes of one tree, roots and leaves included.
  [[nodiscard]] std::int64_t node_count() const {
    std::int64_t total = 0;
    for (int s = 0; s <= steps; ++s) total += node_count_at_step(s);
    return total;
  }
  /// Denoiser evaluations of one tree: one per node that has children, but for the nodes of skip steps.
  [[nodiscard]] std::int64_t evaluations() const {
    std::int64_t total = 0;
    for (int s = 0; s < steps; ++s)
      if (static_cast<std::size_t>(s) >= kinds.size() || kinds[static_cast<std::size_t>(s)] != edge_kind::skip)
        total += node_count_at_step(s);
    return total;
  }
  /// The step an ODE edge leaving step s integrates to: the first later step that is not a skip step (or `steps`).
  /// Example: kinds {sde, ode, skip, ode} -> ode_target(1) == 3, ode_target(3) == 4.
  /// @pre 0 <= s < steps.
  [[nodiscard]] int ode_target(int s) const {
    int target = s + 1;
    while (target < steps && kinds[static_cast<std::size_t>(target)] == edge_kind::skip) ++target;
    return target;
  }
  /// Edges of one tree: one into every node but the roots.
  [[nodiscard]] std::int64_t edge_count() const { return node_count() - roots; }
  /// The tree layer of the edges leaving step s: how many splits (steps with branching > 1) lie before s, i.e.
  /// above their parents. Plans are level-uniform, so every edge of one step has the same layer.
  /// Example: branching {2, 1, 2, 1} -> layer(0) == 0, layer(1) == layer(2) == 1, layer(3) == 2.
  /// @pre 0 <= s <= steps.
  [[nodiscard]] int layer(int s) const {
    require(s >= 0 && s <= steps, "step ", s, " is outside [0, ", steps, "]");
    int splits = 0;
    for (int i = 0; i < s; ++i) splits += branching[static_cast<std::size_t>(i)] > 1 ? 1 : 0;
    return splits;
  }
  /// The steps whose nodes branch (more than one child per node), ascending.
  /// Example: branching {2, 1, 2} -> {0, 2}.
  [[nodiscard]] std::vector<int> branching_steps() const {
    std::vector<int> splits;
    for (int s = 0; s < steps; ++s)
      if (branching[static_cast<std::size_t>(s)] > 1) splits.push_back(s);
    return splits;
  }
};

/// Throws invalid_input naming the first inconsistency of `plan`.
/// @post 1 <= plan.steps <= max_steps; plan.leaf_count() <= max_leaves_per_tree.
inline void validate(const tree_plan& plan) {
  require(plan.steps >= 1, "a tree needs at least 1 step, got ", plan.steps);
  require(plan.steps <= max_steps, "at most ", max_steps, " steps are supported, got ", plan.steps);
  require(plan.roots >= 1, "a tree needs at least 1 root, got ", plan.roots);
  require(plan.branching.size() == static_cast<std::size_t>(plan.steps), "branching has ", plan.branching.size(),
          " entries for ", plan.steps, " steps");
  require(plan.kinds.size() == static_cast<std::size_t>(plan.steps), "edge kinds have ", plan.kinds.size(),
          " entries for ", plan.steps, " steps");
  std::int64_t count = plan.roots;
  require(count <= max_leaves_per_tree, "a tree with ", count, " roots exceeds 2^24 leaves");
  for (int s = 0; s < plan.steps; ++s) {
    const int factor = plan.branching[static_cast<std::size_t>(s)];
    require(factor >= 1, "branching factor ", factor, " at step ", s, " is below 1");
    const edge_kind kind = plan.kinds[static_cast<std::size_t>(s)];
    require(factor == 1 || kind == edge_kind::sde, "split at step ", s,
            " must be an SDE edge: ODE children would be identical");
    // A skip step continues the integration of the ODE edge before it; after an SDE edge or at a root there is none.
    require(kind != edge_kind::skip || (s > 0 && plan.kinds[static_cast<std::size_t>(s) - 1] != edge_kind::sde),
            "skip step ", s, " does not follow an ODE step: only an ODE edge can integrate past it");
    require(count * factor <= max_leaves_per_tree, "tree exceeds 2^24 leaves after step ", s, " (", count, " x ",
            factor, ")");
    count *= factor;
  }
}

}  // namespace branchgrpo
