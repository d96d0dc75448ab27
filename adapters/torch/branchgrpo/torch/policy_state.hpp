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
//   policy_layout(policy, names)          the flat buffer of a sharded policy as a sharded checkpoint's layout
//   policy_shard_tensors(policy)          this rank's range of it ("master", AdamW's moments, "ema"), no collective:
//                                         what the rank writes into its shard file (write_sharded_checkpoint)
//   load_policy_shard(policy, range)      the inverse from a range read at any world size (read_checkpoint_range);
//                                         a collective (the working weights are all-gathered)
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
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
template <class Model, class C>
policy_state policy_state_tensors(autograd_policy<Model, C>& policy, const std::vector<std::string>& names) {
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
template <class Model, class C>
void load_policy_state(autograd_policy<Model, C>& policy, const std::vector<std::string>& names,
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

namespace detail {
// The flat concatenation of per-piece tensors (one per piece of the shard, in order): the shard's range as one
// 1-D tensor in the master dtype.
inline torch::Tensor flat_of(std::span<const torch::Tensor> per_piece, const torch::TensorOptions& options) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& t : per_piece) parts.push_back(t.detach().reshape({-1}).to(options));
  return parts.empty() ? torch::empty({0}, options) : torch::cat(parts);
}

// AdamW's state of one optimized tensor, or null before its first step (no copy: adamw_state_tensors clones).
inline const torch::optim::AdamWParamState* adamw_state_of(torch::optim::AdamW& optimizer, const torch::Tensor& piece) {
  auto& states = optimizer.state();
  const auto found = states.find(optimizer_state_key<torch::optim::AdamW>(piece));
  return found == states.end() ? nullptr : &static_cast<const torch::optim::AdamWParamState&>(*found->second);
}
}  // namespace detail

/// The flat buffer of a sharded policy as a sharded checkpoint's layout: its trainable tensors by `names`
/// (trainable_parameters() order) with their offsets and shapes, the world size as the shards, the masters' dtype,
/// AdamW's step (read off this rank's first piece: rank 0's, which writes the layout, has one) and the EMA flag.
/// Example: tensors w [4, 8], b [17] on 2 ranks after 3 updates -> {total 49, shards 2, step 3, tensors
///   {w 0 [4, 8], b 32 [17]}}.
/// @pre policy.sharded(); names.size() == policy.parameters().size() (else invalid_input).
template <class Model, class C>
checkpoint_layout policy_layout(autograd_policy<Model, C>& policy, const std::vector<std::string>& names) {
  require(policy.sharded() && names.size() == policy.parameters().size(), "policy_layout needs a sharded policy and ",
          policy.parameters().size(), " names, got ", names.size());
  checkpoint_layout layout{
      .tensors = {},
      .total = policy.shard().total,
      .shards = policy.shard().size,
      .dtype = policy.shard_masters().empty() || policy.shard_masters().front().scalar_type() != torch::kFloat64
                   ? "float32"
                   : "float64",
      .step = 0,
      .ema = policy.options().optimizer.ema_decay > 0};
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < names.size(); ++i) {
    layout.tensors.push_back({.name = names[i], .offset = offset, .shape = policy.parameters()[i].sizes().vec()});
    offset += policy.parameters()[i].numel();
  }
  if (!policy.shard_masters().empty())
    if (const auto* state = detail::adamw_state_of(policy.optimizer(), policy.shard_masters().front()))
      layout.step = state->step();
  return layout;
}

/// This rank's range of a sharded policy's flat buffer, by kind: "master" (the float32 masters), "adamw.exp_avg"
/// and "adamw.exp_avg_sq" (after a step), "ema" (with an EMA), each 1-D of shard().count() elements. No collective.
/// Example: rank 1 of 2 with the layout of policy_layout's example -> each kind [24] (b's last 24 elements).
/// @pre policy.sharded(); `layout` is policy_layout(policy, ...) (its step says whether the moments are there).
template <class Model, class C>
std::map<std::string, torch::Tensor> policy_shard_tensors(autograd_policy<Model, C>& policy,
                                                          const checkpoint_layout& layout) {
  require(policy.sharded(), "policy_shard_tensors needs a sharded policy");
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(layout.dtype == "float64" ? torch::kFloat64 : torch::kFloat32);
  std::map<std::string, torch::Tensor> out;
  out["master"] = detail::flat_of(policy.shard_masters(), options);
  if (layout.step > 0) {
    std::vector<torch::Tensor> averages, squares;  // the moments themselves, concatenated once below
    for (std::size_t k = 0; k < policy.shard_masters().size(); ++k) {
      const auto* state = detail::adamw_state_of(policy.optimizer(), policy.shard_masters()[k]);
      require(state != nullptr, "rank ", policy.shard().rank, ": piece ", k, " has no AdamW state at step ",
              layout.step);
      averages.push_back(state->exp_avg());
      squares.push_back(state->exp_avg_sq());
    }
    out["adamw.exp_avg"] = detail::flat_of(averages, options);
    out["adamw.exp_avg_sq"] = detail::flat_of(squares, options);
  }
  if (layout.ema) out["ema"] = detail::flat_of(policy.ema_parameters(), options);
  return out;
}

/// Sets a sharded policy's masters, AdamW state and EMA from `range` (read_checkpoint_range of this rank's
/// shard().lo, shard().hi, from a checkpoint of any world size), then all-gathers the masters into the model's
/// tensors. A collective: every rank calls it.
/// @pre range covers exactly this rank's shard, and its layout names the policy's tensors in order with their
///      shapes (else invalid_input naming the first that differs); with an EMA, range holds "ema".
template <class Model, class C>
void load_policy_shard(autograd_policy<Model, C>& policy, const std::vector<std::string>& names,
                       const checkpoint_range& range) {
  require(policy.sharded(), "load_policy_shard needs a sharded policy");
  require(range.lo == policy.shard().lo && range.hi == policy.shard().hi, "load_policy_shard got range [", range.lo,
          ", ", range.hi, "), this rank's shard is [", policy.shard().lo, ", ", policy.shard().hi, ")");
  require(range.layout.tensors.size() == names.size(), "the checkpoint's layout has ", range.layout.tensors.size(),
          " tensors, this run ", names.size(), " trainable");
  for (std::size_t i = 0; i < names.size(); ++i)
    require(range.layout.tensors[i].name == names[i] &&
                range.layout.tensors[i].shape == policy.parameters()[i].sizes().vec(),
            "the checkpoint's layout has tensor ", i, " '", range.layout.tensors[i].name, "' ",
            torch::IntArrayRef(range.layout.tensors[i].shape), ", this run '", names[i], "' ",
            policy.parameters()[i].sizes());
  torch::NoGradGuard no_grad;
  const std::vector<torch::Tensor>& masters = policy.shard_masters();
  // The range's kind split into pieces aligned with the shard's masters (they tile [lo, hi) in order).
  const auto split = [&](const std::string& kind) {
    const auto it = range.tensors.find(kind);
    require(it != range.tensors.end(), "the checkpoint's range has no '", kind, "'");
    std::vector<torch::Tensor> pieces;
    std::int64_t at = 0;
    for (const torch::Tensor& master : masters) {
      pieces.push_back(it->second.narrow(0, at, master.numel()).to(master.options()).view(master.sizes()).clone());
      at += master.numel();
    }
    return pieces;
  };
  const auto named = detail::named_pieces(masters);
  std::map<std::string, torch::Tensor> state;
  if (range.layout.step > 0) {
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<torch::Tensor> pieces = split(std::string("adamw.") + moment);
      for (std::size_t k = 0; k < pieces.size(); ++k)
        state[std::string("adamw.") + moment + "." + named[k].first] = pieces[k];
    }
    for (const auto& [key, piece] : named)
      state["adamw.step." + key] = torch::tensor({range.layout.step}, torch::kInt64);
  }
  load_adamw_state(policy.optimizer(), named, state);
  if (policy.options().optimizer.ema_decay > 0) {
    const std::vector<torch::Tensor> averages = split("ema");
    for (std::size_t k = 0; k < averages.size(); ++k) policy.ema_parameters()[k].copy_(averages[k]);
  }
  policy.load_shard_masters(split("master"));
}

}  // namespace branchgrpo
