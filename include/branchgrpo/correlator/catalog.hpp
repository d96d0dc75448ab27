#pragma once
// The noise correlators as one list (core/policy_list.hpp), the default first; any_correlator chooses one at run
// time.
#include "branchgrpo/core/policy_list.hpp"
#include "branchgrpo/correlator/antithetic.hpp"
#include "branchgrpo/correlator/correlated.hpp"
#include "branchgrpo/correlator/independent.hpp"
#include "branchgrpo/correlator/orthogonal.hpp"
#include "branchgrpo/correlator/scaled.hpp"

namespace branchgrpo {

using correlator_policies = policy_list<"correlator", correlated, independent, antithetic, orthogonal, scaled>;

/// One of the noise correlators, chosen at run time. Default: correlated{.s = 4}.
using any_correlator = any_policy<correlator_policies>;

}  // namespace branchgrpo
