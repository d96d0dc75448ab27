#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// pruner.shape(plan, iteration) when the pruner shapes rollouts, else the plan unchanged.
/// Example: shape_plan(sde_window{.width = 1}, plan, 0) == sde_window{.width = 1}.shape(plan, 0);
///          shape_plan(extreme{}, plan, 7) == plan.
template <Pruner P>
tree_plan shape_plan(const P& pruner, tree_plan plan, int iteration) {
  if constexpr (RolloutShaper<P>)
    return pruner.shape(plan, iteration);
  else
    return plan;
}

/// pruner.rollout_cut(plan, iteration) when the pruner cuts rollouts, else no cut.
/// Example: rollout_cut_of(value_prune{}, dense plan, 0) == rollout_cut{.step = 9, .keep = 4};
///          rollout_cut_of(extreme{}, plan, 0).active() == false.
template <Pruner P>
rollout_cut rollout_cut_of(const P& pruner, const tree_plan& plan, int iteration) {
  if constexpr (RolloutCutter<P>)
    return pruner.rollout_cut(plan, iteration);
  else
    return {};
}

namespace detail {
/// The one active cut among `cuts` (none when none is active; else invalid_input: a rollout is cut once).
inline rollout_cut only_cut(std::span<const rollout_cut> cuts, const char* combinator) {
  rollout_cut out;
  for (const rollout_cut& cut : cuts)
    if (cut.active()) {
      require(!out.active(), combinator, " holds two value pruners (steps ", out.step, " and ", cut.step,
              "): a rollout is cut at one step");
      out = cut;
    }
  return out;
}

/// mask &= other, after checking that member `member` of `combinator` returned one flag per node.
inline void intersect_masks(edge_mask& mask, const edge_mask& other, const char* combinator, std::size_t member) {
  require(other.size() == mask.size(), combinator, " member ", member, " returned ", other.size(), " flags for ",
          mask.size(), " nodes");
  for (std::size_t n = 0; n < mask.size(); ++n) mask[n] = mask[n] && other[n] ? 1 : 0;
}
}  // namespace detail

/// Every pruner at once: an edge is trained when every member keeps it (the masks are intersected).
/// It shapes rollouts when any member does, applying the members' shapes in order.
/// Example: tree {steps 4, splits {0, 2}, K 2} (nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12), leaf rewards
/// {0.1, 0.5, 0.9, 0.3}: extreme{} keeps {0, 1,1, 1,1, 1,0,1,0, 1,0,1,0}, depth_window{.depths = {0}}
/// keeps {0, 0,0, 1,1, 1,1,1,1, 1,1,1,1}; prune_all(extreme{}, depth_window{.depths = {0}}) keeps
/// {0, 0,0, 1,1, 1,0,1,0, 1,0,1,0}.
/// @pre at least one member. @post mask[n] <= every member's mask[n].
template <Pruner First, Pruner... Rest>
struct all_of {
  std::tuple<First, Rest...> pruners;

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    edge_mask mask(static_cast<std::size_t>(tree.node_count()), 1);
    std::size_t member = 0;
    std::apply([&](const auto&... pruner) { (intersect(mask, pruner(tree, context), member++), ...); }, pruners);
    return mask;
  }

  tree_plan shape(const tree_plan& plan, int iteration) const
      requires(RolloutShaper<First> || ... || RolloutShaper<Rest>) {
    tree_plan shaped = plan;
    std::apply([&](const auto&... pruner) { ((shaped = shape_plan(pruner, std::move(shaped), iteration)), ...); },
               pruners);
    return shaped;
  }

  branchgrpo::rollout_cut rollout_cut(const tree_plan& plan, int iteration) const
      requires(RolloutCutter<First> || ... || RolloutCutter<Rest>) {
    const std::vector<branchgrpo::rollout_cut> cuts = std::apply(
        [&](const auto&... pruner) {
          return std::vector<branchgrpo::rollout_cut>{rollout_cut_of(pruner, plan, iteration)...};
        },
        pruners);
    return detail::only_cut(cuts, "all_of");
  }

  friend bool operator==(const all_of&, const all_of&) = default;

 private:
  static void intersect(edge_mask& mask, const edge_mask& other, std::size_t member) {
    detail::intersect_masks(mask, other, "all_of", member);
  }
};

template <class First, class... Rest>
all_of(std::tuple<First, Rest...>) -> all_of<First, Rest...>;

/// all_of over the given pruners: prune_all(depth_window{}, extreme{.b = 2}).
template <Pruner First, Pruner... Rest>
all_of<First, Rest...> prune_all(First first, Rest... rest) {
  return all_of<First, Rest...>{std::tuple<First, Rest...>(std::move(first), std::move(rest)...)};
}

/// all_of over a run-time list of pruners of one type (e.g. a run config's list of any_pruner_choice): an edge is
/// trained when every member keeps it; an empty list keeps every SDE edge. It shapes rollouts by applying the
/// members' shapes in order.
/// Example: all_in<parent_top_k>{{{.k = 1}}} keeps what parent_top_k{.k = 1} keeps; all_in<keep_all>{} keeps
/// trainable_edges(tree).
/// @post mask[n] <= trainable_edges(tree)[n] and <= every member's mask[n].
template <Pruner P>
struct all_in {
  std::vector<P> pruners = {};

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    edge_mask mask = trainable_edges(tree);
    for (std::size_t i = 0; i < pruners.size(); ++i)
      detail::intersect_masks(mask, pruners[i](tree, context), "all_in", i);
    return mask;
  }

  tree_plan shape(const tree_plan& plan, int iteration) const {
    tree_plan shaped = plan;
    for (const P& pruner : pruners) shaped = shape_plan(pruner, std::move(shaped), iteration);
    return shaped;
  }

  branchgrpo::rollout_cut rollout_cut(const tree_plan& plan, int iteration) const {
    std::vector<branchgrpo::rollout_cut> cuts;
    for (const P& pruner : pruners) cuts.push_back(rollout_cut_of(pruner, plan, iteration));
    return detail::only_cut(cuts, "all_in");
  }

  friend bool operator==(const all_in&, const all_in&) = default;
};

/// Applies `pruner` for the first `fraction` of the run: while iteration < fraction * total_iterations;
/// afterwards it keeps every SDE edge (the official code's pruning_step_ratio, which prunes while
/// iteration <= int(total * ratio)). shape is always forwarded: shape(plan, iteration) does not see the
/// run length, and a rollout that stays cheap after pruning stops is still a valid rollout.
/// Example: active_for{parent_top_k{}, 0.5} with total_iterations 10 prunes at iterations 0..4 and keeps
/// every SDE edge from iteration 5 on; fraction 0 never prunes, fraction 1 always does.
/// @pre fraction in [0, 1]; context.total_iterations >= 1, context.iteration >= 0.
/// @post mask[n] == 1 only for a non-root edge.
template <Pruner P>
struct active_for {
  P pruner;
  double fraction = 1.0;

  [[nodiscard]] bool active(const prune_context& context) const {
    require(fraction >= 0.0 && fraction <= 1.0, "active_for fraction ", fraction, " is not in [0, 1]");
    require(context.total_iterations >= 1, "active_for total_iterations ", context.total_iterations, " is below 1");
    require(context.iteration >= 0, "active_for iteration ", context.iteration, " is negative");
    return static_cast<double>(context.iteration) < fraction * static_cast<double>(context.total_iterations);
  }

  edge_mask operator()(const rollout_tree& tree, const prune_context& context) const {
    return active(context) ? pruner(tree, context) : trainable_edges(tree);
  }

  tree_plan shape(const tree_plan& plan, int iteration) const requires RolloutShaper<P> {
    return pruner.shape(plan, iteration);
  }

  /// Forwarded always, like shape: a value pruner keeps cutting the rollout after its mask stops acting.
  branchgrpo::rollout_cut rollout_cut(const tree_plan& plan, int iteration) const requires RolloutCutter<P> {
    return pruner.rollout_cut(plan, iteration);
  }

  friend bool operator==(const active_for&, const active_for&) = default;
};

template <class P>
active_for(P) -> active_for<P>;
template <class P>
active_for(P, double) -> active_for<P>;

}  // namespace branchgrpo
