// Dynamic branching per prompt (topology/adaptive_branching.hpp, rollout_tree::leave_out): the worked examples of
// the header, trees of different shapes in one frontier-batched rollout against the envelope bit for bit, and
// iterations that learn, resume exactly from their state, and stay within the budget.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "error_text.hpp"
#include "gaussian_denoiser.hpp"

using namespace branchgrpo;
using branchgrpo::testing::gaussian_denoiser;

TEST_CASE("adaptive_branching: level costs and the budget's split of levels", "[adaptive_branching]") {
  const adaptive_branching policy{};
  const tree_plan envelope = policy(20);
  CHECK(envelope == split_schedule::dense()(20));
  CHECK(adaptive_branching::level_costs(envelope) == std::vector<std::int64_t>{20, 30, 53, 102, 203});
  const std::vector<tree_info> two = numbered_trees(2);
  CHECK(policy.split_levels(envelope, two) == std::vector<int>{3, 3});
  adaptive_branching seen = policy;
  seen.prompts[0] = {.visits = 1, .spread = 0, .mean = 0.5, .gain = 0};
  CHECK(seen.split_levels(envelope, two) == std::vector<int>{1, 4});
  CHECK(testing::error_of([&] { (void)adaptive_branching{.budget = 19}.split_levels(envelope, two); }) ==
        "adaptive_branching budget = 19 is below one chain per prompt (20 evaluations over 20 steps)");
  // A budget of the whole envelope gives every tree every split.
  CHECK(adaptive_branching{.budget = 203}.split_levels(envelope, two) == std::vector<int>{4, 4});
}

TEST_CASE("leave_out and apply_split_level: chains through the first child, mirror leaves", "[adaptive_branching]") {
  rollout_tree small(tree_plan{.steps = 2, .roots = 1, .branching = {2, 1}, .kinds = {edge_kind::sde, edge_kind::sde}},
                     numbered_trees(1));
  small.leave_out(std::vector<std::int32_t>{2});
  // The doc example of leave_out.
  CHECK(small.nodes_at_step(1) == std::vector<std::int32_t>{1});
  CHECK(small.nodes_at_step(2) == std::vector<std::int32_t>{3});
  CHECK(small.evaluations() == 2);
  CHECK(small.leaf_value_source(4) == 3);
  CHECK(small.left_out(2));
  CHECK(with_phantom_leaves(small, std::vector<double>{0.9}) == std::vector<double>{0.9, 0.9});
  CHECK(testing::error_of([&] { small.leave_out(std::vector<std::int32_t>{1}); }) ==
        "node 1 cannot be left out: it must be a sampled child of rank >= 1 (the first child carries the chain)");

  rollout_tree forest(split_schedule::dense()(20), numbered_trees(3));
  apply_split_level(forest, 0, 4);
  apply_split_level(forest, 1, 2);
  apply_split_level(forest, 2, 0);
  CHECK(forest.evaluations() == 203 + 53 + 20);
  CHECK(forest.sampled_at_step(20) == 16 + 4 + 1);
  // Tree 1's 16 leaves mirror its 4 sampled leaves, each 4 times; the marks travel to another forest.
  std::vector<double> sampled;
  for (int i = 0; i < 21; ++i) sampled.push_back(i);
  const std::vector<double> all = with_phantom_leaves(forest, sampled);
  REQUIRE(all.size() == 48);
  for (int i = 0; i < 16; ++i) CHECK(all[static_cast<std::size_t>(i)] == i);
  std::vector<double> tree1(all.begin() + 16, all.begin() + 32);
  std::sort(tree1.begin(), tree1.end());
  CHECK(tree1 == std::vector<double>{16, 16, 16, 16, 17, 17, 17, 17, 18, 18, 18, 18, 19, 19, 19, 19});
  CHECK(std::all_of(all.begin() + 32, all.end(), [](double r) { return r == 20; }));
  CHECK(uniform_mean{}(forest, all)[static_cast<std::size_t>(forest.nodes_at_depth(1, 0).begin)] == 17.5);
  rollout_tree copy(forest.plan(), numbered_trees(3));
  for (std::int32_t t = 0; t < 3; ++t) copy.mark_tree(t, forest.marks_of_tree(t));
  CHECK(copy.nodes_at_step(20) == forest.nodes_at_step(20));
}

TEST_CASE("trees of different shapes share each step's denoiser call; their nodes are the envelope's",
          "[adaptive_branching][rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const latent_shape shape{{3}};
  const rollout_options options{.max_batch = 64, .seed = 5, .iteration = 2};
  auto check = [&](const auto& correlator, bool chains_equal) {
    gaussian_denoiser full_model, mixed_model;
    const auto full = rollout(backend, full_model, dance_sde{}, correlator, schedule,
                              rollout_tree(split_schedule::dense()(20), numbered_trees(3)), shape, options);
    rollout_tree shaped(split_schedule::dense()(20), numbered_trees(3));
    apply_split_level(shaped, 0, 4);
    apply_split_level(shaped, 1, 2);
    apply_split_level(shaped, 2, 0);
    const auto mixed =
        rollout(backend, mixed_model, dance_sde{}, correlator, schedule, std::move(shaped), shape, options);
    CHECK(mixed.evaluations == 276);
    CHECK(mixed.denoiser_calls == 20);
    const rollout_tree& forest = mixed.tree;
    for (std::int32_t n = 0; n < forest.node_count(); ++n) {
      if (!forest.sampled(n)) continue;
      // A node below a split turned off draws its own noise where the envelope correlated its siblings.
      bool below_chain = false;
      for (std::int32_t a = n; !forest.is_root(a); a = forest.parent(a)) {
        const std::int32_t p = forest.parent(a);
        below_chain = below_chain || (forest.children(p).size() > 1 && !forest.sampled(forest.children(p).begin + 1));
      }
      if (!below_chain || chains_equal) {
        CHECK(latent_of(backend, mixed, n) == latent_of(backend, full, n));
        CHECK(mixed.tree.log_prob(n) == full.tree.log_prob(n));
      }
    }
  };
  SECTION("independent siblings: every sampled node is the envelope's") { check(independent{}, true); }
  SECTION("correlated siblings: the nodes of splits that branch") { check(correlated{}, false); }
  SECTION("a host correlator (antithetic)") { check(antithetic{}, false); }
}

TEST_CASE("adaptive_branching trains within its budget, learns, and resumes exactly from its state",
          "[adaptive_branching][trainer]") {
  const auto recipe =
      method{adaptive_branching{.budget = 80}, dance_sde{}, correlated{}, uniform_mean{}, depth_wise{}, keep_all{}};
  const std::vector<std::int64_t> prompts{0, 1, 2, 3};
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const training_options options{.max_batch = 64, .seed = 11, .total_iterations = 3};
  host_backend backend;
  mode_reward<> reward;

  auto straight = recipe;
  auto policy = make_toy_policy(7);
  std::vector<iteration_stats> stats;
  for (int i = 0; i < 3; ++i)
    stats.push_back(
        train_iteration(backend, policy, reward, straight, schedule, toy_latent_shape(), prompts, i, options));
  for (const iteration_stats& s : stats) CHECK(s.rollout_evaluations <= 80 * 4);
  // Unseen prompts rise together: levels {2, 2, 2, 2} leave 108 of the 320, two +49 steps fit: {3, 3, 2, 2}.
  CHECK(stats[0].rollout_evaluations == 2 * 102 + 2 * 53);
  CHECK(straight.topology.prompts.size() == 4);
  CHECK(straight.topology.prompts.at(2).visits == 3);

  // Two iterations, the state saved and loaded into a fresh recipe, the third: the straight run's parameters.
  auto first = recipe;
  auto resumed_policy = make_toy_policy(7);
  for (int i = 0; i < 2; ++i)
    (void)train_iteration(backend, resumed_policy, reward, first, schedule, toy_latent_shape(), prompts, i, options);
  auto second = recipe;
  second.topology.load_state(first.topology.save_state());
  CHECK(second.topology == first.topology);
  const iteration_stats last =
      train_iteration(backend, resumed_policy, reward, second, schedule, toy_latent_shape(), prompts, 2, options);
  CHECK(last.rollout_evaluations == stats[2].rollout_evaluations);
  CHECK(std::vector<double>(resumed_policy.parameters().begin(), resumed_policy.parameters().end()) ==
        std::vector<double>(policy.parameters().begin(), policy.parameters().end()));
  CHECK(testing::error_of([&] {
          adaptive_branching bad;
          bad.load_state({{"prompt.x", {1, 0, 0, 0}}});
        }) == "adaptive_branching state key 'prompt.x' is not prompt.<id>");
}
