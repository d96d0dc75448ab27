#pragma once
// The one loop of every objective's update (stage 4 of an iteration, training/trainer.hpp). An objective decides
// what its rows are and what one policy call on a chunk of them accumulates; this header does the rest, once:
//   update_group_ends    the rows split into updates_per_iteration optimizer steps of near-equal size
//   rows_of_rank         this rank's rows of the global order, renumbered into its own trees, and its step ends
//   chunk_groups         each step's rows in chunks of one policy call (at most max_batch, rows that go together)
//   run_optimizer_steps  per step: padding calls for a collective accumulate, the chunks, the gradients' sum over
//                        the ranks, the optimizer step
//   finish_update        the partial sums of every rank reduced into the update_report
#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// A policy whose accumulated gradient can be summed over a process group: policy.all_reduce_gradients(c) replaces
/// the gradient buffer by its sum over c's ranks (called before every optimizer step with any communicator but
/// single_process).
template <class P, class C>
concept DataParallelPolicy = Communicator<C> && requires(P& policy, C& communicator) {
  policy.all_reduce_gradients(communicator);
};

/// What the update stage did.
struct update_report {
  std::int64_t evaluations = 0;          ///< policy rows (PPO, plus the KL term's and RatioNorm's when on)
  double loss = 0;                       ///< mean PPO loss over the trained edges (weighted; r_hat with ratio_norm)
  double clip_fraction = 0;              ///< fraction of trained edges whose ratio left [1 - eps, 1 + eps]
  double kl = 0;                         ///< mean KL to the reference over the trained edges (0 when kl_beta == 0)
  double first_update_log_prob_gap = 0;  ///< max |log-prob at the first update - the rollout's|
  std::int64_t rows = 0;                 ///< rows trained by all ranks: edges, or a decoupled objective's rows
};

/// The ends of the min(updates_per_iteration, rows) contiguous groups of near-equal size of `rows` rows.
/// Example: update_group_ends(218, 2) == {109, 218}; update_group_ends(3, 5) == {1, 2, 3}.
/// @pre rows >= 0, updates_per_iteration >= 1.
inline std::vector<std::size_t> update_group_ends(std::int64_t rows, int updates_per_iteration) {
  const auto groups = std::min<std::int64_t>(updates_per_iteration, rows);
  std::vector<std::size_t> ends;
  for (std::int64_t group = 0; group < groups; ++group)
    ends.push_back(static_cast<std::size_t>((group + 1) * rows / groups));
  return ends;
}

/// One rank's rows of an update and the ends of its optimizer steps among them.
template <class Row>
struct rank_rows {
  std::vector<Row> rows = {};
  std::vector<std::size_t> group_ends = {};
};

/// The rows of `all` (in the global update order) whose node `node_of(row)` lies in this rank's trees
/// [first_node, end_node), renumbered by -first_node, with the global optimizer steps' ends mapped among them.
/// One rank owns every tree: first_node 0, every row, the same ends.
/// Example: rows {0, 5, 1, 6} (nodes), ends {2, 4}, nodes [4, 8) -> rows {1, 2}, ends {1, 2}.
/// @pre global_ends ascending, the last == all.size(); node_of returns a reference into the row.
template <class Row, class NodeOf>
rank_rows<Row> rows_of_rank(std::span<const Row> all, std::span<const std::size_t> global_ends, std::int32_t first_node,
                            std::int32_t end_node, NodeOf node_of) {
  rank_rows<Row> out;
  std::size_t next_end = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    Row row = all[i];
    std::int32_t& node = node_of(row);
    if (node >= first_node && node < end_node) {
      node -= first_node;
      out.rows.push_back(row);
    }
    while (next_end < global_ends.size() && global_ends[next_end] == i + 1) {
      out.group_ends.push_back(out.rows.size());
      ++next_end;
    }
  }
  return out;
}

/// Rows [begin, end) of one policy call.
struct row_chunk {
  std::size_t begin = 0, end = 0;
  [[nodiscard]] std::size_t size() const { return end - begin; }
  friend bool operator==(const row_chunk&, const row_chunk&) = default;
};

/// The chunks of each optimizer step: runs of consecutive rows that `same_call(first, row)` joins to the run's
/// first row, of at most `per_call` rows, never across a step's end. The grouping into steps does not depend on
/// per_call (max_batch), only the chunks do.
/// Example: ends {3, 5}, per_call 2, same_call always true -> {{[0, 2), [2, 3)}, {[3, 5)}}.
/// @pre per_call >= 1; group_ends ascending.
template <class SameCall>
std::vector<std::vector<row_chunk>> chunk_groups(std::span<const std::size_t> group_ends, std::int64_t per_call,
                                                 SameCall same_call) {
  require(per_call >= 1, "an update needs at least one row per policy call, got ", per_call);
  std::vector<std::vector<row_chunk>> groups;
  std::size_t begin = 0;
  for (const std::size_t group_end : group_ends) {
    std::vector<row_chunk>& chunks = groups.emplace_back();
    while (begin < group_end) {
      std::size_t end = begin;
      while (end < group_end && static_cast<std::int64_t>(end - begin) < per_call && same_call(begin, end)) ++end;
      chunks.push_back({.begin = begin, .end = end});
      begin = end;
    }
  }
  return groups;
}

/// One rank's partial sums of an update, reduced over the ranks by finish_update.
struct update_sums {
  double loss = 0, kl = 0;
  std::int64_t clipped = 0, evaluations = 0;
  double first_update_log_prob_gap = 0;  ///< this rank's largest
};

namespace detail {

// The end of one optimizer step: `pads` empty accumulates (a rank with fewer calls than the busiest, for a policy
// whose accumulate is a collective), the sum of the ranks' gradients, the step. single_process is one rank by its
// type, and the sum over one rank is the gradient itself: nothing to call, so a policy without
// all_reduce_gradients trains alone. Any other communicator may have several ranks, so it always sums (a group of
// one at run time sums one gradient); the dispatch is on the type, never on size(), so the one-rank case runs the
// same code as any other.
template <class Model, Communicator Comm>
void finish_optimizer_step(Model& policy, Comm& communicator, double pads) {
  if constexpr (PaddedAccumulationPolicy<Model>)
    for (; pads > 0; --pads) policy.pad_accumulate();
  else
    (void)pads;
  if constexpr (!std::same_as<Comm, single_process>) {
    static_assert(DataParallelPolicy<Model, Comm>,
                  "training on more than one process needs a policy with all_reduce_gradients(communicator)");
    policy.all_reduce_gradients(communicator);
  } else {
    (void)communicator;
  }
  policy.apply_update();
}

}  // namespace detail

/// The optimizer steps of an update: for each group of chunks, `accumulate(chunk, group)` on every chunk, then the
/// gradients' sum over the ranks and the step. A policy whose accumulate is a collective (PaddedAccumulationPolicy)
/// first learns the busiest rank's number of calls, `calls_per_chunk(group)` per chunk, and pads up to it.
/// Example: groups {{[0, 2), [2, 3)}, {[3, 5)}} -> accumulate([0, 2), 0), accumulate([2, 3), 0), step,
///   accumulate([3, 5), 1), step.
/// @post the policy took groups.size() optimizer steps.
template <class Model, Communicator Comm, class CallsPerChunk, class Accumulate>
void run_optimizer_steps(Model& policy, Comm& communicator, const std::vector<std::vector<row_chunk>>& groups,
                         CallsPerChunk calls_per_chunk, Accumulate accumulate) {
  for (std::size_t group = 0; group < groups.size(); ++group) {
    double pads = 0;
    if constexpr (PaddedAccumulationPolicy<Model>) {
      double calls = 0;
      for (std::size_t c = 0; c < groups[group].size(); ++c) calls += calls_per_chunk(group);
      const std::vector<double> all = all_gather_values(communicator, std::span<const double>(&calls, 1));
      pads = *std::max_element(all.begin(), all.end()) - calls;
    } else {
      (void)calls_per_chunk;
    }
    for (const row_chunk& chunk : groups[group]) accumulate(chunk, group);
    detail::finish_optimizer_step(policy, communicator, pads);
  }
}

/// The update's report from every rank's partial sums: loss, KL and clip counts summed and scaled by `per_row`
/// (1 / rows of all ranks), evaluations summed, the largest first-update gap of any rank. On one rank the sums are
/// the rank's own (the counts are below 2^53, exact as doubles).
/// Example: one rank, sums {.loss = 2, .clipped = 1, .evaluations = 4}, per_row 0.25, rows 4 -> loss 0.5,
///   clip_fraction 0.25, evaluations 4, rows 4.
template <Communicator Comm>
update_report finish_update(Comm& communicator, const update_sums& partial, double per_row, std::int64_t rows) {
  std::array<double, 4> sums = {partial.loss, partial.kl, static_cast<double>(partial.clipped),
                                static_cast<double>(partial.evaluations)};
  communicator.all_reduce_sum(sums);
  const std::vector<double> gaps =
      all_gather_values(communicator, std::span<const double>(&partial.first_update_log_prob_gap, 1));
  return {.evaluations = static_cast<std::int64_t>(sums[3]),
          .loss = sums[0] * per_row,
          .clip_fraction = static_cast<double>(static_cast<std::int64_t>(sums[2])) * per_row,
          .kl = sums[1] * per_row,
          .first_update_log_prob_gap = *std::max_element(gaps.begin(), gaps.end()),
          .rows = rows};
}

}  // namespace branchgrpo
