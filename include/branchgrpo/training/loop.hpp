#pragma once
// The training loop around train_iteration: which prompts each iteration trains (prompt_schedule) and the
// iterations themselves, with a hook after each one for logging, evaluation and checkpoints (train_loop).
#include <concepts>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_permutation.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

/// The prompts of each iteration. Iteration i trains positions p = i P + t (t < P) of the stream of prompts
/// that runs through the N prompts epoch after epoch: epoch p / N, its entry p mod N. Without shuffle the entry
/// is the row ((i P + t) mod N); with shuffle it is row keyed_permutation{N, seed, epoch}(p mod N), a new order
/// each epoch. Either way every prompt is trained once per epoch and the schedule is a pure function of the
/// iteration (resuming needs no state).
/// Example: prompt_schedule{.prompt_count = 12, .per_iteration = 2}(7) == {2, 3} ((7 * 2) mod 12 = 2); with
///   .shuffle = true, iterations 0..5 give each of the 12 rows once, in an order fixed by .seed.
/// @pre prompt_count >= 1, per_iteration >= 1, iteration >= 0 (else invalid_input naming the value).
/// @post result.size() == per_iteration, every entry in [0, prompt_count).
struct prompt_schedule {
  std::int64_t prompt_count = 1;   ///< N: the prompts are 0 .. N - 1 (rows of a prompt table)
  std::int64_t per_iteration = 1;  ///< P: trees per iteration
  bool shuffle = false;            ///< a seeded new order each epoch (data.shuffle)
  std::uint64_t seed = 0;          ///< the shuffle's key (run.seed)

  [[nodiscard]] std::vector<std::int64_t> operator()(int iteration) const {
    require(prompt_count >= 1, "prompt_schedule prompt_count must be at least 1, got ", prompt_count);
    require(per_iteration >= 1, "prompt_schedule per_iteration must be at least 1, got ", per_iteration);
    require(iteration >= 0, "prompt_schedule iteration must be non-negative, got ", iteration);
    std::vector<std::int64_t> prompts(static_cast<std::size_t>(per_iteration));
    for (std::int64_t t = 0; t < per_iteration; ++t) {
      const std::int64_t position = static_cast<std::int64_t>(iteration) * per_iteration + t;
      const std::int64_t entry = position % prompt_count;
      prompts[static_cast<std::size_t>(t)] =
          shuffle
              ? static_cast<std::int64_t>(keyed_permutation{
                    .size = static_cast<std::uint64_t>(prompt_count),
                    .seed = seed,
                    .stream = static_cast<std::uint64_t>(position / prompt_count)}(static_cast<std::uint64_t>(entry)))
              : entry;
    }
    return prompts;
  }
  friend bool operator==(const prompt_schedule&, const prompt_schedule&) = default;
};

/// Runs iterations first_iteration .. options.total_iterations - 1 of train_iteration on the schedule's prompts,
/// calling after_iteration(iteration, stats) after each; a hook returning bool stops the loop by returning false.
/// Example: train_loop(backend, toy, reward, recipe, schedule, shape, {.prompt_count = 8, .per_iteration = 2},
///   {.total_iterations = 3}, 0, log) trains prompts {0, 1}, {2, 3}, {4, 5} and calls log three times
///   (tests/unit/test_trainer.cpp); resuming from a checkpoint after iteration 1 is first_iteration = 2.
/// @pre 0 <= first_iteration <= options.total_iterations; the rest as train_iteration.
/// @post returns the number of iterations run.
template <Backend B, Policy<B> Model, Reward<B> Score, class Recipe, class Hook>
int train_loop(B& backend, Model& policy, Score& reward, Recipe& recipe, const sigma_schedule& schedule,
               const latent_shape& shape, const prompt_schedule& prompts, const training_options& options,
               int first_iteration, Hook&& after_iteration) {
  require(first_iteration >= 0 && first_iteration <= options.total_iterations, "first iteration ", first_iteration,
          " is not in [0, ", options.total_iterations, "]");
  int run = 0;
  for (int i = first_iteration; i < options.total_iterations; ++i) {
    const iteration_stats stats =
        train_iteration(backend, policy, reward, recipe, schedule, shape, prompts(i), i, options);
    ++run;
    if constexpr (std::is_same_v<std::invoke_result_t<Hook&, int, const iteration_stats&>, bool>) {
      if (!after_iteration(i, stats)) break;
    } else {
      after_iteration(i, stats);
    }
  }
  return run;
}

}  // namespace branchgrpo
