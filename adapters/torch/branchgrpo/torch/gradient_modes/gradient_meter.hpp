#pragma once
// What a gradient mode measures of its gradient buffers (policy_memory's gradients and gradients_peak), and the
// byte count it measures with: each tensor's storage counted once, however many views share it.
#include <algorithm>
#include <vector>

#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo::gradient_modes {

/// Bytes of distinct storages: add() counts a tensor's whole storage the first time it sees it, and 0 for an
/// undefined or empty tensor or a storage already counted.
/// Example: a [4] float32 tensor and a view of it -> add 16, then 0; total 16.
struct storage_bytes {
  std::vector<const void*> seen;
  double total = 0;

  double add(const torch::Tensor& t) {
    if (!t.defined() || t.numel() == 0) return 0.0;
    const void* storage = t.storage().data();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) return 0.0;
    seen.push_back(storage);
    const auto bytes = static_cast<double>(t.storage().nbytes());
    total += bytes;
    return bytes;
  }
};

/// A mode's gradient bytes over an update: `state`, the most held when an update's backward passes had ended
/// (policy_memory::gradients), and `peak`, the most held at any moment (policy_memory::gradients_peak), both since
/// the last reset.
/// Example: note(8) then note(4) -> peak 8; settle(6) -> state 6.
/// @post peak and state only grow until the mode resets them (reset_memory_peak).
struct gradient_meter {
  double peak = 0;
  double state = 0;

  void note(double bytes) { peak = std::max(peak, bytes); }
  void settle(double bytes) { state = std::max(state, bytes); }
};

/// One backward pass of `loss` whose 16-bit gradients then move into float32 sums (move()): the meter notes the
/// bytes() held after the pass and after the move.
/// Example: a bfloat16 tensor's [n] gradient -> notes 2n (+ what was held), then 4n once it moved into float32.
template <class Bytes, class Move>
void backward_then_move(const torch::Tensor& loss, gradient_meter& meter, Bytes&& bytes, Move&& move) {
  loss.backward();
  meter.note(bytes());
  move();
  meter.note(bytes());
}

}  // namespace branchgrpo::gradient_modes
