#pragma once
// An exact flow-matching denoiser for Gaussian data, on host_backend: the test oracle of the rollout.
//
// Data of prompt p: x0 ~ N(m, s0^2 I) with m = p (the prompt value) and s0 = data_std; eps ~ N(0, I);
// x_t = (1 - t) x0 + t eps with t = sigma. Element-wise, with a = 1 - t:
//   x_t ~ N(a m, V),  V = a^2 s0^2 + t^2,  Cov(x0, x_t) = a s0^2,  Cov(eps, x_t) = t, so
//   E[x0 | x_t]  = m + a s0^2 (x_t - a m) / V,
//   E[eps | x_t] = t (x_t - a m) / V,
//   v(x_t, t)    = E[eps - x0 | x_t] = -m + (t - a s0^2) (x_t - a m) / V.
// Checks: t = 1 -> v = x - m (x_1 = eps);  t = 0 -> v = -x (x_0 = x0, E[eps | x0] = 0).
// v is affine in x with E[v(x_t)] = -m, so an Euler step x + (t' - t) v keeps E[x] = (1 - t) m exactly:
// the samples at sigma 0 have mean m for any schedule (their variance carries the discretization error).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/rollout/host_backend.hpp"

namespace branchgrpo::testing {

struct gaussian_denoiser {
  double data_std = 0.5;  ///< s0

  // Bookkeeping, for tests of the engine's batching.
  std::int64_t calls = 0;
  std::int64_t rows = 0;
  std::vector<int> call_steps{};             ///< step of each call
  std::vector<std::int64_t> call_rows{};     ///< rows of each call
  std::vector<std::int64_t> seen_prompts{};  ///< prompt of every row, in call order
  std::vector<std::uint32_t> seen_trees{};   ///< tree key of every row, in call order

  /// The closed-form velocity above for one element.
  [[nodiscard]] static double velocity(double x, double t, double m, double s0) {
    const double a = 1.0 - t;
    const double variance = a * a * s0 * s0 + t * t;
    return -m + (t - a * s0 * s0) * (x - a * m) / variance;
  }

  host_tensor operator()(const host_tensor& x, const denoise_batch& batch) {
    require(static_cast<std::int64_t>(batch.prompts.size()) == x.rows &&
                static_cast<std::int64_t>(batch.trees.size()) == x.rows,
            "gaussian_denoiser got ", batch.prompts.size(), " prompts and ", batch.trees.size(), " tree keys for ",
            x.rows, " rows");
    ++calls;
    rows += x.rows;
    call_steps.push_back(batch.step);
    call_rows.push_back(x.rows);
    seen_prompts.insert(seen_prompts.end(), batch.prompts.begin(), batch.prompts.end());
    seen_trees.insert(seen_trees.end(), batch.trees.begin(), batch.trees.end());
    host_tensor v{.rows = x.rows, .shape = x.shape, .values = std::vector<double>(x.values.size())};
    const auto elements = static_cast<std::size_t>(x.shape.elements());
    for (std::size_t i = 0; i < x.values.size(); ++i)
      v.values[i] = velocity(x.values[i], batch.sigma, static_cast<double>(batch.prompts[i / elements]), data_std);
    return v;
  }
};

}  // namespace branchgrpo::testing
