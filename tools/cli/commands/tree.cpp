#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/limits.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/tree/tree_plan.hpp"
#include "cli/commands.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/output_file.hpp"
#include "cli/output/tree_report.hpp"

namespace branchgrpo::cli {
namespace {

struct tree_options {
  int steps = 20;
  std::string schedule = "dense";  // split_schedule::dense(), mixed() or sparse()
  std::vector<int> split_steps;    // empty: the schedule's
  std::vector<int> branching = {2};
  int sequential_group = 16;
  bool shared_root = true;
  int fast_group = 16;
  int split_step = 0;
  int sde_steps = 1;
  std::vector<double> sigmas;  // empty: shifted_linear_schedule(steps, shift)
  double shift = 3.0;
  bool json = false;

  // Set after parsing from the options' counts.
  bool use_sequential = false;
  bool use_fast = false;
};

std::string join(const auto& values) {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) out << (i == 0 ? "" : ", ") << values[i];
  return out.str();
}

// The topology as the C++ that builds it, so a table can be pasted back into code.
std::string describe(const split_schedule& topology) {
  return "split_schedule{.split_steps = {" + join(topology.split_steps) + "}, .branching = {" +
         join(topology.branching) + "}}";
}
std::string describe(const sequential& topology) {
  return "sequential{.group_size = " + std::to_string(topology.group_size) +
         ", .shared_root = " + (topology.shared_root ? "true" : "false") + "}";
}
std::string describe(const flow_grpo_fast& topology) {
  return "flow_grpo_fast{.group_size = " + std::to_string(topology.group_size) +
         ", .split_step = " + std::to_string(topology.split_step) +
         ", .sde_steps = " + std::to_string(topology.sde_steps) + "}";
}

std::string describe(const adaptive_branching& topology) {
  return "adaptive_branching{.split_steps = {" + join(topology.split_steps) +
         "}, .branching = " + std::to_string(topology.branching) + ", .budget = " + std::to_string(topology.budget) +
         "} (the envelope)";
}

any_topology make_topology(const tree_options& options) {
  if (options.use_sequential)
    return sequential{.group_size = options.sequential_group, .shared_root = options.shared_root};
  if (options.use_fast)
    return flow_grpo_fast{
        .group_size = options.fast_group, .split_step = options.split_step, .sde_steps = options.sde_steps};
  split_schedule topology = options.schedule == "mixed"    ? split_schedule::mixed()
                            : options.schedule == "sparse" ? split_schedule::sparse()
                                                           : split_schedule::dense();
  if (!options.split_steps.empty()) topology.split_steps = options.split_steps;
  topology.branching = options.branching;
  return topology;
}

sigma_schedule make_sigma_schedule(const tree_options& options) {
  if (options.sigmas.empty()) return shifted_linear_schedule(options.steps, options.shift);
  require(options.sigmas.size() == static_cast<std::size_t>(options.steps) + 1, "--sigmas has ", options.sigmas.size(),
          " values for ", options.steps, " steps; it needs ", options.steps + 1);
  return sigma_schedule(options.sigmas);
}

void print_table(std::ostream& out, const std::string& topology, const tree_plan& plan, const tree_report& report,
                 const sigma_schedule& schedule) {
  out << "topology  " << topology << '\n' << "steps     " << plan.steps << "\n\n";
  out << std::setw(5) << "step" << std::setw(10) << "sigma" << std::setw(10) << "to" << std::setw(6) << "kind"
      << std::setw(8) << "branch" << std::setw(13) << "evaluations" << std::setw(10) << "edges" << '\n';
  out << std::fixed << std::setprecision(4);
  for (int s = 0; s < plan.steps; ++s) {
    const auto i = static_cast<std::size_t>(s);
    out << std::setw(5) << s << std::setw(10) << schedule.sigma(s) << std::setw(10) << schedule.sigma(s + 1)
        << std::setw(6) << to_string(plan.kinds[i]) << std::setw(8) << plan.branching[i] << std::setw(13)
        << report.nodes_per_depth[i] << std::setw(10) << report.edges_per_step[i] << '\n';
  }
  out << '\n'
      << "leaves                " << report.leaves << '\n'
      << "nodes                 " << report.nodes << '\n'
      << "evaluations           " << report.evaluations << '\n'
      << "edges                 " << report.edges << " (" << report.sde_edges << " sde, " << report.ode_edges
      << " ode)\n"
      << std::defaultfloat << std::setprecision(6) << "evaluations per leaf  " << report.evaluations_per_leaf << '\n'
      << "edges per leaf        " << report.edges_per_leaf << '\n';
}

nlohmann::json to_json(const std::string& topology, const tree_plan& plan, const tree_report& report,
                       const sigma_schedule& schedule) {
  std::vector<std::string> kinds;
  for (const edge_kind kind : plan.kinds) kinds.emplace_back(to_string(kind));
  return {{"topology", topology},
          {"steps", plan.steps},
          {"roots", plan.roots},
          {"leaves", report.leaves},
          {"nodes", report.nodes},
          {"evaluations", report.evaluations},
          {"edges", report.edges},
          {"sde_edges", report.sde_edges},
          {"ode_edges", report.ode_edges},
          {"evaluations_per_leaf", report.evaluations_per_leaf},
          {"edges_per_leaf", report.edges_per_leaf},
          {"nodes_per_depth", report.nodes_per_depth},
          {"edges_per_step", report.edges_per_step},
          {"branching", plan.branching},
          {"kinds", kinds},
          {"sigmas", std::vector<double>(schedule.values().begin(), schedule.values().end())}};
}

// The whole output in one write, checked at once: the system's reason for a failure (errno) is known only right
// after the failing write, not at the final check (main.cpp) when the output was larger than stdout's buffer.
void print_checked(std::string_view text) {
  std::cout << text << std::flush;
  if (!std::cout) throw write_error("standard output", "cannot write", errno);
}

// Flow-GRPO-Fast's flags against --steps, named as the flags (the core's checks name its fields: sde_steps).
// Their own ranges are checked as they are parsed. Example: --steps 20 --split-step 18 --sde-steps 5 ->
// "--sde-steps = 5: from --split-step = 18 it runs past --steps = 20 (at most 2 SDE steps from step 18)".
void check_fast_flags(const tree_options& options) {
  check_step_count(options.steps);  // "at most 255 steps are supported, got N": the bounds below need a valid count
  require(options.split_step < options.steps, "--split-step = ", options.split_step,
          ": must be below --steps = ", options.steps);
  require(options.split_step + options.sde_steps <= options.steps, "--sde-steps = ", options.sde_steps,
          ": from --split-step = ", options.split_step, " it runs past --steps = ", options.steps, " (at most ",
          options.steps - options.split_step, " SDE steps from step ", options.split_step, ")");
}

void run_tree(const tree_options& options) {
  if (options.use_fast) check_fast_flags(options);
  const any_topology topology = make_topology(options);
  const tree_plan plan = topology(options.steps);
  const sigma_schedule schedule = make_sigma_schedule(options);
  const tree_report report = make_tree_report(plan);
  const std::string description = std::visit([](const auto& t) { return describe(t); }, topology.policy);
  if (options.json) {
    print_checked(to_json(description, plan, report, schedule).dump() + '\n');
  } else {
    std::ostringstream table;  // 255 steps make a table larger than stdout's buffer
    print_table(table, description, plan, report, schedule);
    print_checked(table.str());
  }
}

}  // namespace

void add_tree_command(CLI::App& app) {
  auto options = std::make_shared<tree_options>();
  CLI::App* tree = app.add_subcommand("tree", "Print the shape and cost of one rollout tree of a topology");

  // Counts take the whole int range here: the core checks them (steps, branching, 2^24 leaves) with its messages.
  add_integer(tree, "--steps", options->steps, "Denoising steps, 1 to " + std::to_string(max_steps))
      ->type_name("N")
      ->capture_default_str();
  auto* schedule =
      tree->add_option("--schedule", options->schedule,
                       "Split schedule of the paper: dense {0,3,6,9}, mixed {0,4,8,12}, sparse {0,5,10,15}")
          ->check(CLI::IsMember({"dense", "mixed", "sparse"}))
          ->capture_default_str();
  auto* split_steps = add_integer_list(tree, "--split-steps", options->split_steps, "Split steps, e.g. 0,3,6,9")
                          ->type_name("S,S,...")
                          ->excludes(schedule);
  auto* branching = add_integer_list(tree, "--branching", options->branching,
                                     "Branching factor K for every split, or one factor per split step, e.g. 4,2,2,1")
                        ->type_name("K[,K...]")
                        ->default_str("2");
  auto* seq =
      add_integer(tree, "--sequential", options->sequential_group,
                  "DanceGRPO baseline: G independent SDE chains instead of a tree", 1, std::numeric_limits<int>::max())
          ->type_name("G");
  tree->add_option("--shared-root", options->shared_root,
                   "With --sequential: the chains share their initial latent, whose first step is evaluated once")
      ->type_name("true|false")
      ->default_str("true")
      ->needs(seq);
  // Flow-GRPO-Fast's sizes are checked here and against --steps (check_fast_flags), each naming its flag.
  auto* fast = add_integer(tree, "--flow-grpo-fast", options->fast_group,
                           "Flow-GRPO-Fast: ODE prefix, one SDE split into G at --split-step, ODE after", 1,
                           std::numeric_limits<int>::max())
                   ->type_name("G");
  auto* split_step = add_integer(tree, "--split-step", options->split_step,
                                 "With --flow-grpo-fast: the split step, below --steps", 0, max_steps - 1)
                         ->type_name("S")
                         ->needs(fast);
  add_integer(tree, "--sde-steps", options->sde_steps,
              "With --flow-grpo-fast: SDE steps from the split step on (the split included), at most --steps - "
              "--split-step",
              1, max_steps)
      ->type_name("W")
      ->capture_default_str()
      ->needs(fast);
  fast->needs(split_step);
  for (CLI::Option* tree_option : {schedule, split_steps, branching}) {
    seq->excludes(tree_option);
    fast->excludes(tree_option);
  }
  seq->excludes(fast);
  auto* sigmas = add_number_list(tree, "--sigmas", options->sigmas,
                                 "Noise levels, steps + 1 values, strictly decreasing in [0, 1], e.g. 1,0.5,0")
                     ->type_name("X,X,...");
  add_number(tree, "--shift", options->shift, "SD3 time shift of the default linear schedule 1 -> 0", 1e-3, 1e3)
      ->type_name("S")
      ->capture_default_str()
      ->excludes(sigmas);
  tree->add_flag("--json", options->json, "Print one JSON object instead of a table");

  tree->callback([options, seq, fast] {
    options->use_sequential = seq->count() > 0;
    options->use_fast = fast->count() > 0;
    run_tree(*options);
  });
}

}  // namespace branchgrpo::cli
