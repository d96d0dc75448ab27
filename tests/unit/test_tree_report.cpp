#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/topology.hpp"
#include "branchgrpo/tree/tree_plan.hpp"
#include "cli/output/tree_report.hpp"

using branchgrpo::edge_kind;
using branchgrpo::tree_plan;
using branchgrpo::cli::make_tree_report;
using counts = std::vector<std::int64_t>;

namespace {
std::int64_t sum(const counts& values) { return std::accumulate(values.begin(), values.end(), std::int64_t{0}); }
}  // namespace

TEST_CASE("tree_report: the doc example, branching {2, 1, 2} with an ODE step", "[tree_report]") {
  const tree_plan plan{
      .steps = 3, .roots = 1, .branching = {2, 1, 2}, .kinds = {edge_kind::sde, edge_kind::ode, edge_kind::sde}};
  const auto report = make_tree_report(plan);
  // depths: 1 root, 1*2 = 2, 2*1 = 2, 2*2 = 4 -> nodes 1 + 2 + 2 + 4 = 9, leaves 4.
  CHECK(report.nodes_per_depth == counts{1, 2, 2, 4});
  CHECK(report.edges_per_step == counts{2, 2, 4});
  CHECK(report.leaves == 4);
  CHECK(report.nodes == 9);
  CHECK(report.evaluations == 5);  // 9 - 4 leaves
  CHECK(report.edges == 8);        // 9 - 1 root
  CHECK(report.sde_edges == 6);    // steps 0 and 2: 2 + 4
  CHECK(report.ode_edges == 2);    // step 1
  CHECK(report.evaluations_per_leaf == Approx(1.25).margin(1e-12));
  CHECK(report.edges_per_leaf == Approx(2.0).margin(1e-12));
}

TEST_CASE("tree_report: dense BranchGRPO tree over 20 steps", "[tree_report]") {
  const auto report = make_tree_report(branchgrpo::split_schedule::dense()(20));
  // Splits at 0, 3, 6, 9: depths 0 | 1-3 | 4-6 | 7-9 | 10-20 hold 1 | 2 | 4 | 8 | 16 nodes.
  // nodes = 1 + 3*2 + 3*4 + 3*8 + 11*16 = 1 + 6 + 12 + 24 + 176 = 219.
  CHECK(report.leaves == 16);
  CHECK(report.nodes == 219);
  CHECK(report.evaluations == 203);  // 219 - 16
  CHECK(report.edges == 218);        // 219 - 1
  CHECK(report.sde_edges == 218);
  CHECK(report.ode_edges == 0);
  CHECK(report.evaluations_per_leaf == Approx(12.6875).margin(1e-12));  // 203 / 16
  CHECK(report.edges_per_leaf == Approx(13.625).margin(1e-12));         // 218 / 16
  REQUIRE(report.nodes_per_depth.size() == 21);
  CHECK(report.nodes_per_depth[3] == 2);
  CHECK(report.nodes_per_depth[4] == 4);
  CHECK(report.nodes_per_depth[10] == 16);
  CHECK(sum(report.nodes_per_depth) == report.nodes);
  REQUIRE(report.edges_per_step.size() == 20);
  CHECK(report.edges_per_step[0] == 2);
  CHECK(report.edges_per_step[9] == 16);
  CHECK(sum(report.edges_per_step) == report.edges);
}

TEST_CASE("tree_report: K = 3 dense tree has 81 leaves", "[tree_report]") {
  const auto report = make_tree_report(branchgrpo::split_schedule::dense(3)(20));
  // 1 + 3*3 + 3*9 + 3*27 + 11*81 = 1 + 9 + 27 + 81 + 891 = 1009 nodes.
  CHECK(report.leaves == 81);
  CHECK(report.nodes == 1009);
  CHECK(report.evaluations == 928);
  CHECK(report.edges == 1008);
}

TEST_CASE("tree_report: sequential baselines", "[tree_report]") {
  SECTION("shared root: one first evaluation, 16 chains") {
    const auto report = make_tree_report(branchgrpo::sequential{.group_size = 16}(20));
    // 1 root + 20 depths of 16 = 321 nodes; evaluations 321 - 16 = 305.
    CHECK(report.nodes == 321);
    CHECK(report.evaluations == 305);
    CHECK(report.edges == 320);
    CHECK(report.nodes_per_depth.front() == 1);
    CHECK(report.edges_per_step == counts(20, 16));
  }
  SECTION("separate roots: 16 chains of 20 evaluations") {
    const auto report = make_tree_report(branchgrpo::sequential{.group_size = 16, .shared_root = false}(20));
    // 16 roots + 20 * 16 = 336 nodes; evaluations 336 - 16 = 320; edges 336 - 16 roots = 320.
    CHECK(report.nodes == 336);
    CHECK(report.evaluations == 320);
    CHECK(report.edges == 320);
    CHECK(report.evaluations_per_leaf == Approx(20.0).margin(1e-12));
    CHECK(report.nodes_per_depth == counts(21, 16));
  }
}

TEST_CASE("tree_report: flow_grpo_fast counts SDE and ODE edges", "[tree_report]") {
  // The topology's doc example: G 4, split at 2, 2 SDE steps over 5 steps -> kinds {ode, ode, sde, sde, ode}.
  const auto report = make_tree_report(branchgrpo::flow_grpo_fast{.group_size = 4, .split_step = 2, .sde_steps = 2}(5));
  CHECK(report.nodes_per_depth == counts{1, 1, 1, 4, 4, 4});
  CHECK(report.edges_per_step == counts{1, 1, 4, 4, 4});
  CHECK(report.evaluations == 11);  // 1 + 1 + 1 + 4 + 4
  CHECK(report.edges == 14);
  CHECK(report.sde_edges == 8);  // steps 2 and 3
  CHECK(report.ode_edges == 6);  // steps 0, 1 and 4
  CHECK(report.evaluations_per_leaf == Approx(2.75).margin(1e-12));
  CHECK(report.edges_per_leaf == Approx(3.5).margin(1e-12));
}

TEST_CASE("tree_report: an inconsistent plan is rejected", "[tree_report]") {
  const tree_plan short_branching{
      .steps = 3, .roots = 1, .branching = {2, 1}, .kinds = {edge_kind::sde, edge_kind::sde, edge_kind::sde}};
  CHECK_THROWS_AS(make_tree_report(short_branching), branchgrpo::invalid_input);
  CHECK_THROWS_WITH(make_tree_report(short_branching), "branching has 2 entries for 3 steps");
  const tree_plan ode_split{.steps = 1, .roots = 1, .branching = {2}, .kinds = {edge_kind::ode}};
  CHECK_THROWS_AS(make_tree_report(ode_split), branchgrpo::invalid_input);
}
