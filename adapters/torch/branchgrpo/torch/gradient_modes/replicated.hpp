#pragma once
// sharding_mode::none: every rank keeps everything (plain data parallelism). AdamW steps the masters (the model's
// tensors, or float32 copies of 16-bit ones: master_weights), all_reduce_gradients sums their full gradients over the
// ranks, and each step's masters are copied into the model.
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/collectives.hpp"
#include "branchgrpo/torch/gradient_modes/gradient_meter.hpp"
#include "branchgrpo/torch/optim.hpp"

namespace branchgrpo::gradient_modes {

/// The replicated gradient mode (GradientMode).
/// Example: a bfloat16 LoRA factor with master_weights -> optimized() holds its float32 copy; backward(loss) adds
///   the factor's gradient into the copy's float32 .grad and releases the factor's; publish() rounds the copy into
///   the factor.
/// @pre the parameters are the model's trainable leaf tensors (they stay the same tensors).
/// @post master_weights off, or no 16-bit tensor: the masters are the model's tensors themselves.
class replicated {
 public:
  replicated(const std::vector<torch::Tensor>& parameters, bool master_weights)
      : parameters_(parameters), masters_(parameters) {
    if (!master_weights) return;
    torch::NoGradGuard no_grad;
    for (torch::Tensor& master : masters_)
      if (master.scalar_type() == torch::kBFloat16 || master.scalar_type() == torch::kHalf) {
        master = master.detach().to(torch::kFloat32).clone();
        master.set_requires_grad(true);
      }
  }

  /// What AdamW steps and the EMA follows: the masters.
  [[nodiscard]] const std::vector<torch::Tensor>& optimized() const { return masters_; }
  [[nodiscard]] const std::vector<torch::Tensor>& master_parameters() const { return masters_; }

  /// One backward pass of an update; the 16-bit tensors' gradients move into their masters' float32 sums, so that
  /// the sum over an update's batches does not round at 8 bits.
  void backward(const torch::Tensor& loss) {
    backward_then_move(
        loss, meter_, [this] { return gradient_bytes(); }, [this] { move_gradients_to_masters(); });
  }
  /// Nothing: no collective runs during a backward pass.
  void pad() {}

  /// The masters' gradients become their sums over the ranks (zeros where a rank has none).
  template <Communicator Comm>
  void all_reduce_gradients(Comm& communicator) {
    std::vector<torch::Tensor> gradients;
    for (torch::Tensor& parameter : masters_) {
      if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
      gradients.push_back(parameter.grad());
    }
    detail::all_reduce_tensors(communicator, gradients);
  }

  /// The gradient's global norm (the masters' gradients are the whole gradient on every rank).
  double gradient_norm() {
    meter_.settle(gradient_bytes());
    return clip_gradient_norm(masters_, 0);
  }
  /// After a step: the optimizer's zero_grad releases the masters' gradients.
  void release_gradients() {}
  /// The masters into the model's tensors (rounded to their dtype where they are copies).
  void publish() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i)
      if (!masters_[i].is_same(parameters_[i])) parameters_[i].copy_(masters_[i]);
  }
  /// Sets the masters and the model's tensors to `values` (checked by the caller: one per tensor, in its shape).
  void load(std::span<const torch::Tensor> values) {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) masters_[i].copy_(values[i]);
    publish();
  }

  /// Bytes held in gradient buffers now: the model's tensors' and the masters' .grad() (each storage once).
  [[nodiscard]] double gradient_bytes() const {
    storage_bytes held;
    for (const torch::Tensor& t : parameters_) held.add(t.grad());
    for (const torch::Tensor& t : masters_) held.add(t.grad());
    return held.total;
  }
  [[nodiscard]] double gradient_state() const { return meter_.state; }
  [[nodiscard]] double gradient_peak() const { return std::max(meter_.peak, gradient_bytes()); }
  void reset_peak() {
    meter_.state = 0;
    meter_.peak = gradient_bytes();
  }

 private:
  void move_gradients_to_masters() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      if (masters_[i].is_same(parameters_[i]) || !parameters_[i].grad().defined()) continue;
      const torch::Tensor gradient = parameters_[i].grad().to(torch::kFloat32);
      if (masters_[i].grad().defined())
        masters_[i].mutable_grad().add_(gradient);
      else
        masters_[i].mutable_grad() = gradient.clone();
      parameters_[i].mutable_grad() = torch::Tensor();
    }
  }

  std::vector<torch::Tensor> parameters_;  // the model's trainable tensors
  std::vector<torch::Tensor> masters_;     // parameters_[i] itself, or its float32 master copy
  gradient_meter meter_;
};

}  // namespace branchgrpo::gradient_modes
