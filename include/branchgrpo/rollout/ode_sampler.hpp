#pragma once
// Deterministic sampling without a tree: every row starts from keyed N(0, I) noise and follows the Euler ODE of
// the flow, x <- x + (sigma(s + 1) - sigma(s)) v(x, sigma(s)), over the schedule. Held-out evaluation, sample
// grids and reward-model checks all use it; the same keys give the same samples on every backend.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"

namespace branchgrpo {

/// Samples rows.size() latents: row r starts from the keyed normal of root_key(r) (its elements 0 ..
/// shape.elements() - 1) and is integrated with the Euler ODE over `schedule`, conditioned on prompts[r]; the
/// denoiser sees chunks of at most max_batch consecutive rows (denoise_batch.trees holds each row's key.tree).
/// Returns the final latents, one tensor per chunk, in row order.
/// Example: host_backend, a zero-velocity denoiser, 3 rows, max_batch 2 -> two tensors of 2 and 1 rows, each
///   row equal to fill_keyed_normal(root_key(r)) (v = 0 leaves x where it started); the toy's velocity over
///   shifted_linear_schedule(20) moves 64 rows of prompt p towards ring mode p (tests/unit/test_rollout.cpp).
/// @pre prompts non-empty; max_batch >= 1; shape valid; the denoiser returns one row of `shape` per input row.
/// A pending stop request (core/stop.hpp) throws stop_requested before the next denoiser call.
/// @post result rows sum to prompts.size(); the same keys, prompts and denoiser give bit-identical results for
///       any max_batch when the denoiser is batch-invariant.
template <Backend B, Denoiser<B> D, class RootKey>
requires std::is_invocable_r_v<noise_key, const RootKey&, std::int64_t> std::vector<typename B::tensor> sample_ode(
    B& backend, D& denoiser, const sigma_schedule& schedule, const latent_shape& shape,
    std::span<const std::int64_t> prompts, const RootKey& root_key, std::int64_t max_batch) {
  require(!prompts.empty(), "sample_ode needs at least one row");
  require(max_batch >= 1, "max_batch must be at least 1, got ", max_batch);
  validate(shape);
  const auto elements = static_cast<std::size_t>(shape.elements());
  const auto rows = static_cast<std::int64_t>(prompts.size());
  std::vector<typename B::tensor> out;
  for (std::int64_t begin = 0; begin < rows; begin += max_batch) {
    const std::int64_t count = std::min(max_batch, rows - begin);
    std::vector<double> noise(static_cast<std::size_t>(count) * elements);
    std::vector<std::uint32_t> trees(static_cast<std::size_t>(count));
    for (std::int64_t r = 0; r < count; ++r) {
      const noise_key key = root_key(begin + r);
      trees[static_cast<std::size_t>(r)] = key.tree;
      fill_keyed_normal(key, std::span<double>(noise).subspan(static_cast<std::size_t>(r) * elements, elements));
    }
    const std::span<const std::int64_t> chunk =
        prompts.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(count));
    typename B::tensor x = backend.from_host(noise, count, shape);
    for (int s = 0; s < schedule.steps(); ++s) {
      const denoise_batch batch{.step = s, .sigma = schedule.sigma(s), .trees = trees, .prompts = chunk};
      check_stop("ODE sampling");  // between denoiser calls
      x = backend.affine(1.0, x, schedule.sigma(s + 1) - schedule.sigma(s), denoiser(x, batch));
    }
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace branchgrpo
