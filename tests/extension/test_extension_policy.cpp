// docs/extending.md, "A component policy": a toy fusion added through exactly the page's steps: its struct (one
// header's worth, here in this file) and one list entry (extended_policy_list), with no edit of the library.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "toy_iteration.hpp"

using namespace branchgrpo;

namespace {

// Step 1: the policy. Pessimistic fusion: a node's reward is the worst leaf reward under it.
// Example: the 7-node binary tree (leaves 3, 4 under 1; 5, 6 under 2), leaf rewards {1, 3, 2, 6} ->
//   {1, 1, 2, 1, 3, 2, 6}.
struct min_reward {
  std::vector<double> operator()(const rollout_tree& tree, std::span<const double> leaf_rewards) const {
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      const node_range under = tree.leaf_positions_under(n);
      fused[static_cast<std::size_t>(n)] =
          *std::min_element(leaf_rewards.begin() + under.begin, leaf_rewards.begin() + under.end);
    }
    return fused;
  }
  friend bool operator==(const min_reward&, const min_reward&) = default;
  static constexpr std::string_view name = "min_reward", summary = "the worst leaf below (a toy)";
};
static_assert(Fusion<min_reward>);

// Step 2: the one list entry.
using my_fusions = extended_policy_list<fusion_policies, min_reward>;

}  // namespace

TEST_CASE("extension: a toy fusion through one list entry is chosen by name and trains", "[extension]") {
  const rollout_tree tree(split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), {{.key = 0, .prompt = 0}});
  const std::vector<double> leaves = {1, 3, 2, 6};
  CHECK(min_reward{}(tree, leaves) == std::vector<double>{1, 1, 2, 1, 3, 2, 6});
  // By name, as a run config's [fusion] kind = "min_reward" (config::read_policy) or `policies` would.
  any_policy<my_fusions> chosen;
  chosen.policy = make_policy<my_fusions>("min_reward");
  CHECK(chosen.name() == "min_reward");
  CHECK(chosen(tree, leaves) == std::vector<double>{1, 1, 2, 1, 3, 2, 6});
  CHECK(describe_policies<my_fusions>().back().name == "min_reward");
  // In a recipe: one iteration of branch with the toy fusion trains every edge of 4 dense trees.
  const auto base = branch_method();
  method recipe{base.topology, base.stepper, base.correlator, chosen, base.normalizer, base.pruner, base.objective};
  auto policy = make_toy_policy(7);
  const iteration_stats stats = testing::one_toy_iteration(recipe, policy);
  CHECK(stats.edges_trained == 218 * 4);
  CHECK(std::isfinite(stats.loss));
}
