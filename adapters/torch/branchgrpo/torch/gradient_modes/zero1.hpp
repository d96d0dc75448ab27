#pragma once
// sharding_mode::optimizer (ZeRO-1): each rank keeps the float32 masters, AdamW's moments and the EMA of its range
// of the trainable tensors (sharded_masters.hpp); the gradient is still summed in full on every rank (one
// all-reduce per update), then each rank steps its range and the ranks' ranges are all-gathered into every rank's
// model.
#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/collectives.hpp"
#include "branchgrpo/torch/gradient_modes/gradient_meter.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_masters.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_mode.hpp"

namespace branchgrpo::gradient_modes {

/// The ZeRO-1 gradient mode (GradientMode) over communicator type C.
/// Example: 2 ranks, float32 trainable tensors [3] and [2] -> rank 0's optimized() is one [3] master (tensor 0),
///   rank 1's one [2] master; after all_reduce_gradients each holds the ranks' summed gradient of its own master.
/// @pre as sharded_masters; every rank calls all_reduce_gradients (or, with one rank, gradient_norm) once per update.
template <Communicator C>
class zero1 : public sharded_mode<C, zero1<C>> {
 public:
  zero1(const std::vector<torch::Tensor>& parameters, C& communicator)
      : sharded_mode<C, zero1<C>>(parameters, communicator), gradient_sums_(parameters.size()) {}

  /// One backward pass of an update; 16-bit tensors' gradients are summed in float32 beside them until the update's
  /// reduction.
  void backward(const torch::Tensor& loss) {
    backward_then_move(
        loss, this->meter_, [this] { return gradient_bytes(); }, [this] { move_gradients_to_sums(); });
  }
  /// Nothing: the gradient is reduced once per update, not during the backward passes.
  void pad() {}

  /// Bytes held in gradient buffers now: the model's tensors' .grad(), the float32 sums of 16-bit ones and the
  /// masters' .grad() (each storage once).
  [[nodiscard]] double gradient_bytes() const {
    storage_bytes held;
    for (const torch::Tensor& t : shard_.parameters()) held.add(t.grad());
    for (const torch::Tensor& t : gradient_sums_) held.add(t);
    for (const torch::Tensor& t : shard_.masters()) held.add(t.grad());
    return held.total;
  }
  [[nodiscard]] double gradient_peak() const { return std::max(meter_.peak, gradient_bytes()); }
  void reset_peak() {
    meter_.state = 0;
    meter_.peak = gradient_bytes();
  }

 private:
  friend sharded_mode<C, zero1<C>>;
  using sharded_mode<C, zero1<C>>::shard_;
  using sharded_mode<C, zero1<C>>::meter_;
  using sharded_mode<C, zero1<C>>::reduced_;

  void move_gradients_to_sums() {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor>& parameters = shard_.parameters();
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (!parameters[i].grad().defined() || parameters[i].scalar_type() == shard_.master_dtype()) continue;
      const torch::Tensor gradient = parameters[i].grad().to(shard_.master_dtype());
      if (gradient_sums_[i].defined())
        gradient_sums_[i].add_(gradient);
      else
        gradient_sums_[i] = gradient.clone();
      parameters[i].mutable_grad() = torch::Tensor();
    }
  }

  // Tensor i's summed gradient on this rank, in the master dtype (zeros where it has none).
  torch::Tensor local_gradient(std::size_t i) const {
    const torch::Tensor& parameter = shard_.parameters()[i];
    const torch::Tensor& source =
        parameter.scalar_type() == shard_.master_dtype() ? parameter.grad() : gradient_sums_[i];
    return source.defined() ? source.detach() : torch::zeros(parameter.sizes(), shard_.options());
  }

  // Every tensor's full gradient all-reduced, then sliced into the masters' .grad(), tensor by tensor: its pieces
  // copied, then its full gradient released (one piece in flight, not a shard). One rank: no collective.
  void reduce_to_shard() {
    torch::NoGradGuard no_grad;
    meter_.settle(gradient_bytes());
    const std::vector<torch::Tensor>& parameters = shard_.parameters();
    std::vector<torch::Tensor> gradients;
    for (std::size_t i = 0; i < parameters.size(); ++i) gradients.push_back(local_gradient(i));
    if (shard_.shard().size > 1) detail::all_reduce_tensors(shard_.communicator(), gradients);
    const std::vector<shard_piece>& pieces = shard_.pieces();
    const std::vector<torch::Tensor>& masters = shard_.masters();
    std::size_t k = 0;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      for (; k < pieces.size() && pieces[k].tensor == i; ++k)
        masters[k].mutable_grad() = sharded_masters<C>::piece_of(gradients[i], pieces[k]).view_as(masters[k]).clone();
      meter_.note(gradient_bytes());
      gradients[i] = torch::Tensor();
      parameters[i].mutable_grad() = torch::Tensor();
      gradient_sums_[i] = torch::Tensor();
    }
    meter_.note(gradient_bytes());
    reduced_ = true;
  }

  std::vector<torch::Tensor> gradient_sums_;  // float32 gradient sums of 16-bit tensors until the reduction
};

}  // namespace branchgrpo::gradient_modes
