#pragma once
// One training iteration of the toy model (branchgrpo/toy.hpp) as the extension tests run a recipe: 4 prompts (the
// toy's modes 0-3), the shifted linear schedule of 20 steps, the mode reward, training seed 5.
// Example: one_toy_iteration(branch_method(), policy).edges_trained == 218 * 4 (4 dense trees of 218 edges).
#include <cstdint>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"
#include "branchgrpo/toy.hpp"

namespace branchgrpo::testing {

template <class Recipe, class Model>
iteration_stats one_toy_iteration(Recipe recipe, Model& policy) {
  mode_reward<> reward;
  host_backend backend;
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3};
  return train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), toy_latent_shape(), prompts, 0,
                         training_options{.seed = 5});
}

}  // namespace branchgrpo::testing
