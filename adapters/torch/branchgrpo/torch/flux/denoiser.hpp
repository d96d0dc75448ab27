#pragma once
// Adapts the native FLUX transformer to the core: a denoiser of torch latents [rows, C, H, W] conditioned on
// each row's prompt through a table of precomputed text embeddings. Models TorchVelocityModel (velocity(x,
// batch), trainable_parameters(), set_adapters_enabled) for the autograd policy and Denoiser (operator(),
// without autograd) for the rollout.
//
// FLUX's time is the noise level itself: t = sigma (x_sigma = (1 - sigma) x0 + sigma eps), embedded as
// 1000 t; the velocity is eps - x0, the convention of the core's steppers.
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/prompt_table.hpp"

namespace branchgrpo {

struct flux_denoiser_options {
  double guidance = 3.5;  ///< embedded (distilled) guidance scale; ignored by configs without guidance_in
};

/// velocity(x, batch) = transformer(x, t = batch.sigma, prompt rows batch.prompts) in x's dtype.
/// Example: tiny config, 2 prompts, x [3, 4, 8, 8], batch.prompts {0, 1, 1}, sigma 0.7 -> [3, 4, 8, 8],
///   row r conditioned on context[prompts[r]] and pooled[prompts[r]].
/// @pre the table's rows are [L, context_in] with pooled [vec_in]; every batch prompt in [0, N);
///   batch.prompts.size() == rows; guidance finite.
class flux_denoiser {
 public:
  flux_denoiser(std::shared_ptr<flux_transformer> model, prompt_table prompts, flux_denoiser_options options = {})
      : model_(std::move(model)), prompts_(std::move(prompts)), options_(options) {
    require(model_ != nullptr, "flux_denoiser needs a model");
    const flux_config& c = model_->config();
    require(prompts_.size() >= 1, "flux_denoiser needs a prompt table");
    require(prompts_.width() == c.context_in, "prompt context must be [N, L, ", c.context_in, "], got [",
            prompts_.size(), ", ", prompts_.tokens(), ", ", prompts_.width(), "]");
    require(prompts_.pooled_width() == c.vec_in, "prompt pooled vectors must be [", prompts_.size(), ", ", c.vec_in,
            "], got width ", prompts_.pooled_width());
    require(std::isfinite(options_.guidance), "guidance must be finite, got ", options_.guidance);
  }

  /// Differentiable velocity [rows, C, H, W].
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    const std::int64_t rows = x.size(0);
    require(static_cast<std::int64_t>(batch.prompts.size()) == rows, "denoise batch has ", batch.prompts.size(),
            " prompts for ", rows, " rows");
    require(std::isfinite(batch.sigma), "sigma is ", batch.sigma);
    const torch::Device device = model_->img_in->weight.device();
    const prompt_embeddings text = prompts_.rows(batch.prompts, device);
    const torch::Tensor& context = text.context;
    const torch::Tensor& pooled = text.pooled;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const torch::Tensor t = torch::full({rows}, batch.sigma, f32);
    const torch::Tensor g = torch::full({rows}, options_.guidance, f32);
    const torch::Tensor v = model_->forward_latents(x.to(device), context, pooled, t,
                                                    model_->config().guidance_embed ? g : torch::Tensor());
    return v.to(x.scalar_type()).to(x.device());
  }

  /// The rollout's denoiser: velocity without autograd.
  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    torch::NoGradGuard no_grad;
    return velocity(x, batch);
  }

  /// The LoRA tensors when the model has adapters, else every parameter (full fine-tuning).
  std::vector<torch::Tensor> trainable_parameters() {
    std::vector<torch::Tensor> lora = lora_parameters(*model_);
    return lora.empty() ? model_->parameters() : lora;
  }

  /// Off: the frozen base model (the reference policy of a KL term). No effect without adapters.
  void set_adapters_enabled(bool enabled) { set_lora_enabled(*model_, enabled); }

  [[nodiscard]] flux_transformer& model() { return *model_; }
  [[nodiscard]] const flux_denoiser_options& options() const { return options_; }

 private:
  std::shared_ptr<flux_transformer> model_;
  prompt_table prompts_;
  flux_denoiser_options options_;
};

}  // namespace branchgrpo
