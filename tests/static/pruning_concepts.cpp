// Static tier: each pruner models Pruner (and RolloutShaper where it shapes); wrong types do not.
#include <concepts>
#include <tuple>

#include "branchgrpo/pruning.hpp"

namespace {

using namespace branchgrpo;

struct wrong_return {  // returns a vector of int, not an edge_mask
  std::vector<int> operator()(const rollout_tree&, const prune_context&) const { return {}; }
};
struct wrong_arguments {  // takes the plan instead of the tree
  edge_mask operator()(const tree_plan&, const prune_context&) const { return {}; }
};
struct mutable_call {  // call operator not const
  edge_mask operator()(const rollout_tree&, const prune_context&) { return {}; }
};
struct not_copyable {
  not_copyable() = default;
  not_copyable(const not_copyable&) = delete;
  not_copyable& operator=(const not_copyable&) = delete;
  edge_mask operator()(const rollout_tree&, const prune_context&) const { return {}; }
};
struct shape_returns_int {  // a pruner whose shape has the wrong result type
  edge_mask operator()(const rollout_tree&, const prune_context&) const { return {}; }
  int shape(const tree_plan&, int) const { return 0; }
};
struct shape_only {  // shapes but is no pruner
  tree_plan shape(const tree_plan& plan, int) const { return plan; }
};

static_assert(Pruner<depth_window>);
static_assert(Pruner<parent_top_k>);
static_assert(Pruner<extreme>);
static_assert(Pruner<sde_window>);
static_assert(RolloutShaper<sde_window>);
static_assert(!RolloutShaper<depth_window>);
static_assert(!RolloutShaper<parent_top_k>);
static_assert(!RolloutShaper<extreme>);
static_assert(std::regular<depth_window> && std::regular<parent_top_k> && std::regular<extreme> &&
              std::regular<sde_window>);

static_assert(!Pruner<int>);
static_assert(!Pruner<wrong_return>);
static_assert(!Pruner<wrong_arguments>);
static_assert(!Pruner<mutable_call>);
static_assert(!Pruner<not_copyable>);
static_assert(Pruner<shape_returns_int> && !RolloutShaper<shape_returns_int>);
static_assert(!Pruner<shape_only> && !RolloutShaper<shape_only>);

// Combinators: all_of shapes when any member shapes; active_for when its pruner does.
static_assert(Pruner<all_of<depth_window, extreme>>);
static_assert(!RolloutShaper<all_of<depth_window, extreme>>);
static_assert(RolloutShaper<all_of<depth_window, sde_window>>);
static_assert(RolloutShaper<all_of<sde_window>>);
static_assert(std::regular<all_of<depth_window, sde_window>>);
static_assert(std::same_as<decltype(prune_all(depth_window{}, extreme{})), all_of<depth_window, extreme>>);
static_assert(std::same_as<decltype(all_of{std::tuple{extreme{}, sde_window{}}}), all_of<extreme, sde_window>>);
static_assert(Pruner<active_for<parent_top_k>> && !RolloutShaper<active_for<parent_top_k>>);
static_assert(RolloutShaper<active_for<sde_window>>);
static_assert(RolloutShaper<active_for<all_of<extreme, sde_window>>>);
static_assert(std::same_as<decltype(active_for{extreme{}, 0.5}), active_for<extreme>>);
static_assert(std::regular<active_for<extreme>>);

// Members that are not pruners are rejected by all_of, active_for and prune_all.
template <class... Ps>
concept can_combine = requires {
  typename all_of<Ps...>;
  sizeof(all_of<Ps...>);
};
template <class P>
concept can_activate = requires {
  sizeof(active_for<P>);
};
template <class... Ps>
concept can_prune_all = requires(Ps... pruners) {
  prune_all(pruners...);
};
static_assert(can_combine<extreme> && can_activate<extreme> && can_prune_all<extreme, depth_window>);
static_assert(!can_combine<extreme, int>);
static_assert(!can_combine<>);
static_assert(!can_activate<wrong_return>);
static_assert(!can_prune_all<extreme, wrong_arguments>);
static_assert(!can_prune_all<>);

// shape_plan accepts any pruner and returns a plan.
static_assert(std::same_as<decltype(shape_plan(extreme{}, tree_plan{}, 0)), tree_plan>);
static_assert(std::same_as<decltype(shape_plan(sde_window{}, tree_plan{}, 0)), tree_plan>);

}  // namespace
