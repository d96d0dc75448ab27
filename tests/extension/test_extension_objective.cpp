// docs/extending.md, "An objective": a toy objective added through exactly the page's steps, one header's worth of
// code (here, in this file) and one list entry (extended_policy_list), with no edit of the library.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"
#include "toy_iteration.hpp"

using namespace branchgrpo;

namespace {

// Step 1: the objective. REINFORCE on the trained transitions: loss = -scale A log p, no ratio, no clip of the
// ratio (the advantage is clipped as ppo_ratio clips it). At the first optimizer step its gradient is PPO's, whose
// ratio is exactly 1 there: d(-A r)/d theta = -A d log p / d theta.
struct reinforce {
  double scale = 1.0;
  friend bool operator==(const reinforce&, const reinforce&) = default;
  static constexpr std::string_view name = "reinforce", summary = "REINFORCE: -A log p on the transitions (a toy)";
  static constexpr auto parameters() {
    return std::tuple{parameter("scale", &reinforce::scale, "loss scale", rules::positive{})};
  }
  static constexpr bool trains_transitions = true;  // kl_beta, ratio_norm and step_weight are accepted (unused)

  // Step 2: its update, on the library's loop (training/update_loop.hpp).
  template <Backend B, Policy<B> Model, Stepper S, Communicator Comm>
  update_report update(Model& policy, const update_input<B, S>& input, Comm& communicator) const {
    const std::vector<std::int32_t>& all = input.credit.trained;
    if (all.empty()) return {};
    const std::vector<std::size_t> ends =
        update_group_ends(static_cast<std::int64_t>(all.size()), input.options.updates_per_iteration);
    const rank_rows<std::int32_t> mine =
        rows_of_rank(std::span<const std::int32_t>(all), std::span<const std::size_t>(ends), input.first_node(),
                     input.end_node(), [](std::int32_t& node) -> std::int32_t& { return node; });
    const rollout_tree& tree = input.result.tree;
    const auto step_of = [&](std::size_t row) { return tree.step(tree.parent(mine.rows[row])); };
    const auto groups = chunk_groups(mine.group_ends, input.options.max_batch, [&](std::size_t first, std::size_t row) {
      return step_of(row) == step_of(first);
    });
    const double per_edge = 1.0 / static_cast<double>(all.size());
    update_sums sums;
    run_optimizer_steps(
        policy, communicator, groups, [](std::size_t) { return 1.0; },
        [&](const row_chunk& chunk, std::size_t) {
          const std::span<const std::int32_t> nodes = std::span(mine.rows).subspan(chunk.begin, chunk.size());
          policy.accumulate(
              transition_batch(input, nodes), loss_gradient_fn([&](std::span<const double> lp) {
                std::vector<double> weights(lp.size());
                for (std::size_t i = 0; i < lp.size(); ++i) {
                  const double advantage = clip_advantage(
                      input.credit.edge_advantage[static_cast<std::size_t>(input.first_node() + nodes[i])],
                      input.options.loss.advantage_clip);
                  sums.loss += -scale * advantage * lp[i];
                  weights[i] = per_edge * (-scale * advantage);
                }
                return weights;
              }));
          sums.evaluations += static_cast<std::int64_t>(chunk.size());
        });
    return finish_update(communicator, sums, per_edge, static_cast<std::int64_t>(all.size()));
  }
};

// Step 3: the one list entry.
using my_objectives = extended_policy_list<objective_policies, reinforce>;
using my_objective = any_policy<my_objectives>;

static_assert(ObjectivePolicy<reinforce>);
static_assert(Objective<my_objective>);
static_assert(my_objectives::names.back() == "reinforce");

template <class Recipe>
std::vector<double> parameters_after_one_iteration(Recipe recipe, iteration_stats* stats = nullptr) {
  auto policy = make_toy_policy(7);
  const iteration_stats done = testing::one_toy_iteration(recipe, policy);
  if (stats) *stats = done;
  return {policy.parameters().begin(), policy.parameters().end()};
}

}  // namespace

TEST_CASE("extension: a toy objective through one list entry trains as PPO's first step", "[extension]") {
  // Chosen at run time by name, as a run config's [objective] kind = "reinforce" would.
  my_objective chosen;
  chosen.policy = make_policy<my_objectives>("reinforce");
  CHECK(chosen.name() == "reinforce");
  iteration_stats stats;
  const std::vector<double> trained = parameters_after_one_iteration(with_objective(branch_method(), chosen), &stats);
  const std::vector<double> ppo = parameters_after_one_iteration(branch_method());
  // One optimizer step: the gradient weights -A / edges are PPO's bit for bit, so are the parameters.
  CHECK(trained == ppo);
  // One base policy: begin() and end() of two temporaries' parameters would span two unrelated buffers.
  const auto base = make_toy_policy(7);
  CHECK(trained != std::vector<double>(base.parameters().begin(), base.parameters().end()));
  CHECK(stats.edges_trained == 218 * 4);
  CHECK(stats.update_evaluations == 218 * 4);
  CHECK(std::isfinite(stats.loss));
  // Its parameters are validated like a built-in objective's.
  CHECK_THROWS_WITH(parameters_after_one_iteration(with_objective(branch_method(), reinforce{.scale = 0})),
                    Catch::StartsWith("objective.scale = 0") && Catch::EndsWith(": must be positive"));
}
