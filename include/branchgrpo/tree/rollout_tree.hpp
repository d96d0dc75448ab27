#pragma once
// The rollout forest: T trees of one plan, stored as a flat structure of arrays (no pointer nodes).
//
// Node order: tree-major; inside a tree breadth-first, so the nodes of one depth are contiguous, the
// children of a node are contiguous, and the leaves under any node form a contiguous run of leaves().
// Node n of tree t has local index n - t * nodes_per_tree(); the local index keys its noise.
// The edge into node n (from parent(n)) is "edge n": its kind, log-prob and advantage live at index n.
// Depth counts edges from the root; roots sit at step 0, so depth(n) == step(n) and edge n is the
// transition of step step(parent(n)).
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/tree/tree_plan.hpp"

namespace branchgrpo {

inline constexpr std::int32_t no_parent = -1;

/// What identifies a tree outside the forest: its global index (noise key; offset by rank in
/// multi-process training) and the prompt it was sampled for (groups for per-prompt normalizers).
struct tree_info {
  std::uint32_t key = 0;
  std::int64_t prompt = 0;
  friend bool operator==(const tree_info&, const tree_info&) = default;
};

/// A half-open range of node indices.
struct node_range {
  std::int32_t begin = 0;
  std::int32_t end = 0;
  [[nodiscard]] std::int32_t size() const { return end - begin; }
  [[nodiscard]] bool contains(std::int32_t node) const { return node >= begin && node < end; }
  friend bool operator==(const node_range&, const node_range&) = default;
};

class rollout_tree {
 public:
  /// Builds T = trees.size() trees of `plan`.
  /// Example: plan {steps 2, roots 1, branching {2, 1}} and one tree -> 5 nodes: root 0, children 1 2
  /// (step 1), leaves 3 4 (step 2) with parent(3) == 1, parent(4) == 2; leaves() == {3, 4}.
  /// @pre validate(plan) passes; trees is not empty; total nodes < 2^31.
  rollout_tree(tree_plan plan, std::vector<tree_info> trees) : plan_(std::move(plan)), trees_(std::move(trees)) {
    validate(plan_);
    require(!trees_.empty(), "a rollout needs at least one tree");
    const std::int64_t per_tree = plan_.node_count();
    const auto tree_count = static_cast<std::int64_t>(trees_.size());
    require(per_tree * tree_count < (std::int64_t{1} << 31), "a forest of ", tree_count, " trees of ", per_tree,
            " nodes exceeds 2^31 nodes");
    nodes_per_tree_ = static_cast<std::int32_t>(per_tree);
    step_offset_.resize(static_cast<std::size_t>(plan_.steps) + 2);
    for (int s = 0; s <= plan_.steps; ++s)
      step_offset_[static_cast<std::size_t>(s) + 1] =
          step_offset_[static_cast<std::size_t>(s)] + static_cast<std::int32_t>(plan_.node_count_at_step(s));

    const auto total = static_cast<std::size_t>(per_tree * tree_count);
    parent_.assign(total, no_parent);
    step_.resize(total);
    first_child_.assign(total, 0);
    child_count_.assign(total, 0);
    sibling_rank_.assign(total, 0);
    kind_.assign(total, edge_kind::sde);
    log_prob_.assign(total, 0.0);
    leaf_first_.assign(total, 0);
    leaf_count_.assign(total, 0);

    for (std::int32_t t = 0; t < static_cast<std::int32_t>(tree_count); ++t) {
      const std::int32_t base = t * nodes_per_tree_;
      for (int s = 0; s <= plan_.steps; ++s) {
        const auto here = step_range_local(s);
        for (std::int32_t local = here.begin; local < here.end; ++local)
          step_[static_cast<std::size_t>(base + local)] = s;
        if (s == plan_.steps) break;
        const int factor = plan_.branching[static_cast<std::size_t>(s)];
        const std::int32_t next_begin = step_range_local(s + 1).begin;
        for (std::int32_t local = here.begin; local < here.end; ++local) {
          const auto node = static_cast<std::size_t>(base + local);
          first_child_[node] = base + next_begin + (local - here.begin) * factor;
          child_count_[node] = factor;
          for (int c = 0; c < factor; ++c) {
            const auto child = static_cast<std::size_t>(first_child_[node] + c);
            parent_[child] = static_cast<std::int32_t>(node);
            sibling_rank_[child] = c;
            kind_[child] = plan_.kinds[static_cast<std::size_t>(s)];
          }
        }
      }
    }
    // Leaves in node order; a node's leaves are contiguous, so a reverse sweep accumulates the runs.
    for (std::size_t n = 0; n < total; ++n)
      if (child_count_[n] == 0) {
        leaf_first_[n] = static_cast<std::int32_t>(leaves_.size());
        leaf_count_[n] = 1;
        leaves_.push_back(static_cast<std::int32_t>(n));
      }
    for (std::size_t n = total; n-- > 0;)
      if (child_count_[n] > 0) {
        const auto first = static_cast<std::size_t>(first_child_[n]);
        const auto last = first + static_cast<std::size_t>(child_count_[n]) - 1;
        leaf_first_[n] = leaf_first_[first];
        leaf_count_[n] = leaf_first_[last] + leaf_count_[last] - leaf_first_[first];
      }
  }

  // --- sizes -------------------------------------------------------------------------------------------
  [[nodiscard]] const tree_plan& plan() const { return plan_; }
  [[nodiscard]] int steps() const { return plan_.steps; }
  [[nodiscard]] std::int32_t node_count() const { return static_cast<std::int32_t>(parent_.size()); }
  [[nodiscard]] std::int32_t tree_count() const { return static_cast<std::int32_t>(trees_.size()); }
  [[nodiscard]] std::int32_t nodes_per_tree() const { return nodes_per_tree_; }
  [[nodiscard]] std::int32_t leaf_count() const { return static_cast<std::int32_t>(leaves_.size()); }
  [[nodiscard]] std::int32_t leaves_per_tree() const { return leaf_count() / tree_count(); }
  /// Denoiser evaluations of the whole forest: one per node with children.
  [[nodiscard]] std::int64_t evaluations() const { return plan_.evaluations() * tree_count(); }
  [[nodiscard]] std::int64_t edge_count() const { return plan_.edge_count() * tree_count(); }

  // --- per node ----------------------------------------------------------------------------------------
  [[nodiscard]] std::int32_t parent(std::int32_t n) const { return parent_[at(n)]; }
  [[nodiscard]] int step(std::int32_t n) const { return step_[at(n)]; }
  [[nodiscard]] int depth(std::int32_t n) const { return step_[at(n)]; }
  [[nodiscard]] std::int32_t tree(std::int32_t n) const { return n / nodes_per_tree_; }
  [[nodiscard]] std::int32_t local_index(std::int32_t n) const { return n % nodes_per_tree_; }
  [[nodiscard]] int sibling_rank(std::int32_t n) const { return sibling_rank_[at(n)]; }
  [[nodiscard]] bool is_root(std::int32_t n) const { return parent_[at(n)] == no_parent; }
  [[nodiscard]] bool is_leaf(std::int32_t n) const { return child_count_[at(n)] == 0; }
  [[nodiscard]] node_range children(std::int32_t n) const {
    return {first_child_[at(n)], first_child_[at(n)] + child_count_[at(n)]};
  }
  /// Kind of the edge into n (roots: sde, meaningless).
  [[nodiscard]] edge_kind kind(std::int32_t n) const { return kind_[at(n)]; }
  /// Log-prob of the edge into n under the sampling policy; 0 for roots and ODE edges.
  [[nodiscard]] double log_prob(std::int32_t n) const { return log_prob_[at(n)]; }
  [[nodiscard]] std::span<const double> log_probs() const { return log_prob_; }
  /// Written by the rollout engine.
  [[nodiscard]] std::span<double> mutable_log_probs() { return log_prob_; }
  [[nodiscard]] std::span<const edge_kind> kinds() const { return kind_; }
  [[nodiscard]] const tree_info& info(std::int32_t tree_index) const {
    return trees_.at(static_cast<std::size_t>(tree_index));
  }

  // --- queries -----------------------------------------------------------------------------------------
  /// All leaves in node order.
  [[nodiscard]] std::span<const std::int32_t> leaves() const { return leaves_; }
  /// Position of leaf node n in leaves() (for indexing leaf rewards).
  [[nodiscard]] std::int32_t leaf_position(std::int32_t n) const { return leaf_first_[at(n)]; }
  /// The leaves under n (n itself if it is a leaf), a contiguous run of leaves().
  [[nodiscard]] std::span<const std::int32_t> leaves_under(std::int32_t n) const {
    return std::span<const std::int32_t>(leaves_).subspan(static_cast<std::size_t>(leaf_first_[at(n)]),
                                                          static_cast<std::size_t>(leaf_count_[at(n)]));
  }
  /// Positions in leaves() of the leaves under n: [first, first + count).
  [[nodiscard]] node_range leaf_positions_under(std::int32_t n) const {
    return {leaf_first_[at(n)], leaf_first_[at(n)] + leaf_count_[at(n)]};
  }
  /// n, parent(n), ..., its root.
  [[nodiscard]] std::vector<std::int32_t> path_to_root(std::int32_t n) const {
    std::vector<std::int32_t> path;
    for (std::int32_t node = n; node != no_parent; node = parent(node)) path.push_back(node);
    return path;
  }
  /// The nodes of tree t at depth d, contiguous.
  [[nodiscard]] node_range nodes_at_depth(std::int32_t t, int d) const {
    require(t >= 0 && t < tree_count(), "tree ", t, " is outside [0, ", tree_count(), ")");
    require(d >= 0 && d <= steps(), "depth ", d, " is outside [0, ", steps(), "]");
    const auto local = step_range_local(d);
    return {t * nodes_per_tree_ + local.begin, t * nodes_per_tree_ + local.end};
  }
  /// Nodes at step s of every tree, tree-major: the frontier of step s.
  [[nodiscard]] std::vector<std::int32_t> nodes_at_step(int s) const {
    std::vector<std::int32_t> nodes;
    nodes.reserve(static_cast<std::size_t>(tree_count()) * static_cast<std::size_t>(step_range_local(s).size()));
    for (std::int32_t t = 0; t < tree_count(); ++t) {
      const auto range = nodes_at_depth(t, s);
      for (std::int32_t n = range.begin; n < range.end; ++n) nodes.push_back(n);
    }
    return nodes;
  }
  /// Edges of transition s (identified by their child nodes, at step s + 1), tree-major.
  [[nodiscard]] std::vector<std::int32_t> edges_at_step(int s) const {
    require(s >= 0 && s < steps(), "edge step ", s, " is outside [0, ", steps(), ")");
    return nodes_at_step(s + 1);
  }
  /// Row of node n among nodes_at_step(step(n)).
  [[nodiscard]] std::int32_t row_at_step(std::int32_t n) const {
    const auto local = step_range_local(step(n));
    return tree(n) * local.size() + (local_index(n) - local.begin);
  }
  /// The deepest depth whose nodes have more than one child, or -1 when no node splits.
  [[nodiscard]] int last_split_depth() const {
    const auto splits = plan_.branching_steps();
    return splits.empty() ? -1 : splits.back();
  }

 private:
  [[nodiscard]] std::size_t at(std::int32_t n) const {
    require(n >= 0 && n < node_count(), "node ", n, " is outside [0, ", node_count(), ")");
    return static_cast<std::size_t>(n);
  }
  [[nodiscard]] node_range step_range_local(int s) const {
    return {step_offset_[static_cast<std::size_t>(s)], step_offset_[static_cast<std::size_t>(s) + 1]};
  }

  tree_plan plan_;
  std::vector<tree_info> trees_;
  std::int32_t nodes_per_tree_ = 0;
  std::vector<std::int32_t> step_offset_;  // local index of the first node at each step, plus the end
  std::vector<std::int32_t> parent_, step_, first_child_, child_count_, sibling_rank_, leaf_first_, leaf_count_;
  std::vector<edge_kind> kind_;
  std::vector<double> log_prob_;
  std::vector<std::int32_t> leaves_;
};

/// Convenience: `count` trees with keys 0..count-1 and prompts 0..count-1.
inline std::vector<tree_info> numbered_trees(std::int32_t count) {
  require(count >= 1, "tree count must be at least 1, got ", count);
  std::vector<tree_info> trees(static_cast<std::size_t>(count));
  for (std::int32_t t = 0; t < count; ++t)
    trees[static_cast<std::size_t>(t)] = {.key = static_cast<std::uint32_t>(t), .prompt = t};
  return trees;
}

}  // namespace branchgrpo
