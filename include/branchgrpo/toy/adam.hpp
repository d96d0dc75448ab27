#pragma once
// Adam (Kingma & Ba 2015) for the toy's parameters; the state lives outside the (regular) optimizer policy. Its
// options have optimizer_options' names and rules (lr, beta1, beta2, eps), so a toy and a LibTorch run read alike.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/parameters.hpp"

namespace branchgrpo {

/// Adam's moment estimates and step count; empty until the first step sizes it.
struct adam_state {
  std::vector<double> first;   ///< m
  std::vector<double> second;  ///< v
  std::int64_t steps = 0;

  friend bool operator==(const adam_state&, const adam_state&) = default;
};

/// One Adam step, descending the gradient g of a loss:
///   t += 1; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
///   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
/// Example: lr 0.1, defaults otherwise, p = {1}, g = {1} (f = p^2 / 2): m = 0.1, v = 0.001, m-hat = 1,
///   v-hat = 1 -> p = 1 - 0.1 / (1 + 1e-8) = 0.900000001; a second step with g = p gives
///   m = 0.09 + 0.1 p = 0.18, v = 0.000999 + 0.001 p^2 = 0.001809, m-hat = 0.18 / 0.19 = 0.947368,
///   v-hat = 0.001809 / 0.001999 = 0.904952 -> p = 0.900000001 - 0.1 * 0.947368 / 0.951290 = 0.800412.
/// @pre lr > 0, 0 <= beta1 < 1, 0 <= beta2 < 1, eps > 0, all finite (else invalid_input "adam.lr = ...: must be
///      positive", optimizer_options' rules); parameters.size() ==
///      gradient.size() == state size (or state empty); every gradient entry finite (else invalid_input
///      naming the index and value, before anything changes).
/// @post state.steps increased by one; parameters updated in place.
struct adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;

  static constexpr auto parameters() {
    return std::tuple{
        parameter("lr", &adam::lr, "learning rate", rules::in_range{.low = 1e-12, .high = 1}),
        parameter("beta1", &adam::beta1, "first-moment decay", rules::unit_interval{.closed_right = false}),
        parameter("beta2", &adam::beta2, "second-moment decay", rules::unit_interval{.closed_right = false}),
        parameter("eps", &adam::eps, "added to the second moment's root", rules::in_range{.low = 1e-30, .high = 1})};
  }

  void operator()(adam_state& state, std::span<double> parameters, std::span<const double> gradient) const {
    validate_parameters(*this, "adam");
    require(parameters.size() == gradient.size(), "adam got ", gradient.size(), " gradient entries for ",
            parameters.size(), " parameters");
    for (std::size_t i = 0; i < gradient.size(); ++i)
      require(std::isfinite(gradient[i]), "adam gradient[", i, "] = ", gradient[i], " is not finite");
    if (state.steps == 0 && state.first.empty()) {
      state.first.assign(parameters.size(), 0.0);
      state.second.assign(parameters.size(), 0.0);
    }
    require(state.first.size() == parameters.size() && state.second.size() == parameters.size(), "adam state holds ",
            state.first.size(), " moments for ", parameters.size(), " parameters");
    ++state.steps;
    const double t = static_cast<double>(state.steps);
    const double correction1 = 1.0 - std::pow(beta1, t);
    const double correction2 = 1.0 - std::pow(beta2, t);
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      const double g = gradient[i];
      state.first[i] = beta1 * state.first[i] + (1.0 - beta1) * g;
      state.second[i] = beta2 * state.second[i] + (1.0 - beta2) * g * g;
      const double m_hat = state.first[i] / correction1;
      const double v_hat = state.second[i] / correction2;
      parameters[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
  friend bool operator==(const adam&, const adam&) = default;
};

}  // namespace branchgrpo
