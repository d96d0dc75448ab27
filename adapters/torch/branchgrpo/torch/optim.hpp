#pragma once
// Optimizer pieces of the autograd policy (policy.hpp), usable on their own:
//   make_adamw                   torch::optim::AdamW from optimizer_options (lr 1e-5, wd 1e-4 by default)
//   clip_gradient_norm           global L2 norm of the gradients, scaled down to max_norm when above it
//   ema_weights                  exponential moving average of the trainable weights, swappable for evaluation
#include <cmath>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/training/optimizer_options.hpp"

namespace branchgrpo {

/// An AdamW optimizer over `parameters` with options' lr, betas, eps and weight decay (optimizer_options, shared
/// with a config's [optimizer] section; its max_grad_norm and ema_decay are clip_gradient_norm's and ema_weights').
/// @pre options obey their rules (validate_parameters; else invalid_input "optimizer.<key> = <value>: <reason>");
///      parameters are leaf tensors that require grad.
inline std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& parameters,
                                                       const optimizer_options& options) {
  validate_parameters(options, "optimizer");
  return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(options.lr)
                                                               .betas({options.beta1, options.beta2})
                                                               .eps(options.eps)
                                                               .weight_decay(options.weight_decay));
}

/// sum_p ||grad p||^2 in float64, in the parameters' order (parameters without a gradient count 0): the squared
/// norm of one shard's gradients, which ranks that hold disjoint shards add up to the global one.
/// Example: gradients {3, 4} and none -> 25.
inline double gradient_squares(std::span<const torch::Tensor> parameters) {
  double squares = 0;
  for (const torch::Tensor& p : parameters)
    if (p.grad().defined()) squares += p.grad().detach().to(torch::kFloat64).square().sum().item<double>();
  return squares;
}

/// Scales every gradient by max_norm / (norm + 1e-6) when max_norm > 0 and the (global) `norm` exceeds it: the
/// clipping step of clip_gradient_norm for gradients whose norm was measured elsewhere (a sharded update).
/// @pre max_norm >= 0 and finite (else invalid_input); a non-finite norm scales nothing.
inline void scale_gradients_to_norm(std::span<const torch::Tensor> parameters, double norm, double max_norm) {
  require(std::isfinite(max_norm) && max_norm >= 0, "max gradient norm must be non-negative, got ", max_norm);
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    torch::NoGradGuard no_grad;
    for (const torch::Tensor& p : parameters)
      if (p.grad().defined()) p.grad().mul_(scale);
  }
}

/// The global L2 norm sqrt(sum_p ||grad p||^2) (in float64; parameters without a gradient count 0); when
/// max_norm > 0 and the norm exceeds it, every gradient is scaled by max_norm / (norm + 1e-6).
/// Returns the norm before clipping.
/// Example: gradients {3, 4} and {0}, max_norm 1 -> returns 5; gradients become {0.6, 0.8} / (1 + 2e-7), {0}.
/// @pre max_norm >= 0 and finite (0 = measure only).
/// @post a non-finite norm is returned as is and nothing is scaled (the caller decides what to do with it).
inline double clip_gradient_norm(std::span<const torch::Tensor> parameters, double max_norm) {
  const double norm = std::sqrt(gradient_squares(parameters));
  scale_gradients_to_norm(parameters, norm, max_norm);
  return norm;
}

/// Exponential moving average of a fixed list of weights: shadow <- decay * shadow + (1 - decay) * weight.
/// Example: decay 0.9, weight 0 then updated to 1 and `update` called -> shadow 0.1; after `swap` the weight
///   holds 0.1 and the shadow 1 (swap again to restore).
/// @pre decay in [0, 1); the weights keep their shapes between calls.
/// @post shadows live on the weights' devices in the weights' dtypes, outside autograd.
struct ema_weights {
  double decay = 0.0;
  std::vector<torch::Tensor> shadow;

  /// Starts the average at the weights' current values.
  void reset(std::span<const torch::Tensor> weights) {
    require(decay >= 0 && decay < 1, "EMA decay must be in [0, 1), got ", decay);
    torch::NoGradGuard no_grad;
    shadow.clear();
    for (const torch::Tensor& w : weights) shadow.push_back(w.detach().clone());
  }

  void update(std::span<const torch::Tensor> weights) {
    require(weights.size() == shadow.size(), "EMA holds ", shadow.size(), " tensors, got ", weights.size());
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < weights.size(); ++i) shadow[i].mul_(decay).add_(weights[i].detach() * (1 - decay));
  }

  /// Exchanges the weights' values with the averages (for evaluation with the EMA; call again to undo).
  void swap(std::span<const torch::Tensor> weights) {
    require(weights.size() == shadow.size(), "EMA holds ", shadow.size(), " tensors, got ", weights.size());
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const torch::Tensor current = weights[i].detach().clone();
      weights[i].detach().copy_(shadow[i]);
      shadow[i].copy_(current);
    }
  }
};

}  // namespace branchgrpo
