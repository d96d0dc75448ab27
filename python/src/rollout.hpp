#pragma once
// One iteration's rollout for Python, as train_iteration's stage 1 runs it (the method's pruner-shaped plan, ODE where
// its stepper draws no noise, one tree per prompt keyed by its position, the given sigmas or the shifted linear
// schedule): on torch latents through python_torch_backend (run_rollout), or on the core's host_backend with v = a x
// computed in C++ (linear_reference: the tests' reference for the former).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/engine.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/run_recipe.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "forest.hpp"
#include "method.hpp"
#include "torch_backend.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

// --- The rollout -------------------------------------------------------------------------------------------------

// What a rollout returns to Python: the forest (as a Tree), the latents of every step (torch tensors, rows in the
// forest's order at that step), each node's log-prob and scoring std (numpy), the evaluation and call counts.
struct rollout_output {
  nb::object method;  ///< the Method (method_spec) it ran
  int steps = 0;
  bg::sigma_schedule schedule;  ///< the schedule it ran (credit's trained edges read their steps' sigmas from it)
  forest trees;
  std::vector<nb::object> latents;
  std::vector<double> log_probs, edge_std;
  std::int64_t evaluations = 0, denoiser_calls = 0;
};

struct rollout_request {
  const method_spec* method = nullptr;
  int steps = 20;
  double shift = 3.0;
  std::vector<double> sigmas;  ///< the schedule's steps + 1 values; empty: the shifted linear schedule (shift)
  std::vector<std::int64_t> prompts, latent;
  std::uint64_t seed = 0;
  std::uint32_t iteration = 0;
  std::int64_t max_batch = 64;
};

// The schedule of an iteration: `sigmas` when given (steps + 1 values, strictly decreasing from at most 1 to 0, as
// a diffusers pipeline's scheduler makes them), else the shifted linear schedule.
// Example: (2, 3.0, {}) -> {1, 0.75, 0}; (2, 3.0, {0.9, 0.4, 0}) -> {0.9, 0.4, 0}; (2, 3.0, {0.9, 0}) -> invalid_input
//   "sigmas has 2 values: needs steps + 1 = 3".
inline bg::sigma_schedule iteration_schedule(int steps, double shift, std::vector<double> sigmas) {
  if (sigmas.empty()) return bg::shifted_linear_schedule(steps, shift);
  bg::require(steps >= 1 && sigmas.size() == static_cast<std::size_t>(steps) + 1, "sigmas has ", sigmas.size(),
              " values: needs steps + 1 = ", steps + 1);
  bg::require(sigmas.back() == 0.0, "sigmas[", steps, "] = ", sigmas.back(), ": the schedule must end at 0");
  return bg::sigma_schedule(std::move(sigmas));
}

// The plan of one iteration of the request's method, as train_iteration's stage 1 makes it: shaped by the pruner at
// this iteration, ODE where the stepper draws no noise.
inline bg::tree_plan iteration_plan(const rollout_request& r, const bg::sigma_schedule& schedule) {
  const bg::run_recipe& recipe = r.method->recipe;
  return bg::ode_where_noiseless(bg::shape_plan(recipe.pruner, recipe.topology(r.steps), static_cast<int>(r.iteration)),
                                 recipe.stepper, schedule);
}

// One iteration's rollout as train_iteration's stage 1 does it: the method's plan shaped by its pruner at this
// iteration and made ODE where its stepper draws no noise, one tree per prompt keyed by its position, the request's
// schedule (iteration_schedule).
inline rollout_output run_rollout(const rollout_request& r, nb::object method, nb::object velocity, nb::object device,
                                  nb::object dtype) {
  bg::require(!r.prompts.empty(), "rollout: prompts is empty: give one prompt index per tree");
  const nb::object ops = nb::module_::import_("branchgrpo._torch_ops");
  bg::python::python_torch_backend backend{.ops = ops, .device = device, .dtype = dtype};
  bg::python::python_velocity denoiser{.ops = ops, .velocity = std::move(velocity), .iteration = r.iteration};
  const bg::latent_shape shape{r.latent};
  const bg::sigma_schedule schedule = iteration_schedule(r.steps, r.shift, r.sigmas);
  const bg::run_recipe& recipe = r.method->recipe;
  auto result = bg::rollout(backend, denoiser, recipe.stepper, recipe.correlator, schedule,
                            bg::rollout_tree(iteration_plan(r, schedule), bg::detail::iteration_trees(r.prompts)),
                            shape, {.max_batch = r.max_batch, .seed = r.seed, .iteration = r.iteration});
  return rollout_output{.method = std::move(method),
                        .steps = r.steps,
                        .schedule = schedule,
                        .trees = forest(result.tree),
                        .latents = std::move(result.latents),
                        .log_probs = {result.tree.log_probs().begin(), result.tree.log_probs().end()},
                        .edge_std = std::move(result.edge_std),
                        .evaluations = result.evaluations,
                        .denoiser_calls = result.denoiser_calls};
}

// The same rollout on the core's host_backend (float64) with the velocity v = a x computed in C++: the reference the
// package's tests hold rollout() to (every latent of every step, row-major doubles).
inline std::vector<std::vector<double>> linear_reference(const rollout_request& r, double a) {
  bg::host_backend backend;
  auto velocity = [&](const bg::host_tensor& x, const bg::denoise_batch&) { return backend.affine(a, x, 0.0, x); };
  const bg::latent_shape shape{r.latent};
  const bg::sigma_schedule schedule = iteration_schedule(r.steps, r.shift, r.sigmas);
  const bg::run_recipe& recipe = r.method->recipe;
  const auto result = bg::rollout(backend, velocity, recipe.stepper, recipe.correlator, schedule,
                                  bg::rollout_tree(iteration_plan(r, schedule), bg::detail::iteration_trees(r.prompts)),
                                  shape, {.max_batch = r.max_batch, .seed = r.seed, .iteration = r.iteration});
  std::vector<std::vector<double>> out;
  for (const bg::host_tensor& step : result.latents) out.push_back(step.values);
  return out;
}

}  // namespace branchgrpo::python
