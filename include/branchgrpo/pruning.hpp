#pragma once
// Pruning policies: which edges of the rollout forest are back-propagated (docs/pruning.md).
// Pruning runs after fusion and normalization and leaves rollouts unchanged (except a RolloutShaper, which
// also reshapes the next rollout). A pruner returns an edge_mask: mask[n] == 1 trains the edge into node n;
// roots and ODE edges are always 0. "Edge depth" is the depth of the edge's parent = its step.
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
//   all_of         Intersection of several pruners (prune_all(p, q, ...)); shapes when any member shapes.
//   all_in         Intersection of a run-time list of pruners of one type (any_pruner_choice from a config).
//   active_for     A pruner for the first fraction of the run, every SDE edge afterwards.
//
// A pruner is any copyable type with `edge_mask operator()(const rollout_tree&, const prune_context&) const`
// (concept Pruner); one that also has `tree_plan shape(const tree_plan&, int iteration) const` is a
// RolloutShaper. shape_plan(pruner, plan, iteration) shapes with any pruner (unchanged if it does not shape).
// The list of these policies is pruner_policies (catalog.hpp); any_pruner is a run-time list of them.
#include "branchgrpo/pruning/catalog.hpp"
#include "branchgrpo/pruning/combinators.hpp"
#include "branchgrpo/pruning/concept.hpp"
#include "branchgrpo/pruning/depth_window.hpp"
#include "branchgrpo/pruning/extreme.hpp"
#include "branchgrpo/pruning/keep_all.hpp"
#include "branchgrpo/pruning/parent_top_k.hpp"
#include "branchgrpo/pruning/sde_window.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
