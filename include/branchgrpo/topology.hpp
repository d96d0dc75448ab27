#pragma once
// Topology policies: the shape of the G rollouts of one prompt (docs/topology.md).
//
//   split_schedule  BranchGRPO tree: split steps and a branching factor per split (any K >= 1).
//                   Named schedules dense {0,3,6,9} (the paper's default, 203 evaluations for 16 leaves
//                   over 20 steps), mixed {0,4,8,12}, sparse {0,5,10,15}. Use for BranchGRPO and its variants.
//   sequential      DanceGRPO / Flow-GRPO: G independent chains (305 or 320 evaluations for G = 16 over 20
//                   steps, with or without a shared root). Use as the baseline.
//   flow_grpo_fast  ODE prefix, one SDE split into G, ODE after. Use for cheap Flow-GRPO-Fast rollouts.
//   adaptive_branching  Per prompt, how many of an envelope's splits branch (the last j of S), from the prompt's
//                   reward spread and gain in earlier iterations, under a budget of evaluations per prompt
//                   (stateful, checkpointed). Use to spend the rollout on the prompts whose leaves disagree.
//
// A topology is any regular type with `tree_plan operator()(int steps) const` (concept Topology); one that also has
// split_levels and observe is an AdaptiveTopology (trees of different shapes in one iteration).
// The list of these policies is topology_policies (catalog.hpp), and any_topology chooses one of them at run time.
#include "branchgrpo/topology/adaptive_branching.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/topology/concept.hpp"
#include "branchgrpo/topology/flow_grpo_fast.hpp"
#include "branchgrpo/topology/sequential.hpp"
#include "branchgrpo/topology/split_schedule.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
