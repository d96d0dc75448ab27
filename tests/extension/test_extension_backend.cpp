// docs/extending.md, "A backend": a toy backend that computes in float, added through exactly the page's steps:
// one header's worth of code (here, in this file) modelling the Backend concept, with no edit of the library; the
// rollout engine and the trainer's stages then run on it unchanged, and agree with host_backend to float rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <vector>

#include "branchgrpo/branchgrpo.hpp"

using namespace branchgrpo;

namespace {

// Step 1: the tensor and the eight operations of rollout/backend.hpp.
struct float_tensor {
  std::int64_t rows = 0;
  latent_shape shape;
  std::vector<float> values;
};

struct float_backend {
  using tensor = float_tensor;

  tensor from_host(std::span<const double> values, std::int64_t rows, const latent_shape& shape) const {
    require(static_cast<std::int64_t>(values.size()) == rows * shape.elements(), "from_host got ", values.size(),
            " values for ", rows, " rows");
    return {.rows = rows, .shape = shape, .values = std::vector<float>(values.begin(), values.end())};
  }
  std::vector<double> to_host(const tensor& x) const { return {x.values.begin(), x.values.end()}; }
  std::int64_t rows(const tensor& x) const { return x.rows; }
  tensor gather_rows(const tensor& x, std::span<const std::int64_t> index) const {
    const auto width = static_cast<std::size_t>(x.shape.elements());
    tensor out{.rows = static_cast<std::int64_t>(index.size()), .shape = x.shape, .values = {}};
    for (const std::int64_t i : index) {
      require(i >= 0 && i < x.rows, "gather_rows index ", i, " is not below ", x.rows);
      const auto first = x.values.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * width);
      out.values.insert(out.values.end(), first, first + static_cast<std::ptrdiff_t>(width));
    }
    return out;
  }
  tensor slice_rows(const tensor& x, std::int64_t begin, std::int64_t end) const {
    std::vector<std::int64_t> index;
    for (std::int64_t i = begin; i < end; ++i) index.push_back(i);
    return gather_rows(x, index);
  }
  tensor concat_rows(std::span<const tensor> parts) const {
    tensor out{.rows = 0, .shape = parts.front().shape, .values = {}};
    for (const tensor& part : parts) {
      out.rows += part.rows;
      out.values.insert(out.values.end(), part.values.begin(), part.values.end());
    }
    return out;
  }
  tensor affine(double a, const tensor& x, double c, const tensor& v) const {
    require(x.values.size() == v.values.size(), "affine of ", x.values.size(), " and ", v.values.size(), " values");
    tensor out{.rows = x.rows, .shape = x.shape, .values = std::vector<float>(x.values.size())};
    for (std::size_t i = 0; i < x.values.size(); ++i)
      out.values[i] = static_cast<float>(a) * x.values[i] + static_cast<float>(c) * v.values[i];
    return out;
  }
  std::vector<double> row_log_prob(const tensor& next, const tensor& mean, std::span<const double> std) const {
    const auto width = static_cast<std::size_t>(next.shape.elements());
    std::vector<double> out(static_cast<std::size_t>(next.rows));
    for (std::size_t r = 0; r < out.size(); ++r) {
      double sum = 0;
      for (std::size_t i = r * width; i < (r + 1) * width; ++i) {
        const double z = (static_cast<double>(next.values[i]) - mean.values[i]) / std[r];
        sum += -0.5 * z * z;
      }
      out[r] = sum / static_cast<double>(width) - std::log(std[r]) - 0.5 * std::log(2 * std::numbers::pi);
    }
    return out;
  }
};
static_assert(Backend<float_backend>);

// A denoiser for any backend: v = -x (the exact velocity of data at 0 under the flow x_t = (1 - t) x0 + t eps
// with x0 = 0), so that both backends run the same model.
template <Backend B>
struct shrink {
  B* backend;
  typename B::tensor operator()(const typename B::tensor& x, const denoise_batch&) const {
    return backend->affine(-1.0, x, 0.0, x);
  }
};

template <Backend B>
rollout_result<B> one_rollout(B& backend) {
  shrink<B> denoiser{&backend};
  const auto recipe = branch_method();
  const sigma_schedule schedule = shifted_linear_schedule(20);
  return rollout(backend, denoiser, recipe.stepper, recipe.correlator, schedule,
                 rollout_tree(recipe.topology(20), {{.key = 0, .prompt = 0}, {.key = 1, .prompt = 1}}),
                 latent_shape{.dims = {3, 2}}, rollout_options{.max_batch = 16, .seed = 3});
}

}  // namespace

TEST_CASE("extension: a toy float backend runs the rollout and agrees with host_backend", "[extension]") {
  float_backend floats;
  host_backend doubles;
  const rollout_result<float_backend> mine = one_rollout(floats);
  const rollout_result<host_backend> reference = one_rollout(doubles);
  REQUIRE(mine.evaluations == reference.evaluations);
  REQUIRE(mine.latents.size() == reference.latents.size());
  for (std::size_t step = 0; step < mine.latents.size(); ++step) {
    const std::vector<double> a = floats.to_host(mine.latents[step]);
    const std::vector<double>& b = reference.latents[step].values;
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-5));
  }
  const std::span<const double> lp = mine.tree.log_probs(), lp_ref = reference.tree.log_probs();
  for (std::size_t n = 0; n < lp.size(); ++n) CHECK(lp[n] == Approx(lp_ref[n]).margin(1e-3));
  // The trainer's stages are generic too: the leaves' latents for a reward.
  CHECK(floats.rows(leaf_latents(floats, mine)) == reference.tree.leaf_count());
}
