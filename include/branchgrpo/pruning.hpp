#pragma once
// Pruning policies: which edges of the rollout forest are back-propagated (docs/pruning.md).
// Pruning runs after fusion and normalization and leaves rollouts unchanged (except a RolloutShaper, which
// also reshapes the next rollout, and a RolloutCutter, which stops sampling branches during it). A pruner returns an
// edge_mask: mask[n] == 1 trains the edge into node n; roots and ODE edges are always 0. "Edge depth" is the depth of
// the edge's parent = its step.
//
//   keep_all       No pruning: every non-root edge (DanceGRPO, plain BranchGRPO).
//   depth_window   DepPru: skip a window of edge depths [w, w + width), w = start + direction * (i / every)
//                  (start -1: the last split; paper: width 4, sliding one step later every 30 iterations;
//                  official code: sliding earlier down to a stop depth), or a fixed set of depths.
//                  Use to cut backward cost where late steps add little.
//   parent_top_k   WidPru Parent-Top-k: below the last split depth L keep only the subtrees of the k best
//                  children (fused reward) of each parent at L. Use for the paper's WidPru (k = 1).
//   extreme        WidPru Extreme-b: below L keep only the chains of the b best and b worst leaves per tree.
//                  Use to keep the strongest contrast at half the backward cost of the tail.
//   sde_window     MixGRPO / BranchGRPO-Mix: SDE window [w, w + width), w = start + stride * (i / every),
//                  clamped; splits stay SDE, ODE elsewhere (shape), train the window's SDE edges (and the
//                  split edges). Use for the cheapest rollouts (ODE steps skip noise and training).
//   value          Value pruning during the rollout: at one step (default: the last split) each tree keeps its
//                  `keep` frontier nodes with the best reward on x0-hat = x - sigma v and stops sampling below the
//                  others, which keep their value as leaf reward (or drop out of the update). Use to save the
//                  evaluations of branches that were going to lose (80 of the dense tree's 203 at keep 4).
//   all_of         Intersection of several pruners (prune_all(p, q, ...)); shapes when any member shapes.
//   all_in         Intersection of a run-time list of pruners of one type (any_pruner_choice from a config).
//   active_for     A pruner for the first fraction of the run, every SDE edge afterwards.
//
// A pruner is any copyable type with `edge_mask operator()(const rollout_tree&, const prune_context&) const`
// (concept Pruner); one that also has `tree_plan shape(const tree_plan&, int iteration) const` is a
// RolloutShaper, one with `rollout_cut rollout_cut(const tree_plan&, int iteration) const` a RolloutCutter.
// shape_plan(pruner, plan, iteration) shapes with any pruner (unchanged if it does not shape); rollout_cut_of gives
// its cut (none if it does not cut).
// The list of these policies is pruner_policies (catalog.hpp); any_pruner is a run-time list of them.
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/pruning/depth_window.hpp"
#include "branchgrpo/pruning/extreme.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/pruning/parent_top_k.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/pruning/value.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
