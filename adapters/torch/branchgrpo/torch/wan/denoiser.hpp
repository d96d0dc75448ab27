#pragma once
// Adapts the native Wan2.1 transformer to the core: a denoiser of torch video latents [rows, C, F, H, W]
// conditioned on each row's prompt through a table of precomputed text features (umT5's for the released
// models). Wan's part is its TransformerCall, wan_call; the denoiser is the one transformer_denoiser every family
// shares (torch/transformer_denoiser.hpp), as flux_denoiser is for images: the rollout engine, the correlators and
// the trainer see latent rows and never the frame axis.
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
#include "branchgrpo/torch/transformer_denoiser.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"

namespace branchgrpo {

/// Wan's forward at a noise level: timestep = 1000 sigma, the rows' text features (pooled vectors unused).
struct wan_call {
  using model_type = wan_transformer;
  std::shared_ptr<wan_transformer> model;

  [[nodiscard]] torch::Device device() const { return model->patch_embedding->weight.device(); }
  torch::Tensor operator()(const torch::Tensor& x, const prompt_embeddings& text, double sigma) const {
    const torch::Tensor timestep =
        torch::full({x.size(0)}, 1000.0 * sigma, torch::TensorOptions().dtype(torch::kFloat32).device(x.device()));
    return model->forward(x, timestep, text.context);
  }
  /// @pre text is [N, L, text_dim] with N >= 1, 1 <= L <= text_len (else invalid_input naming the shapes).
  void check(const prompt_table& text) const {
    require(model != nullptr, "wan_denoiser needs a model");
    const wan_config& c = model->config();
    require(text.size() >= 1 && text.tokens() <= c.text_len && text.width() == c.text_dim,
            "wan prompt text features must be [N, L <= ", c.text_len, ", ", c.text_dim, "], got [", text.size(), ", ",
            text.tokens(), ", ", text.width(), "]");
  }
};

/// velocity(x, batch) = transformer(x, timestep = 1000 batch.sigma, text = text[batch.prompts]) in x's dtype
/// (transformer_denoiser).
/// Example: wan_config::tiny(), a table of 2 prompts [2, 5, 24], x [3, 4, 2, 4, 4], batch.prompts {0, 1, 1},
///   sigma 0.7 -> velocity [3, 3, 2, 4, 4] (out_dim 3), row r conditioned on text[prompts[r]], timestep 700.
/// @pre text is [N, L, text_dim] with 1 <= L <= text_len; every batch prompt in [0, N); batch.prompts.size() ==
///   rows; x is [rows, in_dim, F, H, W] (else invalid_input naming the shapes).
class wan_denoiser : public transformer_denoiser<wan_call> {
 public:
  wan_denoiser(std::shared_ptr<wan_transformer> model, torch::Tensor text)
      : wan_denoiser(std::move(model), prompt_table(prompt_embeddings{.context = std::move(text), .pooled = {}})) {}

  /// The text features of a table's rows (their pooled vectors, if any, are not used).
  wan_denoiser(std::shared_ptr<wan_transformer> model, prompt_table text)
      : transformer_denoiser<wan_call>(wan_call{.model = std::move(model)}, std::move(text)) {}
};

}  // namespace branchgrpo
