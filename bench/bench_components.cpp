// Micro-benchmarks of every component family on the host (docs/performance.md):
//   topology build, each noise correlator, each fusion, each normalizer, each pruner (value: on the tree it cut), one
//   SDE step with its log-prob, keyed noise fill, and the method path "fusion + normalization + pruning" of 64 x 16 x
//   20 (target <= 50 us).
// Tree sizes: T trees x L leaves x 20 steps, T in {1, 8, 64}, L = 16 (K = 2) or 81 (K = 3), dense splits.
// Items are nodes (tree policies), elements (noise, SDE step); bytes are the doubles read and written once.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "branchgrpo/branchgrpo.hpp"

namespace branchgrpo::bench {
namespace {

// --- Topology: plan + forest build -----------------------------------------------------------------------------

void BM_topology_dense(benchmark::State& state) {
  const auto trees = static_cast<std::int32_t>(state.range(0));
  const auto k = static_cast<int>(state.range(1));
  const split_schedule topology = split_schedule::dense(k);
  for (auto _ : state) {
    rollout_tree tree(topology(steps), numbered_trees(trees));
    benchmark::DoNotOptimize(tree.node_count());
  }
  tree_counters(state, rollout_tree(topology(steps), numbered_trees(trees)));
}
BENCHMARK(BM_topology_dense)->Apply(tree_sizes);

void BM_topology_sequential(benchmark::State& state) {
  const auto trees = static_cast<std::int32_t>(state.range(0));
  const sequential topology{.group_size = 16, .shared_root = true};
  for (auto _ : state) {
    rollout_tree tree(topology(steps), numbered_trees(trees));
    benchmark::DoNotOptimize(tree.node_count());
  }
  tree_counters(state, rollout_tree(topology(steps), numbered_trees(trees)));
}
BENCHMARK(BM_topology_sequential)->ArgName("trees")->Arg(1)->Arg(8)->Arg(64);

// --- Noise correlators: one split of K children, `elements` per latent -------------------------------------------

template <NoiseCorrelator C>
void BM_correlator(benchmark::State& state) {
  const auto k = static_cast<std::size_t>(state.range(0));
  const auto elements = static_cast<std::size_t>(state.range(1));
  std::vector<noise_key> children(k);
  for (std::size_t b = 0; b < k; ++b)
    children[b] = {.seed = 3,
                   .iteration = 1,
                   .tree = 0,
                   .node = static_cast<std::uint32_t>(b + 1),
                   .step = 3,
                   .stream = noise_stream::edge};
  const sibling_group group{
      .parent = {.seed = 3, .iteration = 1, .tree = 0, .node = 0, .step = 3, .stream = noise_stream::shared},
      .children = children,
      .elements = elements};
  std::vector<double> out(k * elements);
  const C correlator{};
  for (auto _ : state) {
    benchmark::DoNotOptimize(correlator(group, out));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(k * elements));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(k * elements * sizeof(double)));
}

void correlator_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"K", "elements"});
  for (int k : {2, 3})
    for (int elements : {2, 4096, 65536}) b->Args({k, elements});
}
BENCHMARK_TEMPLATE(BM_correlator, independent)->Apply(correlator_sizes);
BENCHMARK_TEMPLATE(BM_correlator, correlated)->Apply(correlator_sizes);
BENCHMARK_TEMPLATE(BM_correlator, scaled)->Apply(correlator_sizes);
BENCHMARK_TEMPLATE(BM_correlator, antithetic)->Apply(correlator_sizes);
BENCHMARK_TEMPLATE(BM_correlator, orthogonal)->Apply(correlator_sizes);

// --- Fusion weightings ----------------------------------------------------------------------------------------

// Values at every node with children (what a rollout valuing every step records), a smooth function of the index.
void value_every_node(rollout_tree& tree) {
  std::vector<std::int32_t> nodes;
  std::vector<double> values;
  for (std::int32_t n = 0; n < tree.node_count(); ++n)
    if (!tree.is_leaf(n)) {
      nodes.push_back(n);
      values.push_back(std::sin(0.001 * n));
    }
  tree.set_values(nodes, values);
}

template <Fusion F>
void BM_fusion(benchmark::State& state) {
  rollout_tree tree = forest(static_cast<std::int32_t>(state.range(0)), static_cast<int>(state.range(1)));
  const std::vector<double> rewards = leaf_rewards(tree);
  const F fusion{};
  if (needs_node_values(fusion)) value_every_node(tree);
  for (auto _ : state) {
    std::vector<double> fused = fusion(tree, rewards);
    benchmark::DoNotOptimize(fused.data());
  }
  tree_counters(state, tree);
}
BENCHMARK_TEMPLATE(BM_fusion, uniform_mean)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_fusion, path_softmax)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_fusion, split_softmax)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_fusion, max_reward)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_fusion, step_gain)->Apply(tree_sizes);

// --- Advantage normalizers (on uniform_mean's fused rewards) -----------------------------------------------------

template <Normalizer N>
void BM_normalizer(benchmark::State& state) {
  const rollout_tree tree = forest(static_cast<std::int32_t>(state.range(0)), static_cast<int>(state.range(1)));
  const std::vector<double> rewards = leaf_rewards(tree);
  const std::vector<double> fused = uniform_mean{}(tree, rewards);
  N normalizer{};  // per_prompt_running keeps state: its FIFO fills during warm-up, then stays full
  for (auto _ : state) {
    std::vector<double> advantages = normalizer(tree, reward_view{.leaf = rewards, .fused = fused});
    benchmark::DoNotOptimize(advantages.data());
  }
  tree_counters(state, tree);
}
BENCHMARK_TEMPLATE(BM_normalizer, depth_wise)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_normalizer, leaf_group)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_normalizer, per_prompt_running)->Apply(tree_sizes);

// --- Pruners (a RolloutShaper sees the tree it shaped, a RolloutCutter the tree it cut)
// -----------------------------------------------------------

template <Pruner P>
void BM_pruner(benchmark::State& state) {
  const P pruner{};
  const auto k = static_cast<int>(state.range(1));
  const tree_plan plan = shape_plan(pruner, split_schedule::dense(k)(steps), 0);
  rollout_tree tree = forest(static_cast<std::int32_t>(state.range(0)), k, &plan);
  if (const rollout_cut cut = rollout_cut_of(pruner, plan, 0); cut.active()) {
    // A RolloutCutter sees the tree its cut stopped (values: a smooth function of the node index).
    const std::vector<std::int32_t> frontier = tree.nodes_at_step(cut.step);
    std::vector<double> values;
    for (const std::int32_t n : frontier) values.push_back(std::sin(0.37 * n));
    tree.set_values(frontier, values);
    const std::vector<std::int32_t> stopped = nodes_to_stop(tree, frontier, values, cut.keep);
    std::vector<double> stopped_values;
    for (const std::int32_t n : stopped) stopped_values.push_back(tree.value(n));
    tree.stop(stopped, stopped_values);
  }
  const std::vector<double> rewards = leaf_rewards(tree);
  const std::vector<double> fused = uniform_mean{}(tree, rewards);
  const std::vector<double> advantages = depth_wise{}(tree, reward_view{.leaf = rewards, .fused = fused});
  const prune_context context{
      .iteration = 0, .total_iterations = 100, .leaf_rewards = rewards, .fused = fused, .advantages = advantages};
  for (auto _ : state) {
    edge_mask mask = pruner(tree, context);
    benchmark::DoNotOptimize(mask.data());
  }
  tree_counters(state, tree);
}
BENCHMARK_TEMPLATE(BM_pruner, keep_all)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_pruner, depth_window)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_pruner, parent_top_k)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_pruner, extreme)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_pruner, sde_window)->Apply(tree_sizes);
BENCHMARK_TEMPLATE(BM_pruner, value_prune)->Apply(tree_sizes);

// --- The method path: fusion + normalization + pruning (target <= 50 us at 64 x 16 x 20) -----------------------

// What train_iteration does between the rewards and the update for branch-widpru: uniform_mean, depth_wise
// (per tree), parent_top_k{.k = 1}. A training loop keeps its per-node buffers across iterations (the forest's
// shape is fixed), so the path writes into them with the policies' span overloads: no allocation.
void BM_method_path(benchmark::State& state) {
  const rollout_tree tree = forest(static_cast<std::int32_t>(state.range(0)), static_cast<int>(state.range(1)));
  const std::vector<double> rewards = leaf_rewards(tree);
  const uniform_mean fusion{};
  const depth_wise normalizer{};
  const parent_top_k pruner{.k = 1};
  std::vector<double> fused(static_cast<std::size_t>(tree.node_count()));
  std::vector<double> advantages(static_cast<std::size_t>(tree.node_count()));
  edge_mask mask(static_cast<std::size_t>(tree.node_count()));
  for (auto _ : state) {
    fusion(tree, rewards, fused);
    normalizer(tree, reward_view{.leaf = rewards, .fused = fused}, advantages);
    pruner(
        tree,
        prune_context{
            .iteration = 0, .total_iterations = 100, .leaf_rewards = rewards, .fused = fused, .advantages = advantages},
        mask);
    benchmark::DoNotOptimize(mask.data());
    benchmark::ClobberMemory();
  }
  tree_counters(state, tree);
  state.counters["target_us"] = 50;  // the component target at 64 x 16 x 20 (docs/performance.md)
}
BENCHMARK(BM_method_path)->Apply(tree_sizes)->Unit(benchmark::kMicrosecond);

// The same path through the concepts' calls, which return fresh vectors: what a caller that keeps no buffers
// pays (allocation, and page faults where glibc returned the freed memory to the kernel).
void BM_method_path_allocating(benchmark::State& state) {
  const rollout_tree tree = forest(static_cast<std::int32_t>(state.range(0)), static_cast<int>(state.range(1)));
  const std::vector<double> rewards = leaf_rewards(tree);
  const uniform_mean fusion{};
  const depth_wise normalizer{};
  const parent_top_k pruner{.k = 1};
  for (auto _ : state) {
    const std::vector<double> fused = fusion(tree, rewards);
    const std::vector<double> advantages = normalizer(tree, reward_view{.leaf = rewards, .fused = fused});
    edge_mask mask = pruner(tree, prune_context{.iteration = 0,
                                                .total_iterations = 100,
                                                .leaf_rewards = rewards,
                                                .fused = fused,
                                                .advantages = advantages});
    benchmark::DoNotOptimize(mask.data());
  }
  tree_counters(state, tree);
}
BENCHMARK(BM_method_path_allocating)->Apply(tree_sizes)->Unit(benchmark::kMicrosecond);

// --- SDE step + log-prob on the host backend ---------------------------------------------------------------------

// One SDE transition of `rows` latents of `elements`: mean = a x + c v, next = mean + std * eps (noise already
// drawn), per-row log N(next; mean, std^2). Bytes: 3 tensors per affine, 2 for the log-prob.
void BM_sde_step(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  const std::int64_t elements = state.range(1);
  const auto count = static_cast<std::size_t>(rows * elements);
  const latent_shape shape{{elements}};
  host_backend backend;
  const host_tensor x = backend.from_host(keyed_values(count, 3, 1.0, 0.0), rows, shape);
  const host_tensor v = backend.from_host(keyed_values(count, 4, 1.0, 0.0), rows, shape);
  const host_tensor noise = backend.from_host(keyed_values(count, 5, 0.1, 0.0), rows, shape);
  const sigma_schedule schedule = shifted_linear_schedule(steps);
  const affine_step step = dance_sde{}(schedule, 5);
  const std::vector<double> stds(static_cast<std::size_t>(rows), step.noise_std);
  for (auto _ : state) {
    const host_tensor mean = backend.affine(step.x_coeff, x, step.velocity_coeff, v);
    const host_tensor next = backend.affine(1.0, mean, 1.0, noise);
    std::vector<double> log_probs = backend.row_log_prob(next, mean, stds);
    benchmark::DoNotOptimize(log_probs.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * elements);
  state.SetBytesProcessed(state.iterations() * rows * elements * 8 * static_cast<std::int64_t>(sizeof(double)));
}
BENCHMARK(BM_sde_step)->ArgNames({"rows", "elements"})->Args({16, 4096})->Args({219, 4096})->Args({1024, 4096});

// --- Keyed noise (Philox4x32-10 + Box-Muller) ------------------------------------------------------------------

void BM_keyed_noise_fill(benchmark::State& state) {
  std::vector<double> out(static_cast<std::size_t>(state.range(0)));
  const noise_key key{.seed = 9, .iteration = 2, .tree = 1, .node = 4, .step = 7, .stream = noise_stream::edge};
  for (auto _ : state) {
    fill_keyed_normal(key, out);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<std::int64_t>(sizeof(double)));
}
BENCHMARK(BM_keyed_noise_fill)->ArgName("elements")->Arg(4096)->Arg(65536)->Arg(16 * 90 * 90);

}  // namespace
}  // namespace branchgrpo::bench

BENCHMARK_MAIN();
