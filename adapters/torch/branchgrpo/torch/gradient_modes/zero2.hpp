#pragma once
// sharding_mode::gradients (ZeRO-2): as ZeRO-1 (zero1.hpp), and the gradient sum reaches only its owner, reduced
// bucket by bucket during each backward pass (backward_reducer.hpp, fed by a hook on every trainable tensor), so
// that no rank holds the whole gradient.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/backward_reducer.hpp"
#include "branchgrpo/torch/gradient_modes/gradient_meter.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_masters.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_mode.hpp"

namespace branchgrpo::gradient_modes {

/// The hooks a policy registered on tensors, removed when it goes (a moved-from holder owns none).
struct registered_hooks {
  std::vector<std::pair<torch::Tensor, unsigned>> hooks;
  registered_hooks() = default;
  registered_hooks(registered_hooks&& other) noexcept : hooks(std::move(other.hooks)) { other.hooks.clear(); }
  registered_hooks& operator=(registered_hooks&& other) noexcept {
    remove();
    hooks = std::move(other.hooks);
    other.hooks.clear();
    return *this;
  }
  registered_hooks(const registered_hooks&) = delete;
  registered_hooks& operator=(const registered_hooks&) = delete;
  ~registered_hooks() { remove(); }
  void remove() {
    for (auto& [tensor, handle] : hooks) tensor.remove_hook(handle);
    hooks.clear();
  }
};

/// The ZeRO-2 gradient mode (GradientMode) over communicator type C.
/// Example: 2 ranks, float32 trainable tensors [3] and [2], buckets of 2 elements -> each backward pass reduces 3
///   buckets, rank 0 keeping the sums of tensor 0, rank 1 of tensor 1; neither holds the other's gradient.
/// @pre as sharded_masters; every rank makes the same number of backward passes per update (pad() for one without
///      rows), and calls all_reduce_gradients (or, with one rank, gradient_norm) once per update.
/// @post the hooks are removed when the mode goes (a moved-from mode holds none).
template <Communicator C>
class zero2 : public sharded_mode<C, zero2<C>> {
 public:
  zero2(const std::vector<torch::Tensor>& parameters, C& communicator, std::int64_t bucket_elements)
      : sharded_mode<C, zero2<C>>(parameters, communicator), reducer_(std::make_unique<backward_reducer<C>>()) {
    reducer_->communicator = &communicator;
    reducer_->shard = shard_.shard();
    reducer_->offsets = shard_.offsets();
    for (const torch::Tensor& p : parameters) reducer_->sizes.push_back(p.numel());
    reducer_->parameters = parameters;
    reducer_->bucket = bucket_elements;
    reducer_->options = shard_.options();
    reducer_->plan_reverse();
    backward_reducer<C>* const reducer = reducer_.get();  // stable: the hooks go with the mode
    for (std::size_t i = 0; i < parameters.size(); ++i)
      hooks_.hooks.emplace_back(parameters[i],
                                parameters[i].register_hook([reducer, i](const torch::Tensor&) { reducer->hook(i); }));
  }

  /// One backward pass of an update: each bucket reduced to its owners as the pass completes it.
  void backward(const torch::Tensor& loss) {
    reducer_->begin();
    try {
      loss.backward();
    } catch (...) {
      reducer_->active = false;
      throw;
    }
    reducer_->finish();
    meter_.note(gradient_bytes());
  }
  /// A backward pass without rows: the same collectives, with zeros.
  void pad() { reducer_->pad(); }

  /// Bytes held in gradient buffers now: the model's tensors' .grad(), the masters' and this rank's sums (each
  /// storage once).
  [[nodiscard]] double gradient_bytes() const {
    storage_bytes held;
    for (const torch::Tensor& t : shard_.parameters()) held.add(t.grad());
    for (const torch::Tensor& t : shard_.masters()) held.add(t.grad());
    held.add(reducer_->owned);
    return held.total;
  }
  /// The most bytes held at once, the buckets in flight during a backward pass included.
  [[nodiscard]] double gradient_peak() const { return std::max({meter_.peak, gradient_bytes(), reducer_->peak}); }
  void reset_peak() {
    meter_.state = 0;
    meter_.peak = gradient_bytes();
    reducer_->peak = reducer_->held_bytes();
  }

 private:
  friend sharded_mode<C, zero2<C>>;
  using sharded_mode<C, zero2<C>>::shard_;
  using sharded_mode<C, zero2<C>>::meter_;
  using sharded_mode<C, zero2<C>>::reduced_;

  // The backward passes reduced every bucket to its owners already: this rank's sums become its masters' gradients
  // (views of one buffer), and the next update's sums start afresh.
  void reduce_to_shard() {
    torch::NoGradGuard no_grad;
    meter_.settle(gradient_bytes());
    reducer_->learn_order();  // every rank reaches this once per update: the one point to agree on the order
    if (!reducer_->owned.defined()) reducer_->owned = torch::zeros({shard_.shard().count()}, shard_.options());
    const std::vector<shard_piece>& pieces = shard_.pieces();
    const std::vector<torch::Tensor>& masters = shard_.masters();
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      masters[k].mutable_grad() = reducer_->owned.narrow(0, at, pieces[k].length).view_as(masters[k]);
      at += pieces[k].length;
    }
    reducer_->owned = torch::Tensor();  // the pieces keep these
    meter_.note(gradient_bytes());
    for (const torch::Tensor& parameter : shard_.parameters()) parameter.mutable_grad() = torch::Tensor();
    reduced_ = true;
  }

  std::unique_ptr<backward_reducer<C>> reducer_;  // behind a pointer: the hooks hold its address
  registered_hooks hooks_;                        // on the model's tensors, feeding reducer_ (removed first)
};

}  // namespace branchgrpo::gradient_modes
