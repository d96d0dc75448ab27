#pragma once
// Limits shared by the schedules, the tree plans and the noise keys, checked before anything is allocated.
#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// The most denoising steps a schedule or a plan may have: a step index fits the 8-bit step field of a noise key
/// (noise/keyed_normal.hpp), and per-level scratch arrays (tree/levels.hpp) have a fixed size.
inline constexpr int max_steps = 255;

/// Throws invalid_input unless 1 <= steps <= max_steps; schedules and topologies call it before they allocate
/// anything of that size. Example: check_step_count(2147483647) throws
/// "at most 255 steps are supported, got 2147483647".
inline void check_step_count(int steps) {
  require(steps >= 1, "the number of steps must be at least 1, got ", steps);
  require(steps <= max_steps, "at most ", max_steps, " steps are supported, got ", steps);
}

}  // namespace branchgrpo
