#pragma once
// Parameter checks shared by the normalizers that divide by a standard deviation (depth_wise, leaf_group).
#include <cmath>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo::detail {

/// Throws invalid_input unless epsilon and min_std are finite, non-negative and not both 0 (0 / 0 on a flat
/// group); `policy` names the normalizer in the message.
/// Example: ("leaf_group", 1e-8, 1e-6) passes; ("leaf_group", 0, 0) throws
///   "leaf_group needs epsilon > 0 or min_std > 0 (both are 0)".
/// @pre policy is a null-terminated string.
/// @post epsilon and min_std are finite, >= 0, and at least one is > 0 (else invalid_input).
inline void check_scale_guards(const char* policy, double epsilon, double min_std) {
  require(std::isfinite(epsilon) && epsilon >= 0.0, policy, " epsilon ", epsilon, " is not a finite value >= 0");
  require(std::isfinite(min_std) && min_std >= 0.0, policy, " min_std ", min_std, " is not a finite value >= 0");
  require(epsilon > 0.0 || min_std > 0.0, policy, " needs epsilon > 0 or min_std > 0 (both are 0)");
}

}  // namespace branchgrpo::detail
