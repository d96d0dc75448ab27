// Custom components: a fusion and a pruner written outside the library, plugged into a training recipe.
// Each family is a concept (fusion/concept.hpp, pruning/concept.hpp); any regular struct with the right call
// operator is accepted, checked at compile time, with no base class or registration.
// Run: build/examples/example_custom_policy   (exit status 1 when a checked fact does not hold)
#include <branchgrpo/branchgrpo.hpp>
#include <branchgrpo/toy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <span>
#include <vector>

namespace bg = branchgrpo;

/// Fusion: a node's reward is the median of the leaf rewards under it (robust to one outlier leaf, where the
/// paper's mean is not). Example: root 0; 1, 2; leaves 3, 4 under 1 and 5, 6 under 2; leaf rewards
/// {1, 3, 2, 6} -> {2.5, 2, 4, 1, 3, 2, 6}.
struct leaf_median {
  std::vector<double> operator()(const bg::rollout_tree& tree, std::span<const double> leaf_rewards) const {
    bg::require(leaf_rewards.size() == static_cast<std::size_t>(tree.leaf_count()), "leaf_median got ",
                leaf_rewards.size(), " rewards for ", tree.leaf_count(), " leaves");
    for (std::size_t i = 0; i < leaf_rewards.size(); ++i)
      bg::require(std::isfinite(leaf_rewards[i]), "leaf_median: leaf reward ", i, " is ", leaf_rewards[i]);
    std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
    std::vector<double> under;
    for (std::int32_t n = 0; n < tree.node_count(); ++n) {
      const bg::node_range leaves = tree.leaf_positions_under(n);  // a contiguous run of leaf positions
      under.assign(leaf_rewards.begin() + leaves.begin, leaf_rewards.begin() + leaves.end);
      std::sort(under.begin(), under.end());
      const std::size_t half = under.size() / 2;
      fused[static_cast<std::size_t>(n)] = under.size() % 2 ? under[half] : (under[half - 1] + under[half]) / 2;
    }
    return fused;
  }
  friend bool operator==(const leaf_median&, const leaf_median&) = default;
};

/// Pruner: train only the SDE edges whose |advantage| exceeds tau (edges whose reward is close to the mean of
/// their depth carry little signal).
struct advantage_threshold {
  double tau = 0.5;

  bg::edge_mask operator()(const bg::rollout_tree& tree, const bg::prune_context& context) const {
    bg::require(std::isfinite(tau) && tau >= 0, "advantage_threshold tau must be finite and >= 0, got ", tau);
    bg::edge_mask mask = bg::trainable_edges(tree);  // non-root SDE edges
    for (std::size_t n = 0; n < mask.size(); ++n)
      if (std::abs(context.advantages[n]) <= tau) mask[n] = 0;
    return mask;
  }
  friend bool operator==(const advantage_threshold&, const advantage_threshold&) = default;
};

static_assert(bg::Fusion<leaf_median>);
static_assert(bg::Pruner<advantage_threshold>);
static_assert(!bg::Fusion<advantage_threshold>);  // the wrong call signature is rejected at compile time

int main() {
  bool ok = true;
  const auto check = [&ok](bool fact, const char* what) {
    if (!fact) std::cerr << "FAILED: " << what << '\n';
    ok = ok && fact;
  };

  // The worked example of leaf_median, on the 7-node tree: splits at steps 0 and 1 into 2, over 2 steps.
  const bg::rollout_tree small(bg::split_schedule{.split_steps = {0, 1}, .branching = {2}}(2), bg::numbered_trees(1));
  const std::vector<double> median = leaf_median{}(small, std::vector<double>{1, 3, 2, 6});
  check(median == std::vector<double>{2.5, 2, 4, 1, 3, 2, 6}, "leaf_median of {1, 3, 2, 6}");

  // The recipe: BranchGRPO's tree, stepper, noise and normalizer, with the two custom components.
  bg::method recipe{bg::split_schedule::dense(),       // topology: 16 leaves, 203 evaluations
                    bg::dance_sde{},                   // stepper
                    bg::correlated{.s = 4.0},          // noise at the splits (paper Eq. 2)
                    leaf_median{},                     // fusion: ours
                    bg::depth_wise{},                  // advantages (paper Eq. 4)
                    advantage_threshold{.tau = 0.5}};  // pruning: ours
  auto policy = bg::make_toy_policy(7);
  bg::mode_reward<> reward;
  bg::host_backend backend;
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3, 4, 5, 6, 7};
  constexpr int iterations = 30;
  double first = 0, last = 0;
  std::int64_t trained = 0, trainable = 0;
  for (int i = 0; i < iterations; ++i) {
    const bg::iteration_stats s =
        bg::train_iteration(backend, policy, reward, recipe, bg::shifted_linear_schedule(20), bg::toy_latent_shape(),
                            prompts, i, {.seed = 11, .total_iterations = iterations});
    if (i < 5) first += s.reward_mean / 5;
    if (i >= iterations - 5) last += s.reward_mean / 5;
    trained += s.edges_trained;
    trainable += s.edges;  // every edge of the dense tree is SDE
  }
  std::cout << std::fixed << std::setprecision(3) << "leaf_median + advantage_threshold: trained "
            << static_cast<double>(trained) / static_cast<double>(trainable) << " of the edges; mean reward, first 5 "
            << "iterations " << first << ", last 5 " << last << ", gain " << last - first << '\n';
  check(trained > 0 && trained < trainable, "advantage_threshold pruned some edges, not all");
  check(last - first > 0.2, "the mean reward rose by more than 0.2");
  return ok ? 0 : 1;
}
