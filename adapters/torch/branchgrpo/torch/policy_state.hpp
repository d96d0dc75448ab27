#pragma once
// The autograd policy's training state as a checkpoint's tensors, the same names and format whether or not the
// policy is sharded, so that a checkpoint written at one world size and sharding resumes at any other:
//
//   policy_state_tensors(policy, names)   weights[name] (the float32 master, or the model's tensor when it has
//                                         none), state "adamw.exp_avg.<name>", "adamw.exp_avg_sq.<name>",
//                                         "adamw.step.<name>" (adamw_state_tensors' format) and "ema.<name>" (with
//                                         an EMA); sharded, the shards are all-gathered: a collective
//   load_policy_state(policy, names, weights, state)   the inverse; sharded, each rank keeps its pieces
//
// Sharded checkpoints (each rank writing its shard, no gather) are the next step (docs/distributed.md).
#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/checkpoint.hpp"
#include "branchgrpo/torch/policy.hpp"

namespace branchgrpo {

/// A policy's trainable weights and optimizer state by name (the weights and state of checkpoint_contents).
struct policy_state {
  std::map<std::string, torch::Tensor> weights;
  std::map<std::string, torch::Tensor> state;
};

namespace detail {
// The shard's pieces named by their index ("0", "1", ...): adamw_state_tensors / load_adamw_state address them so.
inline std::vector<std::pair<std::string, torch::Tensor>> named_pieces(const std::vector<torch::Tensor>& pieces) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (std::size_t k = 0; k < pieces.size(); ++k) named.emplace_back(std::to_string(k), pieces[k]);
  return named;
}
}  // namespace detail

/// The policy's weights, AdamW state and EMA as full tensors named by `names` (trainable_parameters() order).
/// Example: a ZeRO-2 policy on 2 ranks after one step, names {"w", "b"} -> on both ranks weights {w, b} (full
///   float32 masters), state {adamw.exp_avg.w, ..., adamw.step.b = {1}, ema.w, ema.b}: what the one-rank
///   unsharded policy in the same place returns.
/// @pre names.size() == policy.parameters().size(); sharded, every rank calls it (a collective).
template <class Model>
policy_state policy_state_tensors(autograd_policy<Model>& policy, const std::vector<std::string>& names) {
  require(names.size() == policy.parameters().size(), "policy_state_tensors got ", names.size(), " names for ",
          policy.parameters().size(), " trainable tensors");
  const bool ema = policy.options().optimizer.ema_decay > 0;
  policy_state out;
  if (!policy.sharded()) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (std::size_t i = 0; i < names.size(); ++i) named.emplace_back(names[i], policy.master_parameters()[i]);
    for (const auto& [name, tensor] : named) out.weights[name] = tensor.detach().clone();
    out.state = adamw_state_tensors(policy.optimizer(), named);
    if (ema)
      for (std::size_t i = 0; i < names.size(); ++i)
        out.state["ema." + names[i]] = policy.ema_parameters()[i].detach().clone();
    return out;
  }
  const std::vector<torch::Tensor> masters = policy.gather_pieces(policy.shard_masters());
  for (std::size_t i = 0; i < names.size(); ++i) out.weights[names[i]] = masters[i];
  // Every piece steps together, so a rank's pieces all have state or none; a rank without pieces has none to
  // tell. The ranks agree on whether there is state, and on its step, before gathering it.
  const auto named = detail::named_pieces(policy.shard_masters());
  const std::map<std::string, torch::Tensor> pieces = adamw_state_tensors(policy.optimizer(), named);
  const bool mine = !named.empty() && pieces.contains("adamw.exp_avg.0");
  const double holders = policy.sum_over_ranks(named.empty() ? 0.0 : 1.0);
  const double with_state = policy.sum_over_ranks(mine ? 1.0 : 0.0);
  require(with_state == 0 || with_state == holders, "the ranks disagree on AdamW's state: ", with_state, " of ",
          holders, " hold it");
  if (with_state > 0) {
    const double step = policy.sum_over_ranks(
        mine ? static_cast<double>(pieces.at("adamw.step.0").template item<std::int64_t>()) : 0.0);
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      std::vector<torch::Tensor> local;
      for (const auto& [key, piece] : named) local.push_back(pieces.at(std::string("adamw.") + moment + "." + key));
      const std::vector<torch::Tensor> full = policy.gather_pieces(local);
      for (std::size_t i = 0; i < names.size(); ++i)
        out.state[std::string("adamw.") + moment + "." + names[i]] = full[i];
    }
    for (const std::string& name : names)
      out.state["adamw.step." + name] =
          torch::tensor({static_cast<std::int64_t>(std::llround(step / with_state))}, torch::kInt64);
  }
  if (ema) {
    const std::vector<torch::Tensor> full = policy.gather_pieces(policy.ema_parameters());
    for (std::size_t i = 0; i < names.size(); ++i) out.state["ema." + names[i]] = full[i];
  }
  return out;
}

/// Sets the policy's weights, AdamW state and EMA from full tensors by name (policy_state_tensors' format, from a
/// policy of any world size and sharding); sharded, each rank keeps its pieces.
/// @pre every name has its weight; AdamW's state wholly there or wholly absent (check_adamw_state); with an EMA,
///      every ema.<name> (else invalid_input naming it). No collective.
template <class Model>
void load_policy_state(autograd_policy<Model>& policy, const std::vector<std::string>& names,
                       const std::map<std::string, torch::Tensor>& weights,
                       const std::map<std::string, torch::Tensor>& state) {
  require(names.size() == policy.parameters().size(), "load_policy_state got ", names.size(), " names for ",
          policy.parameters().size(), " trainable tensors");
  torch::NoGradGuard no_grad;
  const auto full = [&](const std::map<std::string, torch::Tensor>& tensors, const std::string& prefix) {
    std::vector<torch::Tensor> out;
    for (const std::string& name : names) {
      const auto it = tensors.find(prefix + name);
      require(it != tensors.end(), "the state has no '", prefix, name, "'");
      out.push_back(it->second);
    }
    return out;
  };
  policy.load_weights(full(weights, ""));
  const bool ema = policy.options().optimizer.ema_decay > 0;
  if (!policy.sharded()) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (std::size_t i = 0; i < names.size(); ++i) named.emplace_back(names[i], policy.master_parameters()[i]);
    load_adamw_state(policy.optimizer(), named, state);
    if (ema) {
      const std::vector<torch::Tensor> averages = full(state, "ema.");
      for (std::size_t i = 0; i < names.size(); ++i) policy.ema_parameters()[i].copy_(averages[i]);
    }
    return;
  }
  const auto named = detail::named_pieces(policy.shard_masters());
  std::map<std::string, torch::Tensor> pieces;
  if (state.contains("adamw.exp_avg." + names.front())) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<torch::Tensor> mine = policy.pieces_of(full(state, std::string("adamw.") + moment + "."));
      for (std::size_t k = 0; k < mine.size(); ++k)
        pieces[std::string("adamw.") + moment + "." + named[k].first] = mine[k];
    }
    const torch::Tensor step = state.at("adamw.step." + names.front());
    for (const auto& [key, piece] : named) pieces["adamw.step." + key] = step;
  }
  load_adamw_state(policy.optimizer(), named, pieces);
  if (ema) {
    const std::vector<torch::Tensor> averages = policy.pieces_of(full(state, "ema."));
    for (std::size_t k = 0; k < averages.size(); ++k) policy.ema_parameters()[k].copy_(averages[k]);
  }
}

}  // namespace branchgrpo
