#pragma once
// Adapts the native SD3.5 transformer to the core: a denoiser of torch latents [rows, C, H, W] conditioned on each
// row's prompt through a table of precomputed text embeddings (the joint CLIP-L + CLIP-G + T5-XXL features and the
// pooled CLIP vectors for the released models). SD3's part is its TransformerCall, sd3_call; the denoiser is the one
// transformer_denoiser every family shares (torch/transformer_denoiser.hpp), as flux_denoiser and wan_denoiser are.
//
// SD3's time is the noise level on its 1000-step scale: timestep = 1000 sigma (x_sigma = (1 - sigma) x0 +
// sigma eps); the velocity is eps - x0, the convention of the core's steppers, of FLUX and of Wan.
// A table of another family's prompts is refused by its widths: FLUX's are [N, L, 4096] with pooled [N, 768] (the
// context as wide as SD3's, the pooled vector not), Wan's [N, L, 4096] without pooled vectors.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/prompt_table.hpp"
#include "branchgrpo/torch/sd3/transformer.hpp"
#include "branchgrpo/torch/transformer_denoiser.hpp"

namespace branchgrpo {

/// SD3's forward at a noise level: timestep = 1000 sigma, the rows' context and pooled vectors.
struct sd3_call {
  using model_type = sd3_transformer;
  std::shared_ptr<sd3_transformer> model;

  [[nodiscard]] torch::Device device() const { return model->context_embedder->weight.device(); }
  torch::Tensor operator()(const torch::Tensor& x, const prompt_embeddings& text, double sigma) const {
    const torch::Tensor timestep =
        torch::full({x.size(0)}, 1000.0 * sigma, torch::TensorOptions().dtype(torch::kFloat32).device(x.device()));
    return model->forward(x, timestep, text.context, text.pooled);
  }
  /// @pre the table holds N >= 1 rows of [L, context_in] with pooled vectors [pooled_in] (else invalid_input naming
  ///   the shapes, e.g. "sd3 prompt embeddings must be [N, L, 4096] with pooled [N, 2048], got [2, 512, 4096] with
  ///   pooled [2, 768]").
  void check(const prompt_table& text) const {
    require(model != nullptr, "sd3_denoiser needs a model");
    require(text.size() >= 1, "sd3_denoiser needs a prompt table");
    const sd3_config& c = model->config();
    const std::string pooled =
        text.has_pooled() ? "pooled [" + std::to_string(text.size()) + ", " + std::to_string(text.pooled_width()) + "]"
                          : "no pooled vectors";
    require(text.width() == c.context_in && text.pooled_width() == c.pooled_in, "sd3 prompt embeddings must be [N, L, ",
            c.context_in, "] with pooled [N, ", c.pooled_in, "], got [", text.size(), ", ", text.tokens(), ", ",
            text.width(), "] with ", pooled);
  }
};

/// velocity(x, batch) = transformer(x, timestep = 1000 batch.sigma, context and pooled of the rows batch.prompts) in
/// x's dtype (transformer_denoiser).
/// Example: sd3_config::tiny(), a table of 2 prompts (context [2, 5, 16], pooled [2, 12]), x [3, 4, 4, 6],
///   batch.prompts {0, 1, 1}, sigma 0.7 -> velocity [3, 4, 4, 6], row r conditioned on prompt prompts[r], timestep 700.
/// @pre the table's rows are [L, context_in] with pooled [pooled_in]; every batch prompt in [0, N);
///   batch.prompts.size() == rows; x is [rows, in_channels, H, W] with H, W multiples of the patch.
class sd3_denoiser : public transformer_denoiser<sd3_call> {
 public:
  sd3_denoiser(std::shared_ptr<sd3_transformer> model, prompt_table prompts)
      : transformer_denoiser<sd3_call>(sd3_call{.model = std::move(model)}, std::move(prompts)) {}
};

}  // namespace branchgrpo
