// The `--methods` entries of `compare` and `gradient-signal`: the override table (tools/cli/runs/method_overrides.hpp)
// read by parse_method_variant and applied to a run, the toy's (make_variant_run) or any other view of a run's
// components (as the shapes model's run_config is).
#include <catch2/catch.hpp>

#include <string_view>
#include <variant>

#include "branchgrpo/core/error.hpp"
#include "cli/runs/method_overrides.hpp"
#include "cli/runs/method_variant.hpp"

using branchgrpo::cli::apply_overrides;
using branchgrpo::cli::make_variant_run;
using branchgrpo::cli::override_keys;
using branchgrpo::cli::override_target;
using branchgrpo::cli::parse_method_variant;
namespace bg = branchgrpo;

TEST_CASE("method_variant: the table's keys, in the order messages list them", "[method_variant]") {
  constexpr auto keys = override_keys();
  CHECK(bg::name_list(keys) ==
        "scope, s, fusion, stepper, objective, updates, lr, ratio_norm, step_weight, intermediate, ode_stride, solver, "
        "value_keep, value_step, value_pruned, topology or budget");
}

TEST_CASE("method_variant: parsing fills the fields the keys name", "[method_variant]") {
  const auto plain = parse_method_variant("dance");
  CHECK(plain.plain());
  CHECK(plain.method == "dance");
  const auto v = parse_method_variant("branch:scope=per_batch:s=1:updates=4:lr=0.05:ratio_norm=on");
  CHECK_FALSE(v.plain());
  CHECK(v.method == "branch");
  CHECK(v.label == "branch:scope=per_batch:s=1:updates=4:lr=0.05:ratio_norm=on");
  CHECK(v.scope == bg::normalization_scope::per_batch);
  CHECK(v.correlation_s == 1.0);
  CHECK(v.updates == 4);
  CHECK(v.lr == 0.05);
  CHECK(v.ratio_norm == true);
  CHECK_FALSE(v.fusion.has_value());
  CHECK_FALSE(v.solver.has_value());
}

TEST_CASE("method_variant: one line naming the entry for a bad key or value", "[method_variant]") {
  CHECK_THROWS_WITH(
      parse_method_variant("branch:eta=1"),
      "--methods: unknown key 'eta' in 'branch:eta=1' (expected scope, s, fusion, stepper, objective, updates, lr, "
      "ratio_norm, step_weight, intermediate, ode_stride, solver, value_keep, value_step, value_pruned, topology or "
      "budget)");
  CHECK_THROWS_WITH(parse_method_variant("branch:s=1:s=2"), "--methods: 's' is set twice in 'branch:s=1:s=2'");
  CHECK_THROWS_WITH(parse_method_variant("branch:scope=per_node"),
                    "--methods branch:scope=per_node: scope = per_node: must be per_tree, per_batch, pooled or "
                    "leaf_scaled");
  CHECK_THROWS_WITH(parse_method_variant("branch-mix:solver=heun"),
                    "--methods branch-mix:solver=heun: solver = heun: must be euler or dpm_solver_2m");
  CHECK_THROWS_WITH(
      parse_method_variant("branch:foo"),
      "--methods: 'foo' in 'branch:foo' is not key=value (keys: scope, s, fusion, stepper, objective, updates, lr, "
      "ratio_norm, step_weight, intermediate, ode_stride, solver, value_keep, value_step, value_pruned, topology, "
      "budget)");
  CHECK_THROWS_WITH(parse_method_variant("branch:value_pruned=keep"),
                    "--methods branch:value_pruned=keep: value_pruned = keep: must be value or drop");
}

TEST_CASE("method_variant: value_* keys add the value pruner once and set it", "[method_variant][value_pruning]") {
  const auto run = make_variant_run(parse_method_variant("branch:value_keep=2:value_pruned=drop"), 0.1);
  REQUIRE(run.recipe.pruner.pruner.pruners.size() == 1);
  CHECK(std::get<bg::value_prune>(run.recipe.pruner.pruner.pruners[0].policy) ==
        bg::value_prune{.step = -1, .keep = 2, .pruned = bg::pruned_branch::drop});
  const auto adaptive = make_variant_run(parse_method_variant("branch:topology=adaptive_branching:budget=90"), 0.1);
  CHECK(std::get<bg::adaptive_branching>(adaptive.recipe.topology.policy).budget == 90);
  CHECK_THROWS_WITH(make_variant_run(parse_method_variant("branch:budget=90"), 0.1),
                    "--methods branch:budget=90: budget needs topology=adaptive_branching, and branch has "
                    "split_schedule");
}

TEST_CASE("method_variant: the toy's run holds the method's recipe with the overrides applied", "[method_variant]") {
  const auto run = make_variant_run(
      parse_method_variant("branch:s=1:scope=pooled:fusion=path_softmax:stepper=cps:updates=4:step_weight=noise_std"),
      0.1);
  CHECK(std::get<bg::correlated>(run.recipe.correlator.policy).s == 1.0);
  CHECK(std::get<bg::depth_wise>(run.recipe.normalizer.policy).scope == bg::normalization_scope::pooled);
  CHECK(run.recipe.fusion.name() == "path_softmax");
  CHECK(run.recipe.stepper.name() == "cps");
  CHECK(run.updates == 4);
  CHECK(run.lr == 0.1);  // not overridden: the caller's
  CHECK(run.loss.step_weight == bg::step_weighting::noise_std);
  CHECK_FALSE(run.loss.ratio_norm);

  const auto plain = make_variant_run(parse_method_variant("branch"), 0.1);
  CHECK(std::get<bg::correlated>(plain.recipe.correlator.policy).s == 4.0);  // branch's own
  CHECK(plain.recipe.pruner.pruner.pruners.empty());                         // keep_all: no pruner

  const auto flash = make_variant_run(parse_method_variant("branch-mix-flash:ode_stride=2:solver=euler"), 0.1);
  REQUIRE(flash.recipe.pruner.pruner.pruners.size() == 1);
  const auto& window = std::get<bg::sde_window>(flash.recipe.pruner.pruner.pruners.front().policy);
  CHECK(window.ode_stride == 2);
  CHECK(window.solver == bg::ode_solver::euler);

  const auto nft = make_variant_run(parse_method_variant("branch-nft:intermediate=1"), 0.1);
  CHECK(std::get<bg::diffusion_nft>(nft.recipe.objective.policy).intermediate_nodes);
}

TEST_CASE("method_variant: an override the method cannot take is one line naming the variant", "[method_variant]") {
  CHECK_THROWS_WITH(make_variant_run(parse_method_variant("dance:s=1"), 0.1),
                    "--methods dance:s=1: s needs correlated sibling noise, and dance has independent chains");
  CHECK_THROWS_WITH(make_variant_run(parse_method_variant("dance:scope=pooled"), 0.1),
                    "--methods dance:scope=pooled: scope needs a depth-wise normalizer, and dance has none");
  CHECK_THROWS_WITH(make_variant_run(parse_method_variant("branch:ode_stride=2"), 0.1),
                    "--methods branch:ode_stride=2: ode_stride and solver need an SDE window (branch-mix, "
                    "branch-mix-flash)");
  CHECK_THROWS_WITH(make_variant_run(parse_method_variant("branch:intermediate=1"), 0.1),
                    "--methods branch:intermediate=1: intermediate needs a decoupled objective (nft, awm, "
                    "branch-nft, branch-awm)");
  // The loss options of a transition beside an objective that trains none: the trainer's one rule, its words.
  CHECK_THROWS_WITH(parse_method_variant("branch-nft:ratio_norm=on"),
                    "--methods branch-nft:ratio_norm=on: ratio_norm = on with objective nft: RatioNorm normalizes a "
                    "transition's importance ratio, and this objective has none (objective ppo only)");
  CHECK_THROWS_WITH(parse_method_variant("awm:step_weight=noise_std"),
                    "--methods awm:step_weight=noise_std: step_weight = noise_std with objective awm: per-step "
                    "weights weigh denoising transitions, and this objective trains none (objectives ppo and dppo)");
  CHECK_NOTHROW(parse_method_variant("branch:ratio_norm=on:step_weight=noise_std"));
  // Another objective: its own rules (RatioNorm is the clip's, and Flow-DPPO has none).
  CHECK_NOTHROW(parse_method_variant("branch:objective=dppo:step_weight=noise_std"));
  CHECK_THROWS_WITH(parse_method_variant("branch:objective=dppo:ratio_norm=on"),
                    "--methods branch:objective=dppo:ratio_norm=on: ratio_norm = on with objective dppo: RatioNorm "
                    "normalizes the ratio PPO clips, and this objective bounds the step KL instead (objective ppo "
                    "only)");
  CHECK_THROWS_WITH(parse_method_variant("branch:objective=grpo"),
                    "unknown objective 'grpo' (expected ppo, awm, nft or dppo)");
  const auto dppo = make_variant_run(parse_method_variant("branch:objective=dppo:updates=2"), 0.1);
  CHECK(dppo.recipe.objective.name() == "dppo");
  CHECK(dppo.updates == 2);
}

TEST_CASE("method_variant: the table applies to any view of a run's components and settings", "[method_variant]") {
  // As the shapes model's run_config: components and settings kept elsewhere, reached through references.
  bg::any_stepper stepper = bg::dance_sde{};
  bg::any_correlator correlator = bg::correlated{};
  bg::any_fusion fusion;
  bg::any_normalizer normalizer = bg::depth_wise{};
  bg::any_pruner pruner;
  bg::any_objective objective;
  int updates = 1;
  double lr = 1e-5;
  bg::ppo_options loss;
  bg::any_topology topology;
  const override_target run{topology, stepper, correlator, fusion, normalizer, pruner, objective, updates, lr, loss};
  const auto variant = parse_method_variant("branch:s=2:lr=0.05:ratio_norm=on:fusion=max_reward");
  apply_overrides(variant, run, {.label = variant.label, .method = variant.method});
  CHECK(std::get<bg::correlated>(correlator.policy).s == 2.0);
  CHECK(fusion.name() == "max_reward");
  CHECK(lr == 0.05);
  CHECK(updates == 1);
  CHECK(loss.ratio_norm);
}
