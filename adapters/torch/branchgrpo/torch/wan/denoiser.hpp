#pragma once
// Adapts the native Wan2.1 transformer to the core: a denoiser of torch video latents [rows, C, F, H, W]
// conditioned on each row's prompt through a table of precomputed text features (umT5's for the released
// models). Models TorchVelocityModel (velocity(x, batch), trainable_parameters(), set_adapters_enabled) for the
// autograd policy and Denoiser (operator(), without autograd) for the rollout, as flux_denoiser does for images:
// the rollout engine, the correlators and the trainer see latent rows and never the frame axis.
//
// Wan's time is the noise level on its 1000-step scale: timestep = 1000 sigma (x_sigma = (1 - sigma) x0 +
// sigma eps); the velocity is eps - x0, the convention of the core's steppers and of FLUX.
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/prompt_table.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo {

/// velocity(x, batch) = transformer(x, timestep = 1000 batch.sigma, text = text[batch.prompts]) in x's dtype.
/// Example: wan_config::tiny(), a table of 2 prompts [2, 5, 24], x [3, 4, 2, 4, 4], batch.prompts {0, 1, 1},
///   sigma 0.7 -> velocity [3, 3, 2, 4, 4] (out_dim 3), row r conditioned on text[prompts[r]], timestep 700.
/// @pre text is [N, L, text_dim] with 1 <= L <= text_len; every batch prompt in [0, N); batch.prompts.size() ==
///   rows; x is [rows, in_dim, F, H, W] (else invalid_input naming the shapes).
class wan_denoiser {
 public:
  wan_denoiser(std::shared_ptr<wan_transformer> model, torch::Tensor text)
      : wan_denoiser(std::move(model), prompt_table(prompt_embeddings{.context = std::move(text), .pooled = {}})) {}

  /// The text features of a table's rows (their pooled vectors, if any, are not used).
  wan_denoiser(std::shared_ptr<wan_transformer> model, prompt_table text)
      : model_(std::move(model)), text_(std::move(text)) {
    require(model_ != nullptr, "wan_denoiser needs a model");
    const wan_config& c = model_->config();
    require(text_.size() >= 1 && text_.tokens() <= c.text_len && text_.width() == c.text_dim,
            "wan prompt text features must be [N, L <= ", c.text_len, ", ", c.text_dim, "], got [", text_.size(), ", ",
            text_.tokens(), ", ", text_.width(), "]");
  }

  /// Differentiable velocity [rows, out_dim, F, H, W].
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    const std::int64_t rows = x.size(0);
    require(static_cast<std::int64_t>(batch.prompts.size()) == rows, "denoise batch has ", batch.prompts.size(),
            " prompts for ", rows, " rows");
    require(std::isfinite(batch.sigma), "sigma is ", batch.sigma);
    const torch::Device device = model_->patch_embedding->weight.device();
    const torch::Tensor text = text_.rows(batch.prompts, device).context;
    const torch::Tensor timestep =
        torch::full({rows}, 1000.0 * batch.sigma, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    const torch::Tensor v = model_->forward(x.to(device), timestep, text);
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

  [[nodiscard]] wan_transformer& model() { return *model_; }

 private:
  std::shared_ptr<wan_transformer> model_;
  prompt_table text_;
};

}  // namespace branchgrpo
