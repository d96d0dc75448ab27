#pragma once
// What ZeRO-1 and ZeRO-2 (zero1.hpp, zero2.hpp) do alike once their gradient is reduced: the global norm, the
// release after a step, the masters into the model, loading. Each mode (Mode, by CRTP) reduces its own way:
// Mode::reduce_to_shard() sums the update's gradient over the ranks into this rank's masters' .grad().
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/gradient_meter.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_masters.hpp"

namespace branchgrpo::gradient_modes {

/// The shared half of a sharded gradient mode over communicator type C.
/// Example: zero1<C> derives from sharded_mode<C, zero1<C>>: gradient_norm() on one rank reduces the update's
///   gradient first (no all_reduce_gradients was called), then adds nothing over the ranks.
/// @pre Mode derives from it and has reduce_to_shard(), which sets reduced_ (else a compile error there).
template <Communicator C, class Mode>
class sharded_mode {
 public:
  [[nodiscard]] const std::vector<torch::Tensor>& optimized() const { return shard_.masters(); }
  /// Sharded, the masters of the whole tensors are the model's tensors (the float32 ones are optimized()).
  [[nodiscard]] const std::vector<torch::Tensor>& master_parameters() const { return shard_.parameters(); }
  [[nodiscard]] sharded_masters<C>& shard() { return shard_; }
  [[nodiscard]] const sharded_masters<C>& shard() const { return shard_; }

  /// The update's gradient summed over the ranks into this rank's masters.
  /// @pre `communicator` is the shard's group (else invalid_input).
  template <Communicator Comm>
  void all_reduce_gradients(Comm& communicator) {
    shard_.check_group(communicator.rank(), communicator.size());
    self().reduce_to_shard();
  }
  /// The global gradient norm (reducing first when all_reduce_gradients did not: one rank).
  double gradient_norm() {
    if (!reduced_) self().reduce_to_shard();
    return shard_.global_norm();
  }
  void release_gradients() {
    shard_.release_gradients();
    reduced_ = false;
  }
  void publish() { shard_.gather_into_model(); }
  void load(std::span<const torch::Tensor> values) { shard_.load(values); }
  [[nodiscard]] double gradient_state() const { return meter_.state; }

 protected:
  sharded_mode(const std::vector<torch::Tensor>& parameters, C& communicator) : shard_(parameters, communicator) {}

  sharded_masters<C> shard_;
  gradient_meter meter_;
  bool reduced_ = false;  // the masters hold this update's summed gradient

 private:
  Mode& self() { return static_cast<Mode&>(*this); }
};

}  // namespace branchgrpo::gradient_modes
