#pragma once
// The rollout forest: T trees of one plan, stored as a flat structure of arrays (no pointer nodes).
//
// Node order: tree-major; inside a tree breadth-first, so the nodes of one depth are contiguous, the
// children of a node are contiguous, and the leaves under any node form a contiguous run of leaves().
// Node n of tree t has local index n - t * nodes_per_tree(); the local index keys its noise.
// The edge into node n (from parent(n)) is "edge n": its kind, log-prob and advantage live at index n.
// Depth counts edges from the root; roots sit at step 0, so depth(n) == step(n) and edge n is the
// transition of step step(parent(n)).
//
// Stopped branches (rollout-time pruning, pruning/value.hpp): stop() ends the sampling below some nodes. A stopped
// node was sampled (and evaluated at its step); the nodes below it keep their indices, so the tree's shape, its
// leaves() and its noise keys do not change, but they are not sampled: they have no latent and no log-prob, the
// frontier of a step (nodes_at_step) holds only sampled nodes, and row_at_step counts only them. A leaf below a
// stopped node is a "phantom" leaf: its reward is the stopped node's value (leaf_value_source).
//
// Trees of different shapes (topology/adaptive_branching.hpp): leave_out() removes nodes before the rollout: a left-out
// node is the second or later child of a split, and with its subtree it is never sampled; its parent continues as
// a chain through its first child. The leaves below a left-out node are "mirror" leaves: each scores the sampled leaf
// at the same place under the first child (leaf_value_source), so a tree with a split left out is fused and
// normalized as its smaller shape, with its leaves repeated.
//
// Node values: a rollout with a value function (rollout/value_cut.hpp) records the value of the nodes it valued, a
// score of their predicted clean sample (set_values); a cut's stopped nodes and the dense rewards of the step_gain
// fusion read them.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
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
    sampled_.assign(total, 1);
    stopped_.assign(total, 0);
    valued_.assign(total, 0);
    left_out_.assign(total, 0);
    value_.assign(total, std::numeric_limits<double>::quiet_NaN());
    number_rows();
  }

  // --- sizes -------------------------------------------------------------------------------------------
  [[nodiscard]] const tree_plan& plan() const { return plan_; }
  [[nodiscard]] int steps() const { return plan_.steps; }
  [[nodiscard]] std::int32_t node_count() const { return static_cast<std::int32_t>(parent_.size()); }
  [[nodiscard]] std::int32_t tree_count() const { return static_cast<std::int32_t>(trees_.size()); }
  [[nodiscard]] std::int32_t nodes_per_tree() const { return nodes_per_tree_; }
  [[nodiscard]] std::int32_t leaf_count() const { return static_cast<std::int32_t>(leaves_.size()); }
  [[nodiscard]] std::int32_t leaves_per_tree() const { return leaf_count() / tree_count(); }
  /// Denoiser evaluations of the whole forest: one per sampled node of every step but the last and the skip steps
  /// (a stopped node too: it was evaluated at its step). Without stops, plan().evaluations() * tree_count().
  [[nodiscard]] std::int64_t evaluations() const {
    std::int64_t total = 0;
    for (int s = 0; s < plan_.steps; ++s)
      if (plan_.kinds[static_cast<std::size_t>(s)] != edge_kind::skip) total += sampled_at_step(s);
    return total;
  }
  /// Sampled edges: one into every sampled node but the roots. Without stops, plan().edge_count() * tree_count().
  [[nodiscard]] std::int64_t edge_count() const {
    std::int64_t total = 0;
    for (int s = 1; s <= plan_.steps; ++s) total += sampled_at_step(s);
    return total;
  }
  /// Sampled nodes at step s over every tree: the rows of the rollout's latents[s].
  [[nodiscard]] std::int32_t sampled_at_step(int s) const {
    require(s >= 0 && s <= steps(), "step ", s, " is outside [0, ", steps(), "]");
    return sampled_at_step_[static_cast<std::size_t>(s)];
  }

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
  /// Whether n was sampled: false exactly for the nodes below a stopped node and the left-out subtrees.
  [[nodiscard]] bool sampled(std::int32_t n) const { return sampled_[at(n)] != 0; }
  /// Whether the sampling stopped at n (stop()): n was sampled, its children were not.
  [[nodiscard]] bool stopped(std::int32_t n) const { return stopped_[at(n)] != 0; }
  /// Whether any node was stopped.
  [[nodiscard]] bool has_stops() const { return stops_ > 0; }
  /// Whether any node was stopped or left out: some leaves were not sampled.
  [[nodiscard]] bool has_unsampled_leaves() const { return stops_ > 0 || left_out_count_ > 0; }
  /// Whether n was given a value (set_values, stop), and that value (NaN when it was not, or the value is NaN).
  [[nodiscard]] bool valued(std::int32_t n) const { return valued_[at(n)] != 0; }
  [[nodiscard]] double value(std::int32_t n) const { return value_[at(n)]; }
  /// Whether any node was given a value.
  [[nodiscard]] bool has_values() const { return has_values_; }
  /// Whether n was left out of the rollout (leave_out) as the top of its unsampled subtree.
  [[nodiscard]] bool left_out(std::int32_t n) const { return left_out_[at(n)] != 0; }
  /// The node whose score a leaf's reward is: the leaf itself when it was sampled; below a stopped node, that node
  /// (its value); below a left-out node, the same place under the first child of the split (a mirror), resolved in
  /// turn.
  /// Example: the 2-step tree above with stop({1}, {0.4}) -> leaf_value_source(3) == 1, leaf_value_source(4) == 4;
  ///   with leave_out({2}) instead -> leaf_value_source(4) == 3.
  [[nodiscard]] std::int32_t leaf_value_source(std::int32_t leaf) const { return source_of(leaf); }
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
  /// Sampled nodes at step s of every tree, tree-major: the frontier of step s (every node without stops).
  [[nodiscard]] std::vector<std::int32_t> nodes_at_step(int s) const {
    std::vector<std::int32_t> nodes;
    nodes.reserve(static_cast<std::size_t>(sampled_at_step(s)));
    for (std::int32_t t = 0; t < tree_count(); ++t) {
      const auto range = nodes_at_depth(t, s);
      for (std::int32_t n = range.begin; n < range.end; ++n)
        if (sampled_[static_cast<std::size_t>(n)]) nodes.push_back(n);
    }
    return nodes;
  }
  /// Edges of transition s (identified by their child nodes, at step s + 1), tree-major.
  [[nodiscard]] std::vector<std::int32_t> edges_at_step(int s) const {
    require(s >= 0 && s < steps(), "edge step ", s, " is outside [0, ", steps(), ")");
    return nodes_at_step(s + 1);
  }
  /// Row of sampled node n among nodes_at_step(step(n)) (else invalid_input: an unsampled node has no row).
  [[nodiscard]] std::int32_t row_at_step(std::int32_t n) const {
    require(sampled(n), "node ", n, " was not sampled (below a stopped node, or left out): it has no latent");
    return row_[static_cast<std::size_t>(n)];
  }
  /// Records the values of sampled `nodes` (a value function's scores of their x0-hat; NaN: it could not score one).
  /// @pre nodes.size() == values.size(); every node sampled (else invalid_input naming it).
  /// @post valued(nodes[i]) and value(nodes[i]) is values[i] (bit for bit; NaN stays NaN).
  void set_values(std::span<const std::int32_t> nodes, std::span<const double> values) {
    require(nodes.size() == values.size(), "set_values: ", values.size(), " values for ", nodes.size(), " nodes");
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      require(sampled(nodes[i]), "node ", nodes[i], " was not sampled: it has no value");
      valued_[at(nodes[i])] = 1;
      value_[at(nodes[i])] = values[i];
    }
    has_values_ = has_values_ || !nodes.empty();
  }
  /// Leaves `nodes` out of the rollout, before it: each (a sampled child of rank >= 1 of a sampled parent, else
  /// invalid_input naming it) and its subtree are never sampled; its parent keeps its first child. Rows are
  /// renumbered.
  /// Example: the 2-step tree {steps 2, branching {2, 1}}, leave_out({2}) -> nodes_at_step(1) == {1},
  ///   nodes_at_step(2) == {3}, evaluations() == 2, leaf_value_source(4) == 3.
  void leave_out(std::span<const std::int32_t> nodes) {
    for (const std::int32_t n : nodes) {
      require(!is_root(n) && sampled(n) && sibling_rank(n) >= 1 && !stopped(parent(n)), "node ", n,
              " cannot be left out: it must be a sampled child of rank >= 1 (the first child carries the chain)");
      left_out_[at(n)] = 1;
      ++left_out_count_;
      unsample_from({n, n + 1});
    }
    number_rows();
  }
  /// Ends the sampling below `nodes` (each sampled, not a leaf, not already stopped, else invalid_input naming it):
  /// every node below them is marked unsampled, and each gets values[i] as its value (the reward of the phantom
  /// leaves below it). Rows at later steps are renumbered; rows at and above the stopped nodes' steps are unchanged.
  /// Example: plan {steps 2, roots 1, branching {2, 1}}, one tree, stop({1}, {0.4}) -> sampled(3) == false,
  ///   value(1) == 0.4, nodes_at_step(2) == {4}, row_at_step(4) == 0, evaluations() == 3 (root, 1 and 2),
  ///   edge_count() == 3, leaves() still {3, 4}.
  /// @pre nodes.size() == values.size().
  void stop(std::span<const std::int32_t> nodes, std::span<const double> values) {
    require(nodes.size() == values.size(), "stop: ", values.size(), " values for ", nodes.size(), " nodes");
    for (const std::int32_t n : nodes)
      require(sampled(n) && !is_leaf(n) && !stopped(n), "node ", n,
              " cannot stop: it must be a sampled, not yet stopped node with children");
    set_values(nodes, values);
    for (const std::int32_t n : nodes) {
      stopped_[at(n)] = 1;
      ++stops_;
      unsample_from(children(n));
    }
    number_rows();
  }

  /// What a rollout recorded on one tree beyond its log-probs, by local index: its valued nodes with their values,
  /// its stopped nodes and its left-out nodes. marks_of_tree reads it, mark_tree replays it on another forest of the
  /// same plan (the kept trees of an iteration, the forest gathered from every rank).
  struct tree_marks {
    std::vector<std::int32_t> valued = {};
    std::vector<double> values = {};
    std::vector<std::int32_t> stopped = {};
    std::vector<std::int32_t> left_out = {};
  };
  [[nodiscard]] tree_marks marks_of_tree(std::int32_t t) const {
    tree_marks out;
    if (!has_values_ && left_out_count_ == 0) return out;
    const std::int32_t base = t * nodes_per_tree_;
    for (std::int32_t n = base; n < base + nodes_per_tree_; ++n) {
      if (valued_[at(n)]) {
        out.valued.push_back(n - base);
        out.values.push_back(value_[at(n)]);
      }
      if (stopped_[at(n)]) out.stopped.push_back(n - base);
      if (left_out_[at(n)]) out.left_out.push_back(n - base);
    }
    return out;
  }
  /// @pre marks from marks_of_tree of a tree of the same plan; tree t has no marks yet.
  void mark_tree(std::int32_t t, const tree_marks& marks) {
    // The shape first (left-out subtrees), then the stops with their values, then every value.
    std::vector<std::int32_t> left, valued, stopped;
    for (const std::int32_t local : marks.left_out) left.push_back(t * nodes_per_tree_ + local);
    if (!left.empty()) leave_out(left);
    std::vector<double> stopped_values;
    for (const std::int32_t local : marks.valued) valued.push_back(t * nodes_per_tree_ + local);
    for (const std::int32_t local : marks.stopped) stopped.push_back(t * nodes_per_tree_ + local);
    for (const std::int32_t n : stopped) {
      const auto at_mark = std::find(valued.begin(), valued.end(), n) - valued.begin();
      stopped_values.push_back(marks.values[static_cast<std::size_t>(at_mark)]);
    }
    stop(stopped, stopped_values);
    set_values(valued, marks.values);
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
  // Marks the nodes of `top` (a range of one depth) and every node below them unsampled.
  void unsample_from(node_range top) {
    // The nodes below a contiguous range of one depth form one contiguous range per depth.
    for (node_range below = top; below.size() > 0;) {
      std::fill(sampled_.begin() + below.begin, sampled_.begin() + below.end, std::uint8_t{0});
      const std::int32_t last = below.end - 1;
      below = {first_child_[at(below.begin)], first_child_[at(last)] + child_count_[at(last)]};
    }
  }
  // leaf_value_source for any node: itself when sampled; else through its parent's source: a stopped node stays the
  // source, a sampled parent (n left out) is mirrored to its first child, a mirrored parent to the child of the same
  // rank (or its first, when that one was left out too).
  [[nodiscard]] std::int32_t source_of(std::int32_t n) const {
    if (sampled(n)) return n;
    const std::int32_t above = source_of(parent(n));
    if (stopped(above) || is_leaf(above)) return above;
    const std::int32_t first = first_child_[at(above)];
    const std::int32_t same = first + sibling_rank(n);
    return source_of(sibling_rank(n) < child_count_[at(above)] && sampled(same) ? same : first);
  }
  // Rows: each sampled node's position among the sampled nodes of its step, tree-major.
  void number_rows() {
    row_.assign(parent_.size(), -1);
    sampled_at_step_.assign(static_cast<std::size_t>(plan_.steps) + 1, 0);
    for (int s = 0; s <= plan_.steps; ++s) {
      std::int32_t row = 0;
      for (std::int32_t t = 0; t < tree_count(); ++t) {
        const node_range range = nodes_at_depth(t, s);
        for (std::int32_t n = range.begin; n < range.end; ++n)
          if (sampled_[static_cast<std::size_t>(n)]) row_[static_cast<std::size_t>(n)] = row++;
      }
      sampled_at_step_[static_cast<std::size_t>(s)] = row;
    }
  }

  tree_plan plan_;
  std::vector<tree_info> trees_;
  std::int32_t nodes_per_tree_ = 0;
  std::vector<std::int32_t> step_offset_;  // local index of the first node at each step, plus the end
  std::vector<std::int32_t> parent_, step_, first_child_, child_count_, sibling_rank_, leaf_first_, leaf_count_;
  std::vector<edge_kind> kind_;
  std::vector<double> log_prob_;
  std::vector<std::int32_t> leaves_;
  std::vector<std::uint8_t> sampled_, stopped_;  // stop(): sampled_ 0 below a stopped node, stopped_ 1 at it
  std::vector<std::uint8_t> valued_;             // set_values(): 1 at a valued node
  std::vector<double> value_;                    // a valued node's value, else NaN
  std::vector<std::uint8_t> left_out_;           // leave_out(): 1 at the top of a left-out subtree
  std::int64_t left_out_count_ = 0;
  bool has_values_ = false;
  std::vector<std::int32_t> row_;              // row among the sampled nodes of the node's step, -1 when unsampled
  std::vector<std::int32_t> sampled_at_step_;  // sampled nodes per step, over every tree
  std::int64_t stops_ = 0;
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
