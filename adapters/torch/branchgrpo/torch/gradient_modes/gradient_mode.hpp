#pragma once
// What the autograd policy (branchgrpo/torch/policy.hpp) asks of a gradient mode: where the gradient of an update
// goes between the backward passes and the optimizer step, and which tensors the step updates. The policy holds one
// mode, chosen once from autograd_policy_options::sharding when it is built:
//
//   replicated  sharding_mode::none        every rank keeps everything (replicated.hpp)
//   zero1<C>    sharding_mode::optimizer   masters, moments and EMA sharded; gradient all-reduced (zero1.hpp)
//   zero2<C>    sharding_mode::gradients   and the gradient reduced to its owners during backward (zero2.hpp)
//
// A sharded mode holds the communicator by its type C and its shard (sharded_masters.hpp): ShardedGradientMode.
#include <concepts>
#include <span>
#include <vector>

#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/sharded_masters.hpp"

namespace branchgrpo::gradient_modes {

/// A gradient mode. Per update, the policy calls backward(loss) once per batch (pad() for a batch without rows),
/// all_reduce_gradients(group) where the trainer is data-parallel, gradient_norm(), the optimizer step over
/// optimized(), release_gradients(), publish().
///   optimized()             the tensors AdamW steps and the EMA follows
///   master_parameters()     the whole trainable tensors the masters are of (their float32 copies, or the model's)
///   backward(loss)          one backward pass; the gradient goes where the mode keeps it
///   pad()                   a backward pass without rows (its collectives, if the mode has any during backward)
///   all_reduce_gradients(c) the update's gradient summed over the ranks, into optimized()'s .grad()
///   gradient_norm()         the global norm of that gradient (reducing first where the trainer did not)
///   release_gradients()     after the step: the gradients the optimizer does not release
///   publish()               optimized() into the model's tensors
///   load(values)            whole tensors into optimized() and the model (no collective)
///   gradient_bytes() / gradient_state() / gradient_peak() / reset_peak()   policy_memory's gradient bytes
/// Example: replicated{parameters, true} models it; so does zero2<c10d_communicator>.
template <class M>
concept GradientMode = requires(M& mode, const M& constant, const torch::Tensor& loss,
                                std::span<const torch::Tensor> values, single_process& group) {
  { constant.optimized() } -> std::same_as<const std::vector<torch::Tensor>&>;
  { constant.master_parameters() } -> std::same_as<const std::vector<torch::Tensor>&>;
  mode.backward(loss);
  mode.pad();
  mode.all_reduce_gradients(group);
  { mode.gradient_norm() } -> std::same_as<double>;
  mode.release_gradients();
  mode.publish();
  mode.load(values);
  { constant.gradient_bytes() } -> std::same_as<double>;
  { constant.gradient_state() } -> std::same_as<double>;
  { constant.gradient_peak() } -> std::same_as<double>;
  mode.reset_peak();
};

/// A gradient mode that shards the optimizer state over communicator type C: its shard() is this rank's range.
template <class M, class C>
concept ShardedGradientMode = GradientMode<M> && requires(M& mode) {
  { mode.shard() } -> std::same_as<sharded_masters<C>&>;
};

}  // namespace branchgrpo::gradient_modes
