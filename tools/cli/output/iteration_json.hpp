#pragma once
// One training iteration's statistics as a JSON object, the shared part of `toy --json` lines and `train`'s
// metrics.jsonl (each adds its own keys: the toy its method, train the gradient norm and each reward's mean).
// Torch-free, so the toy shares it.
#include <nlohmann/json.hpp>

#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo::cli {

/// The trainer's iteration_stats by name (keys sorted by nlohmann; a NaN is written as null).
/// Example: stats of iteration 3 with reward_mean 0.5 -> {"clip_fraction": ..., "iteration": 3, ...,
///   "reward_mean": 0.5, ...}.
inline nlohmann::json iteration_stats_json(const iteration_stats& s) {
  return {{"iteration", s.iteration},
          {"reward_mean", s.reward_mean},
          {"reward_std", s.reward_std},
          {"reward_min", s.reward_min},
          {"reward_max", s.reward_max},
          {"evaluations", s.rollout_evaluations},
          {"evaluations_saved", s.rollout_evaluations_saved},
          {"update_evaluations", s.update_evaluations},
          {"edges", s.edges},
          {"edges_trained", s.edges_trained},
          {"trees_dropped", s.trees_dropped},
          {"loss", s.loss},
          {"clip_fraction", s.clip_fraction},
          {"seconds", s.seconds},
          {"rollout_seconds", s.rollout_seconds},
          {"reward_seconds", s.reward_seconds},
          {"update_seconds", s.update_seconds}};
}

}  // namespace branchgrpo::cli
