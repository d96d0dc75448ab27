#pragma once
// Shared fixtures of the micro-benchmarks: forests of T dense trees (K = 2: 16 leaves, K = 3: 81 leaves) over
// 20 steps with keyed log-probs and leaf rewards, so every benchmark sees the same, reproducible data.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"

namespace branchgrpo::bench {

inline constexpr int steps = 20;

/// The benchmarked tree sizes, {trees, branching}: 1 x 16 x 20 up to 64 x 81 x 20 (docs/performance.md).
inline void tree_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"trees", "K"});
  for (int k : {2, 3})
    for (int trees : {1, 8, 64}) b->Args({trees, k});
}

/// `count` keyed N(0, 1) doubles (stream auxiliary, so they never collide with a rollout's draws).
inline std::vector<double> keyed_values(std::size_t count, std::uint32_t node, double scale, double offset) {
  std::vector<double> out(count);
  fill_keyed_normal(
      {.seed = 5, .iteration = 0, .tree = 0xBE0C0000u, .node = node, .step = 0, .stream = noise_stream::auxiliary},
      out);
  for (double& v : out) v = offset + scale * v;
  return out;
}

/// T dense trees of branching K over 20 steps, plan optionally reshaped; edge log-probs ~ N(-1.4, 0.01^2)
/// (what a rollout gives for a ~1e4-element latent), roots 0.
inline rollout_tree forest(std::int32_t trees, int k, const tree_plan* plan = nullptr) {
  rollout_tree tree(plan ? *plan : split_schedule::dense(k)(steps), numbered_trees(trees));
  const std::vector<double> values = keyed_values(static_cast<std::size_t>(tree.node_count()), 1, 0.01, -1.4);
  auto log_probs = tree.mutable_log_probs();
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    log_probs[static_cast<std::size_t>(n)] = tree.is_root(n) ? 0.0 : values[static_cast<std::size_t>(n)];
  return tree;
}

/// Leaf rewards in [0, 1]-ish: 0.5 + 0.2 N(0, 1).
inline std::vector<double> leaf_rewards(const rollout_tree& tree) {
  return keyed_values(static_cast<std::size_t>(tree.leaf_count()), 2, 0.2, 0.5);
}

/// "64 x 16 x 20" in the benchmark's label; nodes per second as items, node doubles as bytes.
inline void tree_counters(benchmark::State& state, const rollout_tree& tree) {
  state.SetLabel(std::to_string(tree.tree_count()) + " x " + std::to_string(tree.leaves_per_tree()) + " x " +
                 std::to_string(tree.steps()) + ", " + std::to_string(tree.node_count()) + " nodes");
  state.SetItemsProcessed(state.iterations() * tree.node_count());
  state.SetBytesProcessed(state.iterations() * tree.node_count() * static_cast<std::int64_t>(sizeof(double)));
}

}  // namespace branchgrpo::bench
