#pragma once
/// ZeRO-2's reduction during the backward pass (gradient_modes::zero2): the gradient reaches each element's owner
/// bucket by bucket as the backward pass makes it, so that no rank holds the whole gradient.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/collectives.hpp"
#include "branchgrpo/training/sharding.hpp"

namespace branchgrpo::gradient_modes {

/// ZeRO-2's reduction during the backward pass (sharding_mode::gradients). The trainable tensors, taken in a
/// reduction order, are cut into buckets of `bucket` float32 elements; the buckets are reduced in that order, the
/// same on every rank, so that the ranks' collectives match whatever order their hooks fire in.
/// A tensor's hook only records that its gradient is coming; at the next hook (its accumulation into .grad is done
/// by then) or at the end of the backward pass the gradient is added into its buckets and the tensor's .grad is
/// released. A bucket whose tensors have all been taken is reduced at once, each rank's part of it (the elements in
/// its range of the flat buffer) to that rank, which adds it into `owned`, the float32 sums of its range over the
/// update's backward passes. So a rank holds its range's sums, the buckets still waiting for a tensor, and one
/// tensor's gradient: not the whole gradient.
/// The reduction order starts as the tensors' reverse order (the backward pass makes the last layers' gradients
/// first) and, after the first update in which a rank ran a backward pass, becomes the order rank 0's (or the first
/// such rank's) hooks fired in, agreed on by one all-gather inside an update's reduction (learn_order): then no
/// bucket waits for a tensor that comes late (a block's modulation, whose gradient comes after its MLP's).
/// Every rank must run the same number of backward passes per update (pad(): one with no gradient).
/// Example: trainable tensors [3] and [2] on 2 ranks, bucket 2 -> the reverse order cuts buckets {t1[0, 2)},
///   {t0[0, 2)}, {t0[2, 3)}; after a backward pass rank 0's owned holds the ranks' sums of t0[0, 3), rank 1's
///   those of t1[0, 2).
/// @pre every rank runs the same number of backward passes per update; `communicator` outlives the reducer.
template <Communicator C>
struct backward_reducer {
  C* communicator = nullptr;  // the group the shard is of
  flat_shard shard;
  std::vector<std::int64_t> offsets, sizes;  // each trainable tensor's first flat element and element count
  std::vector<torch::Tensor> parameters;     // the model's trainable tensors (their .grad is taken and released)
  std::int64_t bucket = 1;
  torch::TensorOptions options;  // float32 (the master dtype) on the tensors' device
  torch::Tensor owned;           // [shard.count()]: this rank's sums since the last update
  bool active = false;           // inside one of the policy's backward passes
  double peak = 0;               // the most bytes held at once (buckets, owned, .grad waiting to be taken)

  /// Cuts the buckets along `order` (every tensor once).
  void plan(std::vector<std::size_t> order) {
    order_ = std::move(order);
    segments_.clear();
    where_.assign(sizes.size(), {});
    std::int64_t filled = bucket;  // the current bucket's elements
    for (const std::size_t i : order_)
      for (std::int64_t begin = 0; begin < sizes[i];) {
        if (filled == bucket) {
          segments_.emplace_back();
          filled = 0;
        }
        const std::int64_t length = std::min(sizes[i] - begin, bucket - filled);
        where_[i].emplace_back(segments_.size() - 1, segments_.back().size());
        segments_.back().push_back({.tensor = i, .begin = begin, .length = length, .at = filled});
        begin += length;
        filled += length;
      }
  }
  /// The first plan: the tensors' reverse order.
  void plan_reverse() {
    std::vector<std::size_t> order(sizes.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
    plan(std::move(order));
  }
  /// At an update's reduction (every rank, once per update): until it has, adopt the order in which the first rank
  /// that ran a backward pass saw its gradients come (tensors it never saw, after them in reverse order). One
  /// all-gather, the first time only.
  void learn_order() {
    if (learned_) return;
    const auto n = static_cast<std::int64_t>(sizes.size());
    torch::Tensor mine = torch::full({n}, -1.0, torch::TensorOptions().dtype(torch::kFloat64));
    for (std::size_t k = 0; k < observed_.size(); ++k) mine[static_cast<std::int64_t>(k)] = double(observed_[k]);
    torch::Tensor all = mine;
    if (shard.size > 1) {
      all = torch::empty({n * shard.size}, mine.options());
      detail::all_gather_tensor(*communicator, mine, all);
    }
    const auto seen = all.accessor<double, 1>();
    for (int r = 0; r < shard.size; ++r) {
      if (seen[r * n] < 0) continue;  // rank r ran no backward pass yet
      std::vector<std::size_t> order;
      std::vector<bool> placed(sizes.size(), false);
      for (std::int64_t k = 0; k < n && seen[r * n + k] >= 0; ++k) {
        order.push_back(static_cast<std::size_t>(seen[r * n + k]));
        placed[order.back()] = true;
      }
      for (std::size_t k = sizes.size(); k-- > 0;)
        if (!placed[k]) order.push_back(k);
      plan(std::move(order));
      learned_ = true;
      return;
    }
  }

  void begin() {
    waiting_.assign(segments_.size(), 0);
    buckets_.assign(segments_.size(), torch::Tensor());
    for (std::size_t b = 0; b < segments_.size(); ++b) waiting_[b] = static_cast<int>(segments_[b].size());
    taken_.assign(sizes.size(), false);
    pending_.clear();
    next_ = 0;
    if (!owned.defined()) owned = torch::zeros({shard.count()}, options);
    active = true;
  }
  // The hook of tensor i: its gradient is on its way into .grad.
  void hook(std::size_t i) {
    if (!active) return;
    take_pending();
    pending_.push_back(i);
    note();
  }
  // The end of the backward pass: every gradient taken, every bucket reduced (zeros where none came).
  void finish() {
    take_pending();
    note();
    while (next_ < segments_.size()) reduce(next_++);
    active = false;
    observing_ = observing_ && observed_.empty();  // one backward pass's order is the one to learn
  }
  // A backward pass without gradient: the same collectives, zeros (a rank with fewer edges than another).
  void pad() {
    begin();
    finish();
  }
  [[nodiscard]] double held_bytes() const {
    double bytes = owned.defined() ? static_cast<double>(owned.nbytes()) : 0.0;
    for (const torch::Tensor& b : buckets_)
      if (b.defined()) bytes += static_cast<double>(b.nbytes());
    for (const std::size_t i : pending_)
      if (parameters[i].grad().defined()) bytes += static_cast<double>(parameters[i].grad().nbytes());
    return bytes;
  }

 private:
  // A tensor's elements [begin, begin + length) at element `at` of its bucket.
  struct segment {
    std::size_t tensor = 0;
    std::int64_t begin = 0, length = 0, at = 0;
  };

  void note() { peak = std::max(peak, held_bytes()); }
  // Adds the .grad of every tensor whose hook fired into its buckets, releases it, and reduces the buckets that are
  // complete. A tensor whose .grad is not there yet (a hook for a gradient that is not accumulated: a recomputing
  // block's inner grad() under LibTorch 2.x) stays pending until it is.
  void take_pending() {
    torch::NoGradGuard no_grad;
    std::vector<std::size_t> still;
    for (const std::size_t i : pending_) {
      const torch::Tensor grad = parameters[i].grad();
      if (!grad.defined()) {
        still.push_back(i);
        continue;
      }
      if (!taken_[i]) {
        const torch::Tensor flat = grad.detach().reshape({-1}).to(options);
        for (const auto& [b, k] : where_[i]) {
          const segment& piece = segments_[b][k];
          torch::Tensor& sums = buckets_[b];
          if (!sums.defined()) sums = torch::zeros({bucket_length(b)}, options);
          sums.narrow(0, piece.at, piece.length).add_(flat.narrow(0, piece.begin, piece.length));
          --waiting_[b];
        }
        taken_[i] = true;
        if (observing_) observed_.push_back(i);
      }
      parameters[i].mutable_grad() = torch::Tensor();
    }
    pending_ = std::move(still);
    note();
    while (next_ < segments_.size() && waiting_[next_] == 0) reduce(next_++);
  }
  [[nodiscard]] std::int64_t bucket_length(std::size_t b) const {
    return segments_[b].back().at + segments_[b].back().length;
  }
  // Bucket b's sums (zeros where none came): each owner's elements packed in segment order, reduced to it, and added
  // into its `owned` at their places in its range.
  void reduce(std::size_t b) {
    torch::Tensor& sums = buckets_[b];
    if (!sums.defined()) sums = torch::zeros({bucket_length(b)}, options);
    struct part {
      std::int64_t at, flat, length;  // in the bucket, in the flat buffer
    };
    std::vector<std::vector<part>> owners(static_cast<std::size_t>(shard.size));
    for (const segment& piece : segments_[b]) {
      const std::int64_t first = offsets[piece.tensor] + piece.begin, last = first + piece.length;
      for (int owner = shard.owner(first); owner <= shard.owner(last - 1); ++owner) {
        const std::int64_t from = std::max(first, shard.chunk * owner), to = std::min(last, shard.chunk * (owner + 1));
        owners[static_cast<std::size_t>(owner)].push_back(
            {.at = piece.at + from - first, .flat = from, .length = to - from});
      }
    }
    for (int owner = 0; owner < shard.size; ++owner) {
      const std::vector<part>& parts = owners[static_cast<std::size_t>(owner)];
      if (parts.empty()) continue;
      std::vector<torch::Tensor> packed;
      for (const part& p : parts) packed.push_back(sums.narrow(0, p.at, p.length));
      torch::Tensor buffer = packed.size() == 1 ? packed.front() : torch::cat(packed);
      if (shard.size > 1) detail::reduce_tensor_to(*communicator, buffer, owner);
      if (owner != shard.rank) continue;
      std::int64_t at = 0;
      for (const part& p : parts) {
        owned.narrow(0, p.flat - shard.lo, p.length).add_(buffer.narrow(0, at, p.length));
        at += p.length;
      }
    }
    sums = torch::Tensor();
  }

  std::vector<std::size_t> order_;                                       // the reduction order of the tensors
  std::vector<std::vector<segment>> segments_;                           // per bucket, in the reduction order
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> where_;  // per tensor: its (bucket, segment)s
  bool learned_ = false;                                                 // order_ is the observed one
  bool observing_ = true;                                                // until a backward pass with gradients ended
  std::vector<std::size_t> observed_;   // the order this rank's gradients came in, in its first backward pass
  std::vector<torch::Tensor> buckets_;  // pending sums by bucket (undefined: none yet, or reduced)
  std::vector<int> waiting_;            // per bucket: segments whose tensor is not taken yet
  std::vector<bool> taken_;             // per tensor: its gradient of this backward pass is in its buckets
  std::vector<std::size_t> pending_;    // tensors whose hook fired and whose .grad is not taken yet
  std::size_t next_ = 0;                // the next bucket to reduce
};

}  // namespace branchgrpo::gradient_modes
