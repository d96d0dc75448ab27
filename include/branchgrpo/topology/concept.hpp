#pragma once
#include <concepts>

#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

/// A topology policy turns a number of denoising steps into the plan of one rollout tree.
template <class T>
concept Topology = std::regular<T> && requires(const T& topology, int steps) {
  { topology(steps) } -> std::same_as<tree_plan>;
};

}  // namespace branchgrpo
