// The one list per component family (core/policy_list.hpp, core/parameters.hpp, <family>/catalog.hpp): the
// run-time choice any_policy, the described parameters and their rules, the descriptions tables are made of, and
// the Stateful concept through which a run-time normalizer's state reaches a checkpoint.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "branchgrpo/advantage/catalog.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/fusion/catalog.hpp"
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/training/optimizer_options.hpp"
#include "error_text.hpp"

using branchgrpo::testing::error_of;

namespace bg = branchgrpo;

TEST_CASE("value_text writes values as a config does") {
  CHECK(bg::value_text(4.0) == "4.0");
  CHECK(bg::value_text(0.3) == "0.3");
  CHECK(bg::value_text(1e-5) == "1e-05");
  CHECK(bg::value_text(3) == "3");
  CHECK(bg::value_text(true) == "true");
  CHECK(bg::value_text(std::vector<int>{0, 3}) == "[0, 3]");
  CHECK(bg::value_text(bg::normalization_scope::per_batch) == "per_batch");
  CHECK(bg::name_list(std::vector<std::string>{"a", "b", "c"}) == "a, b or c");
}

TEST_CASE("rules say why a value is refused, in the words configs use") {
  CHECK(bg::rules::positive{}.why(0.0) == "must be positive");
  CHECK(bg::rules::positive{}.why(std::nan("")) == "must be positive");
  CHECK(bg::rules::positive{}.why(1e-9).empty());
  CHECK(bg::rules::in_range{.low = 1e-12, .high = 1}.why(1e300) == "must be in [1e-12, 1]");
  CHECK(bg::rules::in_range{.low = 1e-12, .high = 1}.why(std::nan("")) == "must be in [1e-12, 1]");
  CHECK(bg::rules::in_range{.low = 1e-12, .high = 1}.why(1.0).empty());
  CHECK(bg::rules::in_range{.low = 0.0001, .high = 10}.text() == "[0.0001, 10]");
  CHECK(bg::rules::at_least{1}.why(0) == "must be at least 1");
  CHECK(bg::rules::at_least{-1}.why(-2) == "must be at least -1");
  CHECK(bg::rules::at_least{1}.text() == ">= 1");
  CHECK(bg::rules::unit_interval{.closed_right = false}.why(1.0) == "must be in [0, 1)");
  CHECK(bg::rules::unit_interval{}.why(1.0).empty());
  CHECK(bg::rules::sign{}.why(0) == "must be 1 or -1");
  CHECK(bg::rules::non_empty{.low = 1}.why(std::vector<int>{}) == "must not be empty");
  CHECK(bg::rules::non_empty{.low = 1}.why(std::vector<int>{2, 0}) == "must hold values >= 1");
  CHECK(bg::rules::each_at_least{0}.why(std::vector<int>{}).empty());
}

TEST_CASE("validate_parameters names the first parameter that breaks its rule") {
  CHECK_NOTHROW(bg::validate_parameters(bg::depth_window{}, "pruner"));
  CHECK(error_of([] { bg::validate_parameters(bg::optimizer_options{.lr = 0}, "optimizer"); }) ==
        "optimizer.lr = 0.0: must be in [1e-12, 1]");
  CHECK(error_of([] { bg::validate_parameters(bg::depth_window{.direction = 2}, "pruner"); }) ==
        "pruner.direction = 2: must be 1 or -1");
  CHECK(error_of([] {
          bg::validate_parameters(bg::split_schedule{.split_steps = {0, 3}, .branching = {}}, "t");
        }) == "t.branching = []: must not be empty");
  CHECK(error_of([] { bg::validate_parameters(bg::depth_wise{.scope = bg::normalization_scope(7)}, "a"); }) ==
        "a.scope = 7: must be per_tree, per_batch, pooled or leaf_scaled");
}

TEST_CASE("each list holds its family's policies, the default first") {
  CHECK(bg::policy_names_text<bg::topology_policies>() ==
        "split_schedule, sequential, flow_grpo_fast or adaptive_branching");
  CHECK(bg::policy_names_text<bg::stepper_policies>() == "dance_sde, flow_grpo_sde, cps or per_layer_eta");
  CHECK(bg::policy_names_text<bg::correlator_policies>() ==
        "correlated, independent, antithetic, orthogonal or scaled");
  CHECK(bg::policy_names_text<bg::fusion_policies>() ==
        "uniform_mean, path_softmax, split_softmax, max_reward or step_gain");
  CHECK(bg::policy_names_text<bg::advantage_policies>() == "depth_wise, leaf_group or per_prompt_running");
  CHECK(bg::policy_names_text<bg::pruner_policies>() ==
        "keep_all, parent_top_k, depth_window, sde_window, extreme or value");
  CHECK(bg::fusion_policies::family == "fusion");

  // Defaults: the dense tree, eta 0.3, paper Eq. 2 with s = 4, uniform fusion, depth-wise per tree.
  CHECK(bg::any_topology{}(20).evaluations() == 203);
  CHECK(bg::any_topology{}.name() == "split_schedule");
  CHECK(std::get<bg::dance_sde>(bg::any_stepper{}.policy).eta == 0.3);
  CHECK(std::get<bg::correlated>(bg::any_correlator{}.policy).s == 4.0);
  CHECK(std::holds_alternative<bg::uniform_mean>(bg::any_fusion{}.policy));
  CHECK(std::get<bg::depth_wise>(bg::any_normalizer{}.policy).scope == bg::normalization_scope::per_tree);
  CHECK(std::holds_alternative<bg::keep_all>(bg::any_pruner_choice{}.policy));
}

TEST_CASE("make_policy builds a policy's defaults by name and names the list when it cannot") {
  CHECK(std::get<bg::scaled>(bg::make_policy<bg::correlator_policies>("scaled")).scale == 4.0);
  CHECK(error_of([] { (void)bg::make_policy<bg::fusion_policies>("softmax"); }) ==
        "unknown fusion 'softmax' (expected uniform_mean, path_softmax, split_softmax, max_reward or step_gain)");
}

TEST_CASE("any_policy forwards to the held policy") {
  const bg::any_topology chains = bg::sequential{.group_size = 4};
  CHECK(chains.name() == "sequential");
  CHECK(chains(20) == bg::sequential{.group_size = 4}(20));
  CHECK(chains(20).evaluations() == 77);  // the shared root once, then 4 chains of 19 steps: 1 + 4 * 19
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 2}, .branching = {2}}(4),
                              {bg::tree_info{.key = 0, .prompt = 0}});
  const std::vector<double> leaves = {0.1, 0.5, 0.9, 0.3};
  const bg::any_fusion best = bg::max_reward{};
  CHECK(best(tree, leaves) == bg::max_reward{}(tree, leaves));
}

TEST_CASE("describe_policies gives each parameter's default, rule and meaning") {
  const std::vector<bg::policy_description> pruners = bg::describe_policies<bg::pruner_policies>();
  REQUIRE(pruners.size() == 6);
  CHECK(pruners[0].name == "keep_all");
  CHECK(pruners[0].parameters.empty());
  REQUIRE(pruners[1].parameters.size() == 1);
  CHECK(pruners[1].parameters[0].name == "k");
  CHECK(pruners[1].parameters[0].default_value == "1");
  CHECK(pruners[1].parameters[0].constraint == ">= 1");
  const std::vector<bg::policy_description> topologies = bg::describe_policies<bg::topology_policies>();
  CHECK(topologies[0].parameters[0].default_value == "[0, 3, 6, 9]");  // split_schedule::dense()
  CHECK(bg::describe_policies<bg::advantage_policies>()[0].parameters[0].constraint ==
        "per_tree, per_batch, pooled or leaf_scaled");
}

TEST_CASE("all_in intersects a run-time list of pruners; any_pruner gates it by the run's fraction") {
  // Tree {steps 4, splits {0, 2}, K 2}: nodes 0 | 1 2 | 3 4 | 5 6 7 8 | 9 10 11 12, leaf rewards
  // {0.1, 0.5, 0.9, 0.3} (combinators.hpp's all_of example).
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 2}, .branching = {2}}(4),
                              {bg::tree_info{.key = 0, .prompt = 0}});
  const std::vector<double> leaves = {0.1, 0.5, 0.9, 0.3};
  const std::vector<double> fused = bg::uniform_mean{}(tree, leaves);
  const bg::prune_context context{.iteration = 0, .total_iterations = 4, .leaf_rewards = leaves, .fused = fused};
  const bg::all_in<bg::any_pruner_choice> both{{bg::extreme{}, bg::depth_window{.depths = {0}}}};
  CHECK(both(tree, context) == bg::prune_all(bg::extreme{}, bg::depth_window{.depths = {0}})(tree, context));
  CHECK(both(tree, context) == bg::edge_mask{0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(bg::all_in<bg::any_pruner_choice>{}(tree, context) == bg::trainable_edges(tree));
  const bg::any_pruner gated{.pruner = both, .fraction = 0.5};
  CHECK(gated(tree, context) == both(tree, context));
  CHECK(gated(tree, {.iteration = 2, .total_iterations = 4, .leaf_rewards = leaves, .fused = fused}) ==
        bg::trainable_edges(tree));
}

TEST_CASE("a run-time normalizer saves and restores per_prompt_running's buffers through Stateful") {
  static_assert(bg::Stateful<bg::per_prompt_running>);
  static_assert(bg::Stateful<bg::any_normalizer>);
  static_assert(!bg::Stateful<bg::depth_wise>);
  const bg::rollout_tree tree(bg::split_schedule{.split_steps = {0, 1}, .branching = {2}}(2),
                              {bg::tree_info{.key = 0, .prompt = 3}});
  bg::any_normalizer running = bg::per_prompt_running{.history = 8};
  (void)running(tree, bg::reward_view{.leaf = std::vector<double>{1, 3, 2, 6}, .fused = {}});
  const bg::component_state saved = running.save_state();
  CHECK(saved == bg::component_state{{"prompt.3", {1, 3, 2, 6}}});

  bg::any_normalizer restored = bg::per_prompt_running{.history = 8};
  restored.load_state(saved);
  CHECK(restored == running);
  CHECK(error_of([&] {
          restored.load_state({{"prompt.x", {1.0}}});
        }) == "per_prompt_running state key 'prompt.x' is not prompt.<id>");
  CHECK(restored == running);  // a refused state changes nothing

  bg::any_normalizer stateless;
  CHECK(stateless.save_state().empty());
  CHECK_NOTHROW(stateless.load_state({}));
  CHECK(error_of([&] { stateless.load_state(saved); }) == "advantage 'depth_wise' keeps no state, got 'prompt.3'");
}
