#pragma once
// Multi-process training: what the trainer needs from a process group, and the one-process group.
//
//   Communicator           concept: rank(), size(), all_reduce_sum of doubles, all_gather of bytes, barrier()
//   single_process         the group of one process (rank 0 of 1): every collective is a copy or nothing
//   all_gather_values      typed all_gather of equal-sized spans (doubles, 64-bit hashes), rank order
//   tree_share             which of an iteration's trees a rank rolls out (contiguous, near-equal shares)
//
// The c10d process group of LibTorch (Gloo on the CPU, NCCL on CUDA) models the concept in
// adapters/torch (branchgrpo/torch/distributed.hpp); the core never depends on it.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// A group of `size()` processes that run the same program in lockstep; every collective must be called by every
/// rank in the same order.
///   c.all_reduce_sum(values)       every rank's `values` become the element-wise sum over the ranks
///   c.all_gather(local, gathered)  gathered = the ranks' `local` bytes in rank order (equal sizes on all ranks)
///   c.barrier()                    returns when every rank reached it
template <class C>
concept Communicator = requires(C& c, const C& constant, std::span<double> values, std::span<const std::byte> local,
                                std::span<std::byte> gathered) {
  { constant.rank() } -> std::same_as<int>;
  { constant.size() } -> std::same_as<int>;
  c.all_reduce_sum(values);
  c.all_gather(local, gathered);
  c.barrier();
};

/// One process: rank 0 of 1. Every training call without a communicator uses it.
/// Example: single_process{}.all_gather of 8 bytes -> the same 8 bytes; all_reduce_sum leaves values unchanged.
struct single_process {
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  void all_reduce_sum(std::span<double>) {}
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
    require(gathered.size() == local.size(), "all_gather: ", gathered.size(), " bytes for 1 rank of ", local.size());
    std::copy(local.begin(), local.end(), gathered.begin());
  }
  void barrier() {}
};

/// The ranks' `local` values, concatenated in rank order.
/// Example: 2 ranks with local {1, 2} and {3, 4} -> {1, 2, 3, 4} on both.
/// @pre every rank passes the same local.size() (else the collective's own error).
template <class T, Communicator C>
requires std::is_trivially_copyable_v<T> std::vector<T> all_gather_values(C& communicator, std::span<const T> local) {
  std::vector<T> gathered(local.size() * static_cast<std::size_t>(communicator.size()));
  communicator.all_gather(std::as_bytes(local), std::as_writable_bytes(std::span<T>(gathered)));
  return gathered;
}

/// The trees [first, last) of an iteration's `trees` that rank `rank` of `size` rolls out: contiguous shares whose
/// sizes differ by at most one, in rank order, so the union over the ranks is every tree once.
/// Example: 5 trees on 2 ranks -> rank 0 [0, 2), rank 1 [2, 5); 1 tree on 2 ranks -> rank 0 empty, rank 1 [0, 1).
struct tree_share {
  std::int64_t first = 0, last = 0;

  [[nodiscard]] static tree_share of(std::int64_t trees, int rank, int size) {
    require(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " is not in a group of ", size);
    return {.first = trees * rank / size, .last = trees * (rank + 1) / size};
  }
  [[nodiscard]] std::int64_t count() const { return last - first; }
  [[nodiscard]] bool contains(std::int64_t tree) const { return tree >= first && tree < last; }
};

}  // namespace branchgrpo
