// Node values during the rollout: value pruning (pruning/value.hpp, rollout/value_cut.hpp, rollout_tree::stop) and
// dense step rewards (fusion/step_gain.hpp). The worked examples of the headers, the survivors of a cut forest
// against the uncut forest bit for bit, and iterations with each and with both.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "error_text.hpp"
#include "gaussian_denoiser.hpp"
#include "two_part_reward.hpp"

using namespace branchgrpo;
using branchgrpo::testing::gaussian_denoiser;

namespace {

const double not_a_number = std::numeric_limits<double>::quiet_NaN();

// Steps 2, branching {2, 1}, one tree: root 0; 1, 2; leaves 3 under 1, 4 under 2.
rollout_tree small_tree() {
  return rollout_tree(tree_plan{.steps = 2, .roots = 1, .branching = {2, 1}, .kinds = {edge_kind::sde, edge_kind::sde}},
                      numbered_trees(1));
}

// The value of a node: the first coordinate of its x0-hat, plus the sum of its tree key (so trees differ).
struct first_coordinate {
  int* calls = nullptr;
  std::vector<double> operator()(const host_tensor& x0_hat, const rollout_tree& tree,
                                 std::span<const std::int32_t> nodes) const {
    if (calls) ++*calls;
    std::vector<double> values;
    const auto width = static_cast<std::size_t>(x0_hat.shape.elements());
    for (std::size_t r = 0; r < nodes.size(); ++r)
      values.push_back(x0_hat.values[r * width] + tree.info(tree.tree(nodes[r])).key);
    return values;
  }
};

std::vector<double> latent_row(host_backend& backend, const rollout_result<host_backend>& result, std::int32_t n) {
  return latent_of(backend, result, n);
}

}  // namespace

TEST_CASE("stop: the nodes below stop being sampled, the shape and the leaves stay", "[value_pruning][tree]") {
  rollout_tree tree = small_tree();
  CHECK(tree.evaluations() == 3);
  CHECK(tree.edge_count() == 4);
  const std::vector<std::int32_t> nodes{1};
  const std::vector<double> values{0.4};
  tree.stop(nodes, values);
  // The doc example of rollout_tree::stop.
  CHECK_FALSE(tree.sampled(3));
  CHECK(tree.sampled(1));
  CHECK(tree.stopped(1));
  CHECK(tree.value(1) == 0.4);
  CHECK(tree.valued(1));
  CHECK_FALSE(tree.valued(2));
  CHECK(std::isnan(tree.value(2)));
  CHECK(tree.nodes_at_step(2) == std::vector<std::int32_t>{4});
  CHECK(tree.row_at_step(4) == 0);
  CHECK(tree.evaluations() == 3);
  CHECK(tree.edge_count() == 3);
  CHECK(std::vector<std::int32_t>(tree.leaves().begin(), tree.leaves().end()) == std::vector<std::int32_t>{3, 4});
  CHECK(tree.leaf_value_source(3) == 1);
  CHECK(tree.leaf_value_source(4) == 4);
  CHECK(tree.has_stops());
  CHECK(testing::error_of([&] { (void)tree.row_at_step(3); }) ==
        "node 3 was not sampled (below a stopped node, or left out): it has no latent");
  CHECK(testing::error_of([&] { tree.stop(nodes, values); }) ==
        "node 1 cannot stop: it must be a sampled, not yet stopped node with children");
  // The stops travel to another forest of the same plan.
  rollout_tree copy = small_tree();
  copy.mark_tree(0, tree.marks_of_tree(0));
  CHECK_FALSE(copy.sampled(3));
  CHECK(copy.stopped(1));
  CHECK(copy.value(1) == 0.4);
}

TEST_CASE("nodes_to_stop keeps each tree's best values, NaN last, earlier node on ties", "[value_pruning]") {
  const rollout_tree tree(split_schedule{.split_steps = {0, 1}, .branching = {2}}(3), numbered_trees(2));
  // The doc example on tree 0's 4 nodes at step 2 (3..6), then both trees.
  const std::vector<std::int32_t> one{3, 4, 5, 6};
  const std::vector<double> one_values{0.2, 0.9, not_a_number, 0.2};
  CHECK(nodes_to_stop(tree, one, one_values, 2) == std::vector<std::int32_t>{5, 6});
  const std::vector<std::int32_t> frontier = tree.nodes_at_step(2);
  REQUIRE(frontier.size() == 8);
  const std::vector<double> values{1, 2, 3, 4, 4, 3, 2, 1};
  CHECK(nodes_to_stop(tree, frontier, values, 1) ==
        std::vector<std::int32_t>{frontier[0], frontier[1], frontier[2], frontier[5], frontier[6], frontier[7]});
  CHECK(nodes_to_stop(tree, frontier, values, 4).empty());
  CHECK(testing::error_of([&] { (void)nodes_to_stop(tree, frontier, values, 0); }) ==
        "value pruning keep = 0 leaves no leaf in a tree");
}

TEST_CASE("value_prune: its cut, its mask, and its bad inputs", "[value_pruning][pruning]") {
  const tree_plan dense = split_schedule::dense()(20);
  CHECK(value_prune{}.rollout_cut(dense, 0) == rollout_cut{.step = 9, .keep = 4});
  CHECK(rollout_cut_of(value_prune{.step = 6, .keep = 2}, dense, 3) == rollout_cut{.step = 6, .keep = 2});
  CHECK_FALSE(rollout_cut_of(extreme{}, dense, 0).active());
  CHECK(any_pruner{.pruner = {.pruners = {any_pruner_choice{value_prune{}}}}}.rollout_cut(dense, 0) ==
        rollout_cut{.step = 9, .keep = 4});
  CHECK(testing::error_of([&] { (void)value_prune{.step = 10}.rollout_cut(dense, 0); }) ==
        "value pruning step = 10 is past the last split (step 9): nothing is left to prune");
  CHECK(testing::error_of([&] { (void)value_prune{.keep = 0}.rollout_cut(dense, 0); }) ==
        "value pruning keep = 0 leaves no leaf in a tree");
  CHECK(testing::error_of([&] {
          all_in<any_pruner_choice>{{value_prune{}, value_prune{.step = 6}}}.rollout_cut(dense, 0);
        }) == "all_in holds two value pruners (steps 9 and 6): a rollout is cut at one step");
  const tree_plan chain{.steps = 2, .roots = 1, .branching = {1, 1}, .kinds = {edge_kind::sde, edge_kind::sde}};
  CHECK(testing::error_of([&] { (void)value_prune{}.rollout_cut(chain, 0); }) ==
        "value pruning step = 2 is past the last split (this tree has none): nothing is left to prune");

  // The mask example of value_prune's doc comment.
  rollout_tree tree = small_tree();
  tree.stop(std::vector<std::int32_t>{1}, std::vector<double>{0.4});
  CHECK(value_prune{}(tree, {}) == edge_mask{0, 1, 1, 0, 1});
  CHECK(value_prune{.pruned = pruned_branch::drop}(tree, {}) == edge_mask{0, 0, 1, 0, 1});
}

TEST_CASE("a cut rollout's survivors equal the uncut rollout's nodes bit for bit", "[value_pruning][rollout]") {
  // The engine's doc example: the dense tree cut at step 9 keeping 4 of 8 saves 80 of 203 evaluations per tree.
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const latent_shape shape{{3}};
  const std::vector<tree_info> trees{{.key = 7, .prompt = 2}, {.key = 11, .prompt = -1}};
  const rollout_options options{.max_batch = 5, .seed = 3, .iteration = 1};
  auto check = [&](const auto& correlator) {
    gaussian_denoiser full_model, cut_model;
    const auto full = rollout(backend, full_model, dance_sde{}, correlator, schedule,
                              rollout_tree(split_schedule::dense()(20), trees), shape, options);
    int calls = 0;
    const auto cut =
        rollout(backend, cut_model, dance_sde{}, correlator, schedule, rollout_tree(split_schedule::dense()(20), trees),
                shape, options, rollout_cut{.step = 9, .keep = 4}, first_coordinate{&calls});
    CHECK(calls == 1);
    CHECK(full.evaluations == 406);
    CHECK(cut.evaluations == 246);
    CHECK(cut.evaluations_saved == 160);
    CHECK(cut.evaluations == cut.tree.evaluations());
    const rollout_tree& forest = cut.tree;
    std::int32_t stopped = 0, sampled = 0;
    for (std::int32_t n = 0; n < forest.node_count(); ++n) {
      stopped += forest.stopped(n) ? 1 : 0;
      if (!forest.sampled(n)) continue;
      ++sampled;
      CHECK(latent_row(backend, cut, n) == latent_row(backend, full, n));
      CHECK(cut.tree.log_prob(n) == full.tree.log_prob(n));
      CHECK(cut.edge_std[static_cast<std::size_t>(n)] == full.edge_std[static_cast<std::size_t>(n)]);
    }
    CHECK(stopped == 8);
    CHECK(forest.sampled_at_step(20) == 16);
    // The stopped nodes are the lowest-valued of their tree, their value x0-hat's first coordinate + key.
    for (std::int32_t t = 0; t < 2; ++t) {
      const node_range level = forest.nodes_at_depth(t, 9);
      double lowest_kept = 1e300, highest_stopped = -1e300;
      for (std::int32_t n = level.begin; n < level.end; ++n) {
        REQUIRE(forest.valued(n));
        const double v = forest.value(n);
        const std::vector<double> x = latent_row(backend, full, n);
        const double sigma = schedule.sigma(9);
        const double velocity = gaussian_denoiser::velocity(x[0], sigma, forest.info(t).prompt, 0.5);
        CHECK(v == Approx(x[0] - sigma * velocity + forest.info(t).key).epsilon(1e-12));
        if (forest.stopped(n)) {
          highest_stopped = std::max(highest_stopped, v);
          CHECK(forest.stopped(n));
        } else {
          lowest_kept = std::min(lowest_kept, v);
        }
      }
      CHECK(highest_stopped <= lowest_kept);
    }
    CHECK(sampled == 2 * (1 + 2 + 2 + 2 + 4 + 4 + 4 + 8 + 8 + 8 + 8 * 1 + 10 * 8));
  };
  SECTION("correlated siblings, on the keyed path") { check(correlated{}); }
  SECTION("independent siblings") { check(independent{}); }
  SECTION("a host correlator (antithetic)") { check(antithetic{}); }
}

TEST_CASE("a value-pruned iteration trains the sampled edges and reports the evaluations saved",
          "[value_pruning][trainer]") {
  auto recipe = branch_method(value_prune{});
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts{0, 1, 2, 3};
  std::vector<double> sampled_leaves;
  single_process one;
  const iteration_stats stats = train_iteration(
      backend, policy, reward, recipe, schedule, toy_latent_shape(), prompts, 0,
      training_options{.max_batch = 64, .seed = 11, .total_iterations = 1}, one, [&](const auto& view) {
        const rollout_tree& forest = view.result.tree;
        for (std::int32_t i = 0; i < forest.leaf_count(); ++i) {
          const std::int32_t leaf = forest.leaves()[static_cast<std::size_t>(i)];
          if (!forest.sampled(leaf))
            CHECK(view.leaves.scores[static_cast<std::size_t>(i)] == forest.value(forest.leaf_value_source(leaf)));
          else
            sampled_leaves.push_back(0);
        }
        for (const std::int32_t n : view.credit->trained) CHECK(forest.sampled(n));
      });
  CHECK(stats.rollout_evaluations == 4 * 123);
  CHECK(stats.rollout_evaluations_saved == 4 * 80);
  CHECK(sampled_leaves.size() == 4 * 8);
  // Every sampled SDE edge trains: the dense tree's 218 edges less the 4 x 2 x 11 below the stopped nodes.
  CHECK(stats.edges == 4 * (218 - 88));
  CHECK(stats.edges_trained == 4 * (218 - 88));
}

TEST_CASE("step_gain: the doc example, weight 0 is uniform_mean, and no values is one line", "[step_gain][fusion]") {
  rollout_tree tree = small_tree();
  const std::vector<double> leaf_rewards{0.4, 1.0};
  CHECK(testing::error_of([&] { (void)step_gain{}(tree, leaf_rewards); }) ==
        "step_gain fusion (dense rewards) without a value function: the rollout valued no node (train_iteration "
        "values every step for it; rollout() needs rollout_cut{.value_every_step = true} and a RolloutValue)");
  tree.set_values(std::vector<std::int32_t>{0, 1, 2}, std::vector<double>{0.5, 0.2, 0.8});
  const std::vector<double> fused = step_gain{.weight = 0.5}(tree, leaf_rewards);
  const std::vector<double> expected{0.35, 0.05, 0.65, 0.3, 0.6};
  REQUIRE(fused.size() == expected.size());
  for (std::size_t n = 0; n < fused.size(); ++n) CHECK(fused[n] == Approx(expected[n]).margin(1e-15));
  CHECK(step_gain{.weight = 0.0}(tree, leaf_rewards) == uniform_mean{}(tree, leaf_rewards));
  CHECK(needs_node_values(step_gain{}));
  CHECK_FALSE(needs_node_values(uniform_mean{}));
  CHECK(needs_node_values(any_fusion{step_gain{}}));
  CHECK_FALSE(needs_node_values(any_fusion{}));
  // A phantom node has no gain; the stopped node's gain is its value's.
  rollout_tree cut = small_tree();
  cut.set_values(std::vector<std::int32_t>{0, 2}, std::vector<double>{0.5, 0.8});
  cut.stop(std::vector<std::int32_t>{1}, std::vector<double>{0.2});
  const std::vector<double> with_phantom{0.2, 1.0};  // leaf 3 scores its stopped node's value
  const std::vector<double> gains = step_gain{.weight = 1.0}(cut, with_phantom);
  CHECK(gains == std::vector<double>{0.0, 0.2 - 0.5, 0.8 - 0.5, 0.0, 1.0 - 0.8});
}

TEST_CASE("valuing every step leaves the rollout bit for bit as it was", "[step_gain][rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const latent_shape shape{{3}};
  const rollout_options options{.max_batch = 64, .seed = 3, .iteration = 1};
  gaussian_denoiser a, b;
  const auto plain = rollout(backend, a, dance_sde{}, correlated{}, schedule,
                             rollout_tree(split_schedule::dense()(20), numbered_trees(2)), shape, options);
  int calls = 0;
  const auto valued = rollout(backend, b, dance_sde{}, correlated{}, schedule,
                              rollout_tree(split_schedule::dense()(20), numbered_trees(2)), shape, options,
                              rollout_cut{.value_every_step = true}, first_coordinate{&calls});
  CHECK(calls == 20);
  CHECK(valued.latents == plain.latents);
  CHECK(valued.evaluations_saved == 0);
  std::int32_t count = 0;
  for (std::int32_t n = 0; n < valued.tree.node_count(); ++n) count += valued.tree.valued(n) ? 1 : 0;
  CHECK(count == 2 * 203);  // every evaluated node, none of the leaves
}

TEST_CASE("dense rewards and value pruning train together; a NaN value drops its tree", "[step_gain][trainer]") {
  auto dense = method{split_schedule::dense(), dance_sde{}, correlated{}, step_gain{}, depth_wise{}, value_prune{}};
  auto policy = make_toy_policy(7);
  mode_reward<> reward;
  host_backend backend;
  const auto schedule = shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts{0, 1, 2, 3};
  const iteration_stats stats =
      train_iteration(backend, policy, reward, dense, schedule, toy_latent_shape(), prompts, 0,
                      training_options{.max_batch = 64, .seed = 11, .total_iterations = 1});
  CHECK(stats.rollout_evaluations == 4 * 123);
  CHECK(stats.edges_trained == 4 * (218 - 88));
  CHECK(stats.trees_dropped == 0);
  CHECK(std::isfinite(stats.loss));

  // keep_finite_trees drops a tree whose rollout valued a node at NaN (a reward that failed on its x0-hat).
  rollout_tree two(small_tree().plan(), numbered_trees(2));
  two.set_values(std::vector<std::int32_t>{0, 5}, std::vector<double>{0.5, not_a_number});
  const scored_leaves kept = keep_finite_trees(two, {0.1, 0.2, 0.3, 0.4});
  CHECK(kept.kept_trees == std::vector<std::int32_t>{0});
}
