#pragma once
// Adapts the native FLUX transformer to the core: a denoiser of torch latents [rows, C, H, W] conditioned on
// each row's prompt through a table of precomputed text embeddings. FLUX's part is its TransformerCall,
// flux_call; the denoiser (TorchVelocityModel for the autograd policy, Denoiser for the rollout) is the one
// transformer_denoiser every family shares (torch/transformer_denoiser.hpp).
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
#include "branchgrpo/torch/transformer_denoiser.hpp"

namespace branchgrpo {

struct flux_denoiser_options {
  double guidance = 3.5;  ///< embedded (distilled) guidance scale; ignored by configs without guidance_in
};

/// FLUX's forward at a noise level: t = sigma (embedded as 1000 t by the model), the embedded guidance when the
/// config has a guidance embedding, the rows' T5 context and CLIP pooled vectors.
struct flux_call {
  using model_type = flux_transformer;
  std::shared_ptr<flux_transformer> model;
  flux_denoiser_options options = {};

  [[nodiscard]] torch::Device device() const { return model->img_in->weight.device(); }
  torch::Tensor operator()(const torch::Tensor& x, const prompt_embeddings& text, double sigma) const {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    const torch::Tensor t = torch::full({x.size(0)}, sigma, f32);
    const torch::Tensor g = torch::full({x.size(0)}, options.guidance, f32);
    return model->forward_latents(x, text.context, text.pooled, t,
                                  model->config().guidance_embed ? g : torch::Tensor());
  }
  /// @pre the table's rows are [L, context_in] with pooled [vec_in]; guidance finite (else invalid_input).
  void check(const prompt_table& prompts) const {
    require(model != nullptr, "flux_denoiser needs a model");
    const flux_config& c = model->config();
    require(prompts.size() >= 1, "flux_denoiser needs a prompt table");
    require(prompts.width() == c.context_in, "prompt context must be [N, L, ", c.context_in, "], got [", prompts.size(),
            ", ", prompts.tokens(), ", ", prompts.width(), "]");
    require(prompts.pooled_width() == c.vec_in, "prompt pooled vectors must be [", prompts.size(), ", ", c.vec_in,
            "], got width ", prompts.pooled_width());
    require(std::isfinite(options.guidance), "guidance must be finite, got ", options.guidance);
  }
};

/// velocity(x, batch) = transformer(x, t = batch.sigma, prompt rows batch.prompts) in x's dtype
/// (transformer_denoiser).
/// Example: tiny config, 2 prompts, x [3, 4, 8, 8], batch.prompts {0, 1, 1}, sigma 0.7 -> [3, 4, 8, 8],
///   row r conditioned on context[prompts[r]] and pooled[prompts[r]].
/// @pre the table's rows are [L, context_in] with pooled [vec_in]; every batch prompt in [0, N);
///   batch.prompts.size() == rows; guidance finite.
class flux_denoiser : public transformer_denoiser<flux_call> {
 public:
  flux_denoiser(std::shared_ptr<flux_transformer> model, prompt_table prompts, flux_denoiser_options options = {})
      : transformer_denoiser<flux_call>(flux_call{.model = std::move(model), .options = options}, std::move(prompts)) {}

  [[nodiscard]] const flux_denoiser_options& options() const { return call().options; }
};

}  // namespace branchgrpo
