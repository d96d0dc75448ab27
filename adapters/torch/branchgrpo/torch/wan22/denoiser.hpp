#pragma once
// Adapts Wan2.2's two-expert transformer (torch/wan22/transformer.hpp) to the core, as torch/wan/denoiser.hpp adapts
// Wan2.1's: its TransformerCall, wan22_call, calls the module at timestep 1000 sigma, and the module runs the expert
// of that timestep; the denoiser is the transformer_denoiser every family shares. A rollout's batch is at one sigma,
// so every call runs one expert; its LoRA adapters are the trainable parameters of both experts (the one that did
// not run gets no gradient from that call).
//
// Guidance: Wan2.2 A14B samples with a scale per expert (official sample_guide_scale (3.0 low, 4.0 high); diffusers'
// guidance_scale for transformer, guidance_scale_2 for transformer_2): classifier_free_guidance (torch/guidance.hpp)
// takes the second scale with the noise levels of the low-noise expert (the family's load sets them from
// wan22_transformer::expert_for), model.guidance_scale_2 in a run.
//
// Example: wan22_denoiser(model of wan22_config::tiny(), a table [2, 5, 24]); velocity(x [3, 4, 2, 4, 4],
//   {.sigma = 0.9, .prompts = {0, 1, 1}}) -> high_noise_model's velocity at timestep 900; sigma 0.5 ->
//   low_noise_model's.
#include <memory>
#include <utility>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/prompt_table.hpp"
#include "branchgrpo/torch/transformer_denoiser.hpp"
#include "branchgrpo/torch/wan22/transformer.hpp"

namespace branchgrpo {

/// Wan2.2's forward at a noise level: timestep = 1000 sigma for every row, the rows' text features (pooled unused).
struct wan22_call {
  using model_type = wan22_transformer;
  std::shared_ptr<wan22_transformer> model;

  [[nodiscard]] torch::Device device() const { return model->high_noise_model->patch_embedding->weight.device(); }
  torch::Tensor operator()(const torch::Tensor& x, const prompt_embeddings& text, double sigma) const {
    const torch::Tensor timestep =
        torch::full({x.size(0)}, 1000.0 * sigma, torch::TensorOptions().dtype(torch::kFloat32).device(x.device()));
    return model->forward(x, timestep, text.context);
  }
  /// @pre text is [N, L, text_dim] with N >= 1, 1 <= L <= text_len (else invalid_input naming the shapes).
  void check(const prompt_table& text) const {
    require(model != nullptr, "wan22_denoiser needs a model");
    const wan_config& c = model->config().expert;
    require(text.size() >= 1 && text.tokens() <= c.text_len && text.width() == c.text_dim,
            "Wan2.2 prompt text features must be [N, L <= ", c.text_len, ", ", c.text_dim, "], got [", text.size(),
            ", ", text.tokens(), ", ", text.width(), "]");
  }
};

/// velocity(x, batch) = the expert of timestep 1000 batch.sigma at that timestep, text = text[batch.prompts]
/// (transformer_denoiser).
/// @pre as wan_denoiser's.
class wan22_denoiser : public transformer_denoiser<wan22_call> {
 public:
  wan22_denoiser(std::shared_ptr<wan22_transformer> model, torch::Tensor text)
      : wan22_denoiser(std::move(model), prompt_table(prompt_embeddings{.context = std::move(text), .pooled = {}})) {}

  /// The text features of a table's rows (their pooled vectors, if any, are not used).
  wan22_denoiser(std::shared_ptr<wan22_transformer> model, prompt_table text)
      : transformer_denoiser<wan22_call>(wan22_call{.model = std::move(model)}, std::move(text)) {}
};

}  // namespace branchgrpo
