#pragma once
// The backend concept: the few tensor operations the rollout engine and the trainer need. A tensor holds
// a batch of rows, one latent of shape `latent_shape` per row. Per-row scalars and noise stay on the host
// (double) so that every backend computes from the same keyed draws; backends convert to their dtype.
#include <concepts>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <vector>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// Shape of one latent (one row of a batch), e.g. {16, 90, 90} for FLUX at 720 px or {2} for a 2-D toy.
struct latent_shape {
  std::vector<std::int64_t> dims;

  [[nodiscard]] std::int64_t elements() const {
    return std::accumulate(dims.begin(), dims.end(), std::int64_t{1}, std::multiplies<>());
  }
  friend bool operator==(const latent_shape&, const latent_shape&) = default;
};

/// Throws unless every dimension is positive.
inline void validate(const latent_shape& shape) {
  require(!shape.dims.empty(), "a latent shape needs at least one dimension");
  for (std::size_t i = 0; i < shape.dims.size(); ++i)
    require(shape.dims[i] >= 1, "latent dimension ", i, " is ", shape.dims[i], ", must be at least 1");
}

/// Operations, for tensors x, v of equal shape [rows, latent...]:
///   from_host(values, rows, shape)   tensor from rows * shape.elements() row-major doubles
///   to_host(x)                       row-major doubles
///   rows(x)                          number of rows
///   gather_rows(x, index)            rows x[index[0]], x[index[1]], ... (indices may repeat)
///   slice_rows(x, begin, end)        rows [begin, end)
///   concat_rows(parts)               rows of parts one after another
///   affine(a, x, c, v)               a * x + c * v
///   row_log_prob(next, mean, std)    per row: mean over elements of log N(next; mean, std[row]^2)
template <class B>
concept Backend = requires(B& backend, const typename B::tensor& x, std::span<const double> values,
                           std::span<const std::int64_t> index, std::span<const typename B::tensor> parts,
                           const latent_shape& shape, std::int64_t rows, double a) {
  typename B::tensor;
  { backend.from_host(values, rows, shape) } -> std::same_as<typename B::tensor>;
  { backend.to_host(x) } -> std::same_as<std::vector<double>>;
  { backend.rows(x) } -> std::same_as<std::int64_t>;
  { backend.gather_rows(x, index) } -> std::same_as<typename B::tensor>;
  { backend.slice_rows(x, rows, rows) } -> std::same_as<typename B::tensor>;
  { backend.concat_rows(parts) } -> std::same_as<typename B::tensor>;
  { backend.affine(a, x, a, x) } -> std::same_as<typename B::tensor>;
  { backend.row_log_prob(x, x, values) } -> std::same_as<std::vector<double>>;
};

/// What a denoiser is told about a batch of rows: all rows sit at one step / noise level; `trees` and
/// `prompts` give each row's tree key and prompt (its conditioning).
struct denoise_batch {
  int step = 0;
  double sigma = 1.0;
  std::span<const std::uint32_t> trees;
  std::span<const std::int64_t> prompts;
};

/// A denoiser predicts the flow velocity v(x, sigma | prompt) for a batch of rows.
template <class D, class B>
concept Denoiser = Backend<B> && requires(D& denoiser, const typename B::tensor& x, const denoise_batch& batch) {
  { denoiser(x, batch) } -> std::same_as<typename B::tensor>;
};

}  // namespace branchgrpo
