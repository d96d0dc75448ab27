#pragma once
// Umbrella header of the branchgrpo core: every component family, the rollout engine and the trainer.
// The core depends only on the standard library and Random123. Backends beyond the std::vector reference
// live in adapters/ (<branchgrpo/eigen/backend.hpp>, <branchgrpo/xtensor/backend.hpp>, ...); the toy model
// used by tests and the CPU demo is in <branchgrpo/toy.hpp>.
#include "branchgrpo/advantage.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/correlator.hpp"
#include "branchgrpo/fusion.hpp"
#include "branchgrpo/loss.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/pruning.hpp"
#include "branchgrpo/reward.hpp"
#include "branchgrpo/rollout.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/stepper_catalog.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/topology.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/loop.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/optimizer_options.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "branchgrpo/tree/leaf_rewards.hpp"
#include "branchgrpo/tree/levels.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"
