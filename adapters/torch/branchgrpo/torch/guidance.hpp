#pragma once
// Classifier-free guidance (CFG) as a denoiser wrapper: any TorchVelocityModel whose prompt index selects a row of
// its conditioning table becomes a guided one, and the core (rollout, trainer, ODE sampler) never learns of it.
//
//   classifier_free_guidance<flux_denoiser> guided(std::move(denoiser), {.scale = 5.0, .negative_rows = rows});
//   guided.velocity(x, batch)   = v_u + scale (v_c - v_u), in float32, cast back to x's dtype, where
//                                 v_c = model(x | prompt p) and v_u = model(x | its negative, table row rows[p])
//                                 come from ONE call of the wrapped model on the rows [x; x]
//
// One batched call, not two: the transformer sees 2 rows per row (so a rollout.max_batch of B makes calls of 2B
// rows), and a batch-invariant model gives the same guided velocity however the rows are batched, which keeps the
// update's recomputed log-probs equal to the rollout's. Gradients flow through both halves, as DanceGRPO's and
// Flow-GRPO's Wan recipes do (the unconditional branch is the same LoRA-adapted network). Scale 1 is the wrapped
// model itself, one pass, no negative rows needed.
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/policy.hpp"

namespace branchgrpo {

/// The guidance scale and, for each prompt row p of the wrapped model's table, the row of p's negative prompt; for a
/// model of two experts (Wan2.2 A14B), the scale of its second expert and where that expert runs.
struct classifier_free_guidance_options {
  double scale = 1.0;                       ///< 1 = off; else > 0 and finite
  std::vector<std::int64_t> negative_rows;  ///< negative_rows[p]: the table row conditioning p's unconditional pass
  double second_scale = 0;                  ///< 0 = `scale` everywhere; else > 0: the scale where second_at(sigma)
  std::function<bool(double sigma)> second_at = {};  ///< the noise levels of the second scale (its expert's)

  /// The scale at noise level `sigma`. Example: {.scale = 4, .second_scale = 3, .second_at = sigma < 0.875}:
  ///   scale_at(0.9) == 4, scale_at(0.5) == 3; without second_scale always `scale`.
  [[nodiscard]] double scale_at(double sigma) const {
    return second_scale > 0 && second_at && second_at(sigma) ? second_scale : scale;
  }
};

/// velocity(x, batch) = v_u + scale (v_c - v_u) (see the file comment).
/// Example: a model with velocity(x | p) = (p + 1) x, table rows {0, 1} for prompts and row 2 for the shared
///   negative (negative_rows {2, 2}), scale 5, x = [[1], [1]], prompts {0, 1} -> one model call on 4 rows with
///   prompts {0, 1, 2, 2}; v_c = {1, 2}, v_u = {3, 3}: velocity {3 + 5 (1 - 3), 3 + 5 (2 - 3)} = {-7, -2}.
///   With a second scale, a batch at sigma with second_at(sigma) is guided by second_scale instead (Wan2.2 A14B:
///   4 on the high-noise expert, 3 on the low-noise one, as diffusers' guidance_scale and guidance_scale_2).
/// @pre options.scale > 0 and finite, second_scale 0 or > 0 and finite, with second_at; with a scale != 1 every
///      prompt of a batch has a negative row (index in [0, negative_rows.size())); the wrapped model accepts the
///      negative rows as prompts (else invalid_input).
/// @post a batch whose scale is 1: velocity is the wrapped model's, called once on the batch as given.
template <TorchVelocityModel Model>
class classifier_free_guidance {
 public:
  classifier_free_guidance(Model model, classifier_free_guidance_options options)
      : model_(std::move(model)), options_(std::move(options)) {
    require(options_.scale > 0 && std::isfinite(options_.scale), "guidance scale must be positive and finite, got ",
            options_.scale);
    require(options_.second_scale == 0 || (options_.second_scale > 0 && std::isfinite(options_.second_scale) &&
                                           static_cast<bool>(options_.second_at)),
            "second guidance scale must be 0 or positive and finite with the noise levels it applies at, got ",
            options_.second_scale);
    require(
        !enabled() || !options_.negative_rows.empty(), "guidance scale ", options_.scale,
        options_.second_scale > 0 ? detail::message_of(" (second expert ", options_.second_scale, ")") : std::string(),
        " needs negative prompts (no negative rows were given)");
  }

  /// Differentiable guided velocity, x's shape and dtype.
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    const double scale = options_.scale_at(batch.sigma);
    if (scale == 1.0) return model_.velocity(x, batch);
    const std::int64_t rows = x.size(0);
    require(static_cast<std::int64_t>(batch.prompts.size()) == rows, "denoise batch has ", batch.prompts.size(),
            " prompts for ", rows, " rows");
    const auto negatives = static_cast<std::int64_t>(options_.negative_rows.size());
    std::vector<std::int64_t> prompts(batch.prompts.begin(), batch.prompts.end());
    for (std::size_t r = 0; r < batch.prompts.size(); ++r) {
      const std::int64_t p = batch.prompts[r];
      require(p >= 0 && p < negatives, "row ", r, " has prompt ", p, ", which has no negative prompt (", negatives,
              " prompts have one)");
      prompts.push_back(options_.negative_rows[static_cast<std::size_t>(p)]);
    }
    std::vector<std::uint32_t> trees(batch.trees.begin(), batch.trees.end());
    trees.insert(trees.end(), batch.trees.begin(), batch.trees.end());
    const denoise_batch both{.step = batch.step, .sigma = batch.sigma, .trees = trees, .prompts = prompts};
    const torch::Tensor v = model_.velocity(torch::cat({x, x}, 0), both);
    require(v.dim() >= 1 && v.size(0) == 2 * rows, "the guided model returned ", v.sizes(), " for ", 2 * rows, " rows");
    const torch::Tensor conditional = v.narrow(0, 0, rows).to(torch::kFloat32);
    const torch::Tensor unconditional = v.narrow(0, rows, rows).to(torch::kFloat32);
    return (unconditional + scale * (conditional - unconditional)).to(x.scalar_type());
  }

  /// The rollout's denoiser: the guided velocity without autograd.
  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    torch::NoGradGuard no_grad;
    return velocity(x, batch);
  }

  std::vector<torch::Tensor> trainable_parameters() { return model_.trainable_parameters(); }

  /// Off: the frozen base, guided the same way (the KL reference of a guided policy).
  void set_adapters_enabled(bool enabled) requires AdapterSwitch<Model> { model_.set_adapters_enabled(enabled); }

  /// Whether some noise level is guided (a scale other than 1).
  [[nodiscard]] bool enabled() const {
    return options_.scale != 1.0 || (options_.second_scale > 0 && options_.second_scale != 1.0);
  }
  [[nodiscard]] const classifier_free_guidance_options& options() const { return options_; }
  [[nodiscard]] Model& model() { return model_; }

 private:
  Model model_;
  classifier_free_guidance_options options_;
};

}  // namespace branchgrpo
