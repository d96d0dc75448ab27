#pragma once
// The optimizer's hyperparameters, one struct end to end: a config's [optimizer] section reads into it, the
// LibTorch policy's AdamW, clipping and EMA take it, and the toy's Adam uses the same names.
#include <tuple>

#include "branchgrpo/core/parameters.hpp"

namespace branchgrpo {

/// AdamW (decoupled weight decay: w <- w - lr * (adam_step + weight_decay * w)), gradient-norm clipping and an
/// exponential moving average of the weights. Defaults: DanceGRPO's FLUX recipe (lr 1e-5, weight decay 1e-4),
/// clipping at 1, no EMA.
/// Example: validate_parameters(optimizer_options{.beta2 = 1}, "optimizer") throws
///   "optimizer.beta2 = 1.0: must be in [0, 1)".
struct optimizer_options {
  double lr = 1e-5;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-4;
  double max_grad_norm = 1.0;  ///< 0 = no clipping (the norm is still measured)
  double ema_decay = 0.0;      ///< 0 = no EMA; else shadow <- decay * shadow + (1 - decay) * weight per step

  static constexpr auto parameters() {
    return std::tuple{
        parameter("lr", &optimizer_options::lr, "learning rate", rules::in_range{.low = 1e-12, .high = 1}),
        parameter("beta1", &optimizer_options::beta1, "first-moment decay",
                  rules::unit_interval{.closed_right = false}),
        parameter("beta2", &optimizer_options::beta2, "second-moment decay",
                  rules::unit_interval{.closed_right = false}),
        parameter("eps", &optimizer_options::eps, "added to the second moment's root",
                  rules::in_range{.low = 1e-30, .high = 1}),
        parameter("weight_decay", &optimizer_options::weight_decay, "decoupled weight decay",
                  rules::in_range{.low = 0, .high = 100}),
        parameter("max_grad_norm", &optimizer_options::max_grad_norm, "gradient-norm clip; 0 = none",
                  rules::in_range{.low = 0, .high = 1e6}),
        parameter("ema_decay", &optimizer_options::ema_decay, "EMA of the weights; 0 = none",
                  rules::unit_interval{.closed_right = false})};
  }
  friend bool operator==(const optimizer_options&, const optimizer_options&) = default;
};

}  // namespace branchgrpo
