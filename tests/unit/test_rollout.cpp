#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <type_traits>
#include <vector>

#include "branchgrpo/correlator/catalog.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/rollout.hpp"
#include "branchgrpo/topology.hpp"
#include "error_text.hpp"
#include "gaussian_denoiser.hpp"

using namespace branchgrpo;
using branchgrpo::testing::gaussian_denoiser;

namespace {

const latent_shape shape3{{3}};

// Two trees with keys and prompts that differ from their positions, so a mix-up shows.
std::vector<tree_info> two_trees() { return {{.key = 7, .prompt = 2}, {.key = 11, .prompt = -1}}; }

rollout_tree dense_forest(std::vector<tree_info> trees) {
  return rollout_tree(split_schedule::dense()(20), std::move(trees));
}

// Draws each child's own keyed noise (like independent) and reports a chosen std factor.
struct own_noise_times {
  double factor = 1.0;
  double operator()(const sibling_group& group, std::span<double> out) const {
    for (std::size_t b = 0; b < group.children.size(); ++b)
      fill_keyed_normal(group.children[b], out.subspan(b * group.elements, group.elements));
    return factor;
  }
  friend bool operator==(const own_noise_times&, const own_noise_times&) = default;
};

struct recorded_group {
  noise_key parent;
  std::vector<noise_key> children;
  std::size_t elements = 0;
  std::size_t out_size = 0;
};

// Independent noise that also records what the engine handed over.
struct recording_correlator {
  std::vector<recorded_group>* log = nullptr;
  double operator()(const sibling_group& group, std::span<double> out) const {
    log->push_back({group.parent, {group.children.begin(), group.children.end()}, group.elements, out.size()});
    return independent{}(group, out);
  }
  friend bool operator==(const recording_correlator&, const recording_correlator&) = default;
};

// The analytic denoiser, except that row `bad_row` of step `bad_step` gets velocity `bad_value`.
struct poisoned_denoiser {
  int bad_step = 0;
  std::int64_t bad_row = 0;
  double bad_value = std::numeric_limits<double>::quiet_NaN();
  gaussian_denoiser exact{};
  host_tensor operator()(const host_tensor& x, const denoise_batch& batch) {
    host_tensor v = exact(x, batch);
    if (batch.step == bad_step && bad_row < v.rows)
      v.values[static_cast<std::size_t>(bad_row * v.shape.elements())] = bad_value;
    return v;
  }
};

// Returns a velocity with one row too few.
struct short_denoiser {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) {
    return host_backend{}.slice_rows(x, 0, x.rows - 1);
  }
};

// Returns velocities of shape {2} whatever the latent shape.
struct wrong_shape_denoiser {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) {
    return {.rows = x.rows,
            .shape = latent_shape{{2}},
            .values = std::vector<double>(static_cast<std::size_t>(2 * x.rows))};
  }
};

// Expected child latent and mean, recomputed on the host from the parent latent and the analytic velocity.
struct hand_edge {
  std::vector<double> mean;
  std::vector<double> next;
};

hand_edge recompute_edge(const std::vector<double>& parent, double sigma, double prompt, double data_std,
                         const affine_step& step, const std::vector<double>& eps, double std_dev) {
  hand_edge edge;
  for (std::size_t i = 0; i < parent.size(); ++i) {
    const double v = gaussian_denoiser::velocity(parent[i], sigma, prompt, data_std);
    edge.mean.push_back(step.x_coeff * parent[i] + step.velocity_coeff * v);
    edge.next.push_back(edge.mean.back() + std_dev * eps[i]);
  }
  return edge;
}

void check_close(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) CHECK(actual[i] == Approx(expected[i]).margin(1e-12));
}

}  // namespace

TEST_CASE("the analytic velocity matches its limits", "[rollout][gaussian_denoiser]") {
  // t = 1: v = x - m;  t = 0: v = -x;  t = 0.5, s0 = 0.5, m = 2, x = 1.5:
  //   a = 0.5, V = 0.0625 + 0.25 = 0.3125, v = -2 + (0.5 - 0.125)(1.5 - 1) / 0.3125 = -2 + 0.6 = -1.4.
  CHECK(gaussian_denoiser::velocity(1.25, 1.0, 2.0, 0.5) == Approx(-0.75).margin(1e-15));
  CHECK(gaussian_denoiser::velocity(1.25, 0.0, 2.0, 0.5) == Approx(-1.25).margin(1e-15));
  CHECK(gaussian_denoiser::velocity(1.5, 0.5, 2.0, 0.5) == Approx(-1.4).margin(1e-15));
}

TEST_CASE("rollout is bit-identical for max_batch 1 and 64", "[rollout]") {
  // The engine's doc example: dense trees over 20 steps, two trees -> 20 calls, 406 evaluations, 32 leaves.
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  auto compare = [&](const auto& correlator) {
    gaussian_denoiser wide, narrow;
    const auto a = rollout(backend, wide, dance_sde{}, correlator, schedule, dense_forest(two_trees()), shape3,
                           {.max_batch = 64, .seed = 3, .iteration = 1});
    const auto b = rollout(backend, narrow, dance_sde{}, correlator, schedule, dense_forest(two_trees()), shape3,
                           {.max_batch = 1, .seed = 3, .iteration = 1});
    CHECK(a.latents == b.latents);
    CHECK(std::vector<double>(a.tree.log_probs().begin(), a.tree.log_probs().end()) ==
          std::vector<double>(b.tree.log_probs().begin(), b.tree.log_probs().end()));
    CHECK(a.edge_std == b.edge_std);
    CHECK(a.evaluations == 406);
    CHECK(b.evaluations == 406);
    // 20 frontier calls against one call per evaluated node.
    CHECK(a.denoiser_calls == 20);
    CHECK(b.denoiser_calls == 406);
    REQUIRE(a.latents.size() == 21);
    CHECK(a.latents[20].rows == 32);
  };
  SECTION("independent") { compare(independent{}); }
  SECTION("correlated") { compare(correlated{}); }
}

TEST_CASE("the denoiser is called ceil(frontier / max_batch) times per step", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  // Dense tree frontiers: step 0: 1, steps 1-3: 2, steps 4-6: 4, steps 7-9: 8, steps 10-19: 16.
  const std::vector<std::int64_t> frontier{1, 2, 2, 2, 4, 4, 4, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16};

  SECTION("max_batch >= frontier: one call per step") {
    for (const std::int64_t max_batch : {16, 64}) {
      gaussian_denoiser denoiser;
      const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule,
                                  dense_forest(numbered_trees(1)), shape3, {.max_batch = max_batch});
      CHECK(result.denoiser_calls == 20);
      CHECK(denoiser.calls == 20);
      CHECK(denoiser.call_rows == frontier);
      CHECK(denoiser.call_steps ==
            std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
    }
  }
  SECTION("max_batch 3: 1 + 3 * 1 + 3 * 2 + 3 * 3 + 10 * 6 = 79 calls of at most 3 rows") {
    gaussian_denoiser denoiser;
    const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule,
                                dense_forest(numbered_trees(1)), shape3, {.max_batch = 3});
    CHECK(result.denoiser_calls == 79);
    CHECK(denoiser.calls == 79);
    for (const std::int64_t rows : denoiser.call_rows) CHECK(rows <= 3);
    CHECK(denoiser.rows == 203);
    // Step 10 (16 rows) is cut into 3, 3, 3, 3, 3, 1.
    std::vector<std::int64_t> step10;
    for (std::size_t c = 0; c < denoiser.call_steps.size(); ++c)
      if (denoiser.call_steps[c] == 10) step10.push_back(denoiser.call_rows[c]);
    CHECK(step10 == std::vector<std::int64_t>{3, 3, 3, 3, 3, 1});
  }
  SECTION("max_batch 15: steps 10-19 take two calls, 20 + 10 = 30") {
    gaussian_denoiser denoiser;
    const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule,
                                dense_forest(numbered_trees(1)), shape3, {.max_batch = 15});
    CHECK(result.denoiser_calls == 30);
  }
}

TEST_CASE("evaluations equal the tree's evaluations", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  SECTION("dense: 203 per tree") {
    gaussian_denoiser denoiser;
    const auto result =
        rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(two_trees()), shape3, {});
    CHECK(result.evaluations == 406);
    CHECK(result.evaluations == result.tree.evaluations());
    CHECK(denoiser.rows == 406);
  }
  SECTION("sequential{16}: 1 + 19 * 16 = 305") {
    gaussian_denoiser denoiser;
    const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule,
                                rollout_tree(sequential{.group_size = 16}(20), numbered_trees(1)), shape3, {});
    CHECK(result.evaluations == 305);
    CHECK(result.evaluations == result.tree.evaluations());
    CHECK(denoiser.rows == 305);
  }
}

TEST_CASE("the denoiser sees each row's prompt, tree key, step and sigma", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  gaussian_denoiser denoiser;
  rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(two_trees()), shape3, {});
  // Step 0: the two roots; step 1: two nodes per tree, tree-major.
  REQUIRE(denoiser.seen_prompts.size() >= 6);
  CHECK(std::vector<std::int64_t>(denoiser.seen_prompts.begin(), denoiser.seen_prompts.begin() + 6) ==
        std::vector<std::int64_t>{2, -1, 2, 2, -1, -1});
  CHECK(std::vector<std::uint32_t>(denoiser.seen_trees.begin(), denoiser.seen_trees.begin() + 6) ==
        std::vector<std::uint32_t>{7, 11, 7, 7, 11, 11});
}

TEST_CASE("a root latent is the keyed normal of its key", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  gaussian_denoiser denoiser;
  const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(two_trees()),
                              shape3, {.seed = 42, .iteration = 3});
  for (const std::int32_t t : {0, 1}) {
    const std::int32_t root = result.tree.nodes_at_depth(t, 0).begin;
    std::vector<double> expected(3);
    fill_keyed_normal({.seed = 42,
                       .iteration = 3,
                       .tree = two_trees()[static_cast<std::size_t>(t)].key,
                       .node = 0,
                       .step = 0,
                       .stream = noise_stream::root_latent},
                      expected);
    CHECK(latent_of(backend, result, root) == expected);
    CHECK(result.edge_std[static_cast<std::size_t>(root)] == 0.0);
    CHECK(result.tree.log_prob(root) == 0.0);
  }
}

TEST_CASE("an edge's sample and log-prob match the hand computation", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const double data_std = 0.5;
  const rollout_options options{.seed = 9, .iteration = 4};

  auto check_edge = [&](const rollout_result<host_backend>& result, std::int32_t node, double factor) {
    const rollout_tree& tree = result.tree;
    const std::int32_t parent = tree.parent(node);
    const int s = tree.step(parent);
    const tree_info info = tree.info(tree.tree(node));
    const affine_step step = dance_sde{}(schedule, s);
    std::vector<double> eps(3);
    fill_keyed_normal({.seed = 9,
                       .iteration = 4,
                       .tree = info.key,
                       .node = static_cast<std::uint32_t>(tree.local_index(node)),
                       .step = static_cast<std::uint32_t>(s),
                       .stream = noise_stream::edge},
                      eps);
    const double std_dev = step.noise_std * factor;
    const hand_edge edge = recompute_edge(latent_of(backend, result, parent), schedule.sigma(s),
                                          static_cast<double>(info.prompt), data_std, step, eps, std_dev);
    const std::vector<double> next = latent_of(backend, result, node);
    check_close(next, edge.next);
    CHECK(result.edge_std[static_cast<std::size_t>(node)] == Approx(std_dev).margin(1e-15));
    CHECK(tree.log_prob(node) == Approx(gaussian_log_prob_mean(next, edge.mean, std_dev)).margin(1e-12));
  };

  SECTION("split and chain edges with independent noise") {
    gaussian_denoiser denoiser{.data_std = data_std};
    const auto result =
        rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(two_trees()), shape3, options);
    const std::int32_t per_tree = result.tree.nodes_per_tree();
    check_edge(result, per_tree + 1, 1.0);  // tree 1 (prompt -1), first child of the root: split at step 0
    check_edge(result, per_tree + 2, 1.0);  // its sibling
    const std::int32_t deep = result.tree.nodes_at_depth(0, 12).begin + 5;  // a chain edge of step 11
    check_edge(result, deep, 1.0);
    check_edge(result, result.tree.leaves().back(), 1.0);  // the last edge of the forest
  }
  SECTION("a split correlator's factor scales the sample and the scored std; chains keep factor 1") {
    gaussian_denoiser denoiser{.data_std = data_std};
    const auto result = rollout(backend, denoiser, dance_sde{}, own_noise_times{.factor = 2.0}, schedule,
                                dense_forest(two_trees()), shape3, options);
    check_edge(result, 1, 2.0);                                        // split at step 0
    check_edge(result, result.tree.nodes_at_depth(1, 10).begin, 2.0);  // split at step 9
    check_edge(result, result.tree.nodes_at_depth(1, 11).begin, 1.0);  // chain at step 10
  }
}

TEST_CASE("cps and per_layer_eta: drawn with noise_std, scored with the stepper's std, at each edge's layer",
          "[rollout][stepper]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const double data_std = 0.5;
  const rollout_options options{.seed = 9, .iteration = 4};
  gaussian_denoiser denoiser{.data_std = data_std};

  // Node `node`'s edge recomputed by hand with coefficients `step`, noise drawn at step.noise_std * factor and
  // scored with `scored`.
  auto check_edge = [&](const rollout_result<host_backend>& result, std::int32_t node, const affine_step& step,
                        double factor, double scored) {
    const rollout_tree& tree = result.tree;
    const std::int32_t parent = tree.parent(node);
    const int s = tree.step(parent);
    const tree_info info = tree.info(tree.tree(node));
    std::vector<double> eps(3);
    fill_keyed_normal({.seed = 9,
                       .iteration = 4,
                       .tree = info.key,
                       .node = static_cast<std::uint32_t>(tree.local_index(node)),
                       .step = static_cast<std::uint32_t>(s),
                       .stream = noise_stream::edge},
                      eps);
    const hand_edge edge =
        recompute_edge(latent_of(backend, result, parent), schedule.sigma(s), static_cast<double>(info.prompt),
                       data_std, step, eps, step.noise_std * factor);
    const std::vector<double> next = latent_of(backend, result, node);
    check_close(next, edge.next);
    CHECK(result.edge_std[static_cast<std::size_t>(node)] == scored);
    CHECK(tree.log_prob(node) == Approx(gaussian_log_prob_mean(next, edge.mean, scored)).margin(1e-12));
  };

  SECTION("cps over the dense tree: its last step becomes an ODE edge; the others are scored with 1/sqrt(2)") {
    const tree_plan plan = ode_where_noiseless(split_schedule::dense()(20), cps{}, schedule);
    for (int s = 0; s < 19; ++s) CHECK(plan.kinds[static_cast<std::size_t>(s)] == edge_kind::sde);
    CHECK(plan.kinds[19] == edge_kind::ode);
    const auto result =
        rollout(backend, denoiser, cps{}, independent{}, schedule, rollout_tree(plan, two_trees()), shape3, options);
    const double scored = 1.0 / std::sqrt(2.0);
    const std::int32_t per_tree = result.tree.nodes_per_tree();
    check_edge(result, per_tree + 1, cps{}(schedule, 0), 1.0, scored);  // the split at step 0
    check_edge(result, result.tree.nodes_at_depth(1, 12).begin + 5, cps{}(schedule, 11), 1.0, scored);  // a chain
    const std::int32_t leaf = result.tree.leaves().back();  // the last step: deterministic, next = x0
    CHECK(result.tree.log_prob(leaf) == 0.0);
    CHECK(result.edge_std[static_cast<std::size_t>(leaf)] == 0.0);
    // Without ode_where_noiseless the engine refuses the noiseless SDE step.
    CHECK_THROWS_WITH(
        rollout(backend, denoiser, cps{}, independent{}, schedule, dense_forest(two_trees()), shape3, options),
        "SDE step 19 has noise_std 0; an SDE edge needs a positive std (make it an ODE edge: "
        "ode_where_noiseless)");
  }
  SECTION("cps with a split correlator's factor: drawn at noise_std * f, still scored with 1/sqrt(2)") {
    const tree_plan plan = ode_where_noiseless(split_schedule::dense()(20), cps{}, schedule);
    const auto result = rollout(backend, denoiser, cps{}, own_noise_times{.factor = 4.0}, schedule,
                                rollout_tree(plan, two_trees()), shape3, options);
    check_edge(result, 1, cps{}(schedule, 0), 4.0, 1.0 / std::sqrt(2.0));
    check_edge(result, result.tree.nodes_at_depth(1, 11).begin, cps{}(schedule, 10), 1.0, 1.0 / std::sqrt(2.0));
  }
  SECTION("per_layer_eta: each step's edges take their layer's eta (layers 0 | 1 1 1 | 2 2 2 | 3 3 3 | 4 ...)") {
    const per_layer_eta stepper{.etas = {0.9, 0.6, 0.4}};
    const auto result =
        rollout(backend, denoiser, stepper, independent{}, schedule, dense_forest(two_trees()), shape3, options);
    const auto at = [&](int eta_index, int s) { return dance_sde{.eta = stepper.etas[eta_index]}(schedule, s); };
    check_edge(result, 1, at(0, 0), 1.0, at(0, 0).noise_std);           // split 0: layer 0
    const std::int32_t step3 = result.tree.nodes_at_depth(0, 4).begin;  // split at step 3: layer 1
    check_edge(result, step3, at(1, 3), 1.0, at(1, 3).noise_std);
    const std::int32_t step5 = result.tree.nodes_at_depth(1, 6).begin + 1;  // chain at step 5: layer 2
    check_edge(result, step5, at(2, 5), 1.0, at(2, 5).noise_std);
    check_edge(result, result.tree.leaves().back(), at(2, 19), 1.0, at(2, 19).noise_std);  // layer 4: the last eta
  }
  SECTION("a noiseless step that splits is refused") {
    CHECK_THROWS_WITH(ode_where_noiseless(split_schedule{.split_steps = {0, 19}}(20), cps{}, schedule),
                      "step 19 splits into 2 but the stepper draws no noise there (sigma 0 next): identical "
                      "children; split earlier");
    CHECK(ode_where_noiseless(split_schedule::dense()(20), dance_sde{}, schedule) == split_schedule::dense()(20));
  }
}

TEST_CASE("the correlator gets the parent's and children's keys at each split", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  gaussian_denoiser denoiser;
  std::vector<recorded_group> log;
  rollout(backend, denoiser, dance_sde{}, recording_correlator{.log = &log}, schedule,
          dense_forest({{.key = 7, .prompt = 2}}), shape3, {.seed = 5, .iteration = 2});
  // Splits at steps 0, 3, 6, 9 over 1, 2, 4, 8 parents.
  REQUIRE(log.size() == 15);
  const auto key = [](std::uint32_t node, std::uint32_t step, noise_stream stream) {
    return noise_key{.seed = 5, .iteration = 2, .tree = 7, .node = node, .step = step, .stream = stream};
  };
  CHECK(log[0].parent == key(0, 0, noise_stream::shared));
  CHECK(log[0].children == std::vector<noise_key>{key(1, 0, noise_stream::edge), key(2, 0, noise_stream::edge)});
  CHECK(log[0].elements == 3);
  CHECK(log[0].out_size == 6);
  // Step 3: parents 5, 6 (local indices: 0 | 1 2 | 3 4 | 5 6 | 7 8 9 10); node 6's children are 9, 10.
  CHECK(log[2].parent == key(6, 3, noise_stream::shared));
  CHECK(log[2].children == std::vector<noise_key>{key(9, 3, noise_stream::edge), key(10, 3, noise_stream::edge)});
}

TEST_CASE("ODE steps are deterministic with log-prob 0 (flow_grpo_fast)", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(5);
  const double data_std = 0.5;
  gaussian_denoiser denoiser{.data_std = data_std};
  // kinds {ode, ode, sde, sde, ode}, branching {1, 1, 4, 1, 1}: 11 evaluations.
  const auto result = rollout(
      backend, denoiser, dance_sde{}, independent{}, schedule,
      rollout_tree(flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(5), {{.key = 3, .prompt = 1}}),
      shape3, {.seed = 1});
  CHECK(result.evaluations == 11);
  CHECK(result.denoiser_calls == 5);
  int ode_edges = 0, sde_edges = 0;
  for (std::int32_t n = 0; n < result.tree.node_count(); ++n) {
    if (result.tree.is_root(n)) continue;
    const std::int32_t parent = result.tree.parent(n);
    const int s = result.tree.step(parent);
    if (result.tree.kind(n) == edge_kind::ode) {
      ++ode_edges;
      const affine_step step = euler_ode{}(schedule, s);
      const hand_edge edge = recompute_edge(latent_of(backend, result, parent), schedule.sigma(s), 1.0, data_std, step,
                                            std::vector<double>(3, 0.0), 0.0);
      check_close(latent_of(backend, result, n), edge.mean);  // next == mean
      CHECK(result.tree.log_prob(n) == 0.0);
      CHECK(result.edge_std[static_cast<std::size_t>(n)] == 0.0);
    } else {
      ++sde_edges;
      CHECK(result.edge_std[static_cast<std::size_t>(n)] == dance_sde{}(schedule, s).noise_std);
      CHECK(result.tree.log_prob(n) != 0.0);
    }
  }
  CHECK(ode_edges == 2 + 4);  // steps 0, 1 (one node each) and step 4 (four nodes)
  CHECK(sde_edges == 4 + 4);  // the split at step 2 and the chain at step 3
}

TEST_CASE("skip steps and DPM-Solver++(2M): evaluations, carried latents, hand-computed ODE edges", "[rollout][ode]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const double data_std = 0.5;
  gaussian_denoiser denoiser{.data_std = data_std};
  const tree_plan plan =
      sde_window{.ode_stride = 2, .solver = ode_solver::dpm_solver_2m}.shape(split_schedule::dense()(20), 0);
  const auto result = rollout(backend, denoiser, dance_sde{}, correlated{.s = 4.0}, schedule,
                              rollout_tree(plan, {{.key = 7, .prompt = 1}}), shape3, {.seed = 3});
  CHECK(result.evaluations == 111);  // engine.hpp's example
  CHECK(result.evaluations == result.tree.evaluations());
  CHECK(result.denoiser_calls == 13);  // 20 steps less the 7 skip steps
  // Follow leaf 0's path: every skip edge carries its parent's latent; every ODE edge is ode_step's affine map of
  // its parent, the analytic velocity there and the data prediction at the path's previous evaluated ODE step.
  const rollout_tree& tree = result.tree;
  std::vector<std::int32_t> path{tree.leaves()[0]};
  while (!tree.is_root(path.back())) path.push_back(tree.parent(path.back()));
  std::reverse(path.begin(), path.end());  // root first: path[s] is at step s
  int previous = -1, second_order_edges = 0;
  std::vector<double> previous_x0;
  for (int s = 0; s < plan.steps; ++s) {
    const std::vector<double> parent = latent_of(backend, result, path[static_cast<std::size_t>(s)]);
    const std::vector<double> child = latent_of(backend, result, path[static_cast<std::size_t>(s) + 1]);
    const edge_kind kind = plan.kinds[static_cast<std::size_t>(s)];
    CHECK(tree.kind(path[static_cast<std::size_t>(s) + 1]) == kind);
    if (kind == edge_kind::sde) {
      previous = -1;
      continue;
    }
    CHECK(tree.log_prob(path[static_cast<std::size_t>(s) + 1]) == 0.0);
    if (kind == edge_kind::skip) {
      CHECK(child == parent);
      continue;
    }
    const affine_step step =
        ode_step(ode_solver::dpm_solver_2m, schedule, {.from = s, .to = plan.ode_target(s), .previous = previous});
    std::vector<double> expected, x0;
    for (std::size_t i = 0; i < parent.size(); ++i) {
      const double v = gaussian_denoiser::velocity(parent[i], schedule.sigma(s), 1.0, data_std);
      expected.push_back(step.x_coeff * parent[i] + step.velocity_coeff * v +
                         (previous >= 0 ? step.previous_x0_coeff * previous_x0[i] : 0.0));
      x0.push_back(parent[i] - schedule.sigma(s) * v);
    }
    check_close(child, expected);
    second_order_edges += step.previous_x0_coeff != 0.0 ? 1 : 0;
    previous = s;
    previous_x0 = x0;
  }
  // Steps 12, 14, 16 have a previous prediction (10, 12, 14); 18 lands on sigma 0 (first order); 4 and 7 follow an
  // SDE edge, 10 follows one too.
  CHECK(second_order_edges == 3);
}

TEST_CASE("the sampler reaches the data distribution of the analytic denoiser", "[rollout]") {
  // Two trees of 1000 independent roots each, prompts 3 and -2 (data means), s0 = 0.5, 50 steps. The Euler
  // update keeps E[x] = (1 - sigma) m exactly (see gaussian_denoiser.hpp), so the sample mean is within
  // a few 0.5 / sqrt(1000) = 0.016 of m; the variance carries the O(step) discretization error
  // (about 0.47 at 50 shifted steps, against s0 = 0.5).
  host_backend backend;
  const int steps = 50;
  const sigma_schedule schedule = shifted_linear_schedule(steps);
  const std::vector<tree_info> trees{{.key = 0, .prompt = 3}, {.key = 1, .prompt = -2}};
  for (const edge_kind kind : {edge_kind::ode, edge_kind::sde}) {
    const tree_plan plan{.steps = steps,
                         .roots = 1000,
                         .branching = std::vector<int>(steps, 1),
                         .kinds = std::vector<edge_kind>(steps, kind)};
    gaussian_denoiser denoiser{.data_std = 0.5};
    const auto result = rollout(backend, denoiser, dance_sde{}, independent{}, schedule, rollout_tree(plan, trees),
                                latent_shape{{1}}, {.max_batch = 4096, .seed = 11});
    const std::vector<double> leaves = backend.to_host(leaf_latents(backend, result));
    REQUIRE(leaves.size() == 2000);
    for (const std::size_t t : {std::size_t{0}, std::size_t{1}}) {
      double sum = 0.0, squares = 0.0;
      for (std::size_t i = 0; i < 1000; ++i) sum += leaves[t * 1000 + i];
      const double mean = sum / 1000.0;
      for (std::size_t i = 0; i < 1000; ++i) squares += (leaves[t * 1000 + i] - mean) * (leaves[t * 1000 + i] - mean);
      const double std_dev = std::sqrt(squares / 1000.0);
      INFO("kind " << to_string(kind) << ", tree " << t << ": mean " << mean << ", std " << std_dev);
      CHECK(mean == Approx(static_cast<double>(trees[t].prompt)).margin(0.06));
      CHECK(std_dev == Approx(0.47).margin(0.08));
    }
  }
}

TEST_CASE("noise depends on the seed, iteration and tree key only", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  auto run = [&](std::vector<tree_info> trees, std::uint64_t seed, std::uint32_t iteration) {
    gaussian_denoiser denoiser;
    return rollout(backend, denoiser, dance_sde{}, correlated{}, schedule, dense_forest(std::move(trees)), shape3,
                   {.seed = seed, .iteration = iteration});
  };
  const auto base = run({{.key = 9, .prompt = 1}}, 1, 0);
  CHECK(run({{.key = 9, .prompt = 1}}, 1, 0).latents == base.latents);  // deterministic
  CHECK(run({{.key = 9, .prompt = 1}}, 2, 0).latents[0] != base.latents[0]);
  CHECK(run({{.key = 9, .prompt = 1}}, 1, 1).latents[0] != base.latents[0]);
  CHECK(run({{.key = 8, .prompt = 1}}, 1, 0).latents[0] != base.latents[0]);

  // The edge draws change too, not only the roots: the noise behind chain edge 3 -> 5 (step 2),
  // (next - mean) / std, moves with the seed.
  auto edge_noise = [&](const rollout_result<host_backend>& result) {
    const affine_step step = dance_sde{}(schedule, 2);
    const hand_edge edge = recompute_edge(latent_of(backend, result, 3), schedule.sigma(2), 1.0, 0.5, step,
                                          std::vector<double>(3, 0.0), 0.0);
    std::vector<double> eps;
    const std::vector<double> next = latent_of(backend, result, 5);
    for (std::size_t i = 0; i < 3; ++i) eps.push_back((next[i] - edge.mean[i]) / step.noise_std);
    return eps;
  };
  const std::vector<double> eps_base = edge_noise(base), eps_other = edge_noise(run({{.key = 9, .prompt = 1}}, 2, 0));
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::abs(eps_base[i] - eps_other[i]) > 1e-3);

  // The tree with key 9 gives the same samples alone or second in a forest: position does not matter.
  const auto pair = run({{.key = 5, .prompt = 1}, {.key = 9, .prompt = 1}}, 1, 0);
  const std::int32_t per_tree = pair.tree.nodes_per_tree();
  for (const std::int32_t local : {0, 1, 2, 17, per_tree - 1})
    CHECK(latent_of(backend, pair, per_tree + local) == latent_of(backend, base, local));
  CHECK(pair.tree.log_prob(per_tree + 17) == base.tree.log_prob(17));
}

TEST_CASE("leaf_latents lists the leaves in tree.leaves() order", "[rollout]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  gaussian_denoiser denoiser;
  const auto result =
      rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(two_trees()), shape3, {});
  const host_tensor leaves = leaf_latents(backend, result);
  REQUIRE(leaves.rows == result.tree.leaf_count());
  const std::vector<double> values = backend.to_host(leaves);
  for (std::int32_t i = 0; i < result.tree.leaf_count(); ++i) {
    const std::vector<double> row(values.begin() + 3 * i, values.begin() + 3 * i + 3);
    CHECK(row == latent_of(backend, result, result.tree.leaves()[static_cast<std::size_t>(i)]));
  }
}

TEST_CASE("a non-finite velocity is reported, not propagated", "[rollout]") {
  host_backend backend;
  SECTION("NaN at an SDE step names the step and the first affected node") {
    // Dense local indices: 0 | 1 2 | 3 4 | 5 6 | 7 8 9 10: row 1 of step 3 is node 6, children 9 and 10.
    poisoned_denoiser denoiser{.bad_step = 3, .bad_row = 1};
    CHECK_THROWS_AS(rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(20),
                            dense_forest(numbered_trees(1)), shape3, {}),
                    invalid_input);
    denoiser = {.bad_step = 3, .bad_row = 1};
    CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(20),
                              dense_forest(numbered_trees(1)), shape3, {}),
                      Catch::Contains("at SDE step 3 for node 9 (a non-finite velocity?)"));
  }
  SECTION("infinity at an SDE step") {
    poisoned_denoiser denoiser{.bad_step = 0, .bad_row = 0, .bad_value = std::numeric_limits<double>::infinity()};
    CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(20),
                              dense_forest(numbered_trees(1)), shape3, {}),
                      Catch::Contains("at SDE step 0 for node 1"));
  }
  SECTION("NaN at an ODE step") {
    poisoned_denoiser denoiser{.bad_step = 4, .bad_row = 2};
    // flow_grpo_fast: nodes 0 | 1 | 2 | 3..6 | 7..10 | 11..14; step 4 (ODE) evaluates nodes 7..10; row 2 is
    // node 9, whose edge leads to node 13 (errors name the edge, i.e. its child node).
    CHECK_THROWS_WITH(
        rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(5),
                rollout_tree(flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(5), numbered_trees(1)),
                shape3, {}),
        "non-finite latent at ODE step 4 for node 13 (a non-finite velocity?)");
  }
}

TEST_CASE("rollout rejects inconsistent inputs", "[rollout]") {
  host_backend backend;
  gaussian_denoiser denoiser;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(19),
                            dense_forest(numbered_trees(1)), shape3, {}),
                    "sigma schedule has 19 steps, the tree has 20");
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(numbered_trees(1)),
                            shape3, {.max_batch = 0}),
                    "max_batch must be at least 1, got 0");
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(numbered_trees(1)),
                            shape3, {.iteration = 1u << 20}),
                    "iteration 1048576 exceeds 1048575");
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, independent{}, schedule, dense_forest(numbered_trees(1)),
                            latent_shape{{3, 0}}, {}),
                    "latent dimension 1 is 0, must be at least 1");
  CHECK_THROWS_WITH(
      rollout(backend, denoiser, euler_ode{}, independent{}, schedule, dense_forest(numbered_trees(1)), shape3, {}),
      "SDE step 0 has noise_std 0; an SDE edge needs a positive std (make it an ODE edge: ode_where_noiseless)");
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{}, own_noise_times{.factor = 0.0}, schedule,
                            dense_forest(numbered_trees(1)), shape3, {}),
                    "correlator returned factor 0 at step 0 for node 0; it must be positive and finite");
  CHECK_THROWS_WITH(rollout(backend, denoiser, dance_sde{.eta = -1.0}, independent{}, schedule,
                            dense_forest(numbered_trees(1)), shape3, {}),
                    "dance_sde eta must be positive and finite, got -1");

  short_denoiser short_one;
  CHECK_THROWS_WITH(
      rollout(backend, short_one, dance_sde{}, independent{}, schedule, dense_forest(numbered_trees(1)), shape3, {}),
      "denoiser returned 0 rows for a batch of 1 at step 0");
  wrong_shape_denoiser wrong_shape;
  CHECK_THROWS_WITH(
      rollout(backend, wrong_shape, dance_sde{}, independent{}, schedule, dense_forest(numbered_trees(1)), shape3, {}),
      "affine operands differ: 1 rows of {3} vs 1 rows of {2}");
}

TEST_CASE("rollout overwrites stale log-probs of the tree it is given", "[rollout]") {
  host_backend backend;
  gaussian_denoiser denoiser;
  rollout_tree tree(flow_grpo_fast{.group_size = 2, .split_step = 1, .sde_steps = 1}(3), numbered_trees(1));
  for (double& lp : tree.mutable_log_probs()) lp = 99.0;
  const auto result =
      rollout(backend, denoiser, dance_sde{}, independent{}, shifted_linear_schedule(3), std::move(tree), shape3, {});
  // kinds {ode, sde, ode}: root 0, node 1 (ODE), nodes 2 3 (SDE split), leaves 4 5 (ODE).
  CHECK(result.tree.log_prob(0) == 0.0);
  CHECK(result.tree.log_prob(1) == 0.0);
  CHECK(result.tree.log_prob(2) != 99.0);
  CHECK(result.tree.log_prob(4) == 0.0);
  CHECK(result.tree.log_prob(5) == 0.0);
}

// A denoiser whose velocity is 0: a child's mean is x_coeff times its parent's latent, so its deviation from the
// mean is exactly the noise the engine drew for it.
struct zero_velocity {
  host_tensor operator()(const host_tensor& x, const denoise_batch&) const {
    return {.rows = x.rows, .shape = x.shape, .values = std::vector<double>(x.values.size(), 0.0)};
  }
};

TEST_CASE("every correlator's split children are drawn with the std their edges are scored with", "[rollout]") {
  // One split at step 0 into K children, 1e5 elements each; every correlator of the family's list (a correlator
  // added to correlator_policies is covered without touching this test). The children's standardized deviations
  // (child - mean) / edge_std must have std 1 (within 1 %: the standard error of a std over 1e5 draws is 0.2 %),
  // and the stored edge log-prob must be the Gaussian log-density, under the sampled distribution, of the sample.
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(2);
  const affine_step step = dance_sde{}(schedule, 0);
  const latent_shape shape{{100000}};
  const auto elements = static_cast<std::size_t>(shape.elements());
  for (const int k : {2, 3}) {
    for_each_policy<correlator_policies>([&]<class Correlator>(std::type_identity<Correlator>) {
      DYNAMIC_SECTION(Correlator::name << ", K = " << k) {
        const rollout_tree forest(split_schedule{.split_steps = {0}, .branching = {k}}(2), {{.key = 3, .prompt = 0}});
        zero_velocity denoiser;
        const auto result = rollout(backend, denoiser, dance_sde{}, Correlator{}, schedule, forest, shape,
                                    {.seed = 11, .iteration = 1});
        const std::vector<double> root = latent_of(backend, result, 0);
        for (std::int32_t child = 1; child <= k; ++child) {
          const std::vector<double> next = latent_of(backend, result, child);
          const double edge_std = result.edge_std[static_cast<std::size_t>(child)];
          REQUIRE(edge_std > 0);
          std::vector<double> mean(elements);
          double squares = 0;
          for (std::size_t i = 0; i < elements; ++i) {
            mean[i] = step.x_coeff * root[i];
            const double z = (next[i] - mean[i]) / edge_std;
            squares += z * z;
          }
          CHECK(std::sqrt(squares / static_cast<double>(elements)) == Approx(1.0).epsilon(0.01));
          // Per element: log N(next; mean, edge_std^2) averaged, as the engine stores it.
          const double density = -squares / (2.0 * static_cast<double>(elements)) - std::log(edge_std) -
                                 0.5 * std::log(2.0 * std::numbers::pi);
          CHECK(result.tree.log_prob(child) == Approx(density).epsilon(1e-12));
        }
      }
    });
  }
}

TEST_CASE("sample_ode: keyed roots, Euler steps, chunks of max_batch rows", "[rollout][ode]") {
  host_backend backend;
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const latent_shape shape{{2}};
  const auto key = [](std::int64_t r) {
    return noise_key{.seed = 5,
                     .iteration = 0,
                     .tree = 9,
                     .node = static_cast<std::uint32_t>(r),
                     .step = 0,
                     .stream = noise_stream::auxiliary};
  };
  const std::vector<std::int64_t> prompts = {0, 1, 2};

  // The doc example: v = 0 leaves every row at its keyed root; 3 rows in chunks of 2.
  zero_velocity still;
  const auto roots = sample_ode(backend, still, schedule, shape, prompts, key, 2);
  REQUIRE(roots.size() == 2);
  CHECK(roots[0].rows == 2);
  CHECK(roots[1].rows == 1);
  for (std::int64_t r = 0; r < 3; ++r) {
    std::vector<double> expected(2);
    fill_keyed_normal(key(r), expected);
    const host_tensor& chunk = roots[static_cast<std::size_t>(r / 2)];
    const auto at = static_cast<std::ptrdiff_t>((r % 2) * 2);
    CHECK(std::vector<double>(chunk.values.begin() + at, chunk.values.begin() + at + 2) == expected);
  }

  // Euler steps by hand on the Gaussian oracle, and the same numbers for any max_batch.
  gaussian_denoiser denoiser{.data_std = 0.5};
  const auto one = sample_ode(backend, denoiser, schedule, shape, prompts, key, 1);
  const auto all = sample_ode(backend, denoiser, schedule, shape, prompts, key, 64);
  REQUIRE(all.size() == 1);
  for (std::size_t r = 0; r < 3; ++r) {
    std::vector<double> x(2);
    fill_keyed_normal(key(static_cast<std::int64_t>(r)), x);
    for (int s = 0; s < schedule.steps(); ++s)
      for (double& value : x)
        value = value + (schedule.sigma(s + 1) - schedule.sigma(s)) *
                            gaussian_denoiser::velocity(value, schedule.sigma(s), static_cast<double>(prompts[r]), 0.5);
    CHECK(one[r].values == x);
    CHECK(std::vector<double>(all[0].values.begin() + static_cast<std::ptrdiff_t>(2 * r),
                              all[0].values.begin() + static_cast<std::ptrdiff_t>(2 * r + 2)) == x);
  }
  CHECK_THROWS_WITH(sample_ode(backend, denoiser, schedule, shape, std::vector<std::int64_t>{}, key, 1),
                    "sample_ode needs at least one row");
  CHECK_THROWS_WITH(sample_ode(backend, denoiser, schedule, shape, prompts, key, 0),
                    "max_batch must be at least 1, got 0");
}

TEST_CASE("keyed_sde_step_on_host: the doc example, the generic entry, and its errors") {
  host_backend backend;
  const latent_shape shape{{2}};
  const host_tensor x = backend.from_host(std::vector<double>{1, 1}, 1, shape);
  const host_tensor v = backend.from_host(std::vector<double>{0, 0}, 1, shape);
  const std::vector<noise_key> keys = {{.seed = 3, .node = 1}, {.seed = 3, .node = 2}};
  const std::vector<double> stds = {0.5, 0.5};
  const sde_transition transition{.x_coeff = 1, .velocity_coeff = 0, .branching = 2, .keys = keys, .stds = stds};
  static_assert(!KeyedSdeBackend<host_backend>);
  const keyed_sde_result<host_tensor> result = keyed_sde_step(backend, x, v, transition, shape);
  REQUIRE(result.next.rows == 2);
  REQUIRE(result.log_probs.size() == 2);
  const double half_log_two_pi = 0.5 * std::log(2 * std::numbers::pi);
  for (std::size_t b = 0; b < 2; ++b) {
    std::vector<double> eps(2);
    fill_keyed_normal(keys[b], eps);
    CHECK(result.next.values[2 * b] == 1 + 0.5 * eps[0]);
    CHECK(result.next.values[2 * b + 1] == 1 + 0.5 * eps[1]);
    // mean over the 2 elements of log N(1 + 0.5 eps; 1, 0.25) = -(eps0^2 + eps1^2) / 4 - log 0.5 - 0.5 log(2 pi)
    const double expected = -(eps[0] * eps[0] + eps[1] * eps[1]) / 4 - std::log(0.5) - half_log_two_pi;
    CHECK(result.log_probs[b] == Approx(expected).epsilon(1e-14));
  }
  const std::vector<noise_key> one_key(1);
  CHECK(testing::error_of([&] {
          keyed_sde_step(backend, x, v, {.branching = 2, .keys = one_key, .stds = stds}, shape);
        }) == "an SDE transition of 1 rows x 2 children got 1 keys and 2 stds");
  CHECK(testing::error_of([&] {
          keyed_sde_step(backend, x, v, {.branching = 0, .keys = keys, .stds = stds}, shape);
        }) == "an SDE transition needs branching >= 1, got 0");
  CHECK(testing::error_of([&] { keyed_sde_step(backend, x, v, transition, latent_shape{{-1}}); }) ==
        "latent dimension 0 is -1, must be at least 1");
  const std::vector<double> bad_std = {0.5, 0.0};
  CHECK(testing::error_of([&] {
          keyed_sde_step(backend, x, v, {.branching = 2, .keys = keys, .stds = bad_std}, shape);
        }).starts_with("row_log_prob std[1] = 0"));
}

TEST_CASE("keyed_sde_step_on_host with parent keys: correlated{s}'s rows (its doc example)") {
  host_backend backend;
  const latent_shape shape{{2}};
  const host_tensor zero = backend.from_host(std::vector<double>{0, 0}, 1, shape);
  const std::vector<noise_key> children = {{.seed = 7, .node = 1}, {.seed = 7, .node = 2}};
  const std::vector<noise_key> parents = {{.seed = 7, .node = 0}};
  const std::vector<double> stds = {1.0, 1.0};
  const keyed_sde_result<host_tensor> result = keyed_sde_step(
      backend, zero, zero, {.branching = 2, .keys = children, .stds = stds, .parent_keys = parents, .s = 1.0}, shape);
  // correlated{1}: (xi_0 + eta_b) / sqrt(2) = {-1.263738, -1.304518, 0.097391, 0.286379} (6 digits).
  const std::vector<double> expected = {-1.263738, -1.304518, 0.097391, 0.286379};
  REQUIRE(result.next.values.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(result.next.values[i] == Approx(expected[i]).margin(1e-6));
  const std::vector<noise_key> two_parents(2, parents[0]);
  CHECK(testing::error_of([&] {
          keyed_sde_step(backend, zero, zero,
                         {.branching = 2, .keys = children, .stds = stds, .parent_keys = two_parents}, shape);
        }) == "an SDE transition of 1 rows got 2 parent keys");
  CHECK(testing::error_of([&] {
          keyed_sde_step(backend, zero, zero,
                         {.branching = 2, .keys = children, .stds = stds, .parent_keys = parents, .s = 0.0}, shape);
        }) == "correlated s must be positive and finite, got 0");
}
