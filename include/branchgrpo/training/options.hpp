#pragma once
// The run-wide settings of a training iteration (train_iteration's training_options).
#include <cstdint>

#include "branchgrpo/loss/ppo.hpp"

namespace branchgrpo {

struct training_options {
  std::int64_t max_batch = 64;  ///< rows per denoiser call, in the rollout and in the update
  std::uint64_t seed = 0;
  int updates_per_iteration = 1;  ///< optimizer steps per iteration; the kept edges are split evenly
  int total_iterations = 1;       ///< planned length of the run (pruners active for a fraction of it)
  ppo_options loss = {};
};

}  // namespace branchgrpo
