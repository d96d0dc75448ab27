#pragma once
// One denoiser for every transformer family: a torch model whose forward takes latents, a prompt's text
// embeddings and the noise level becomes a Denoiser (operator(), without autograd) for the rollout and a
// TorchVelocityModel (velocity, trainable_parameters, set_adapters_enabled) for the autograd policy. A family
// writes only its TransformerCall: how its forward is called at a noise level and what its prompt table must hold.
//   flux_denoiser  = transformer_denoiser<flux_call>   (torch/flux/denoiser.hpp; images [rows, C, H, W])
//   wan_denoiser   = transformer_denoiser<wan_call>    (torch/wan/denoiser.hpp; videos [rows, C, F, H, W])
// Classifier-free guidance wraps any of them (torch/guidance.hpp).
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/prompt_table.hpp"

namespace branchgrpo {

/// A family's forward at a noise level: `call(x, text, sigma)` is the velocity of latents x (on the model's device)
/// for the rows' text embeddings at noise level sigma, `call.check(table)` refuses a prompt table the model cannot
/// read (invalid_input naming the shapes), `call.model` the shared transformer (a torch::nn::Module).
template <class C>
concept TransformerCall = requires(const C& call, const torch::Tensor& x, const prompt_embeddings& text, double sigma,
                                   const prompt_table& table) {
  typename C::model_type;
  { call.model } -> std::convertible_to<std::shared_ptr<typename C::model_type>>;
  { call.device() } -> std::same_as<torch::Device>;
  { call(x, text, sigma) } -> std::same_as<torch::Tensor>;
  call.check(table);
};

/// velocity(x, batch) = call(x, rows batch.prompts of the table, batch.sigma), computed on the model's device and
/// returned in x's dtype and device.
/// Example: flux_denoiser(tiny model, 2 prompts), x [3, 4, 8, 8], batch.prompts {0, 1, 1}, sigma 0.7 ->
///   [3, 4, 8, 8], row r conditioned on prompt prompts[r].
/// @pre batch.prompts.size() == rows, every prompt in [0, table size), sigma finite (else invalid_input).
template <TransformerCall Call>
class transformer_denoiser {
 public:
  transformer_denoiser(Call call, prompt_table prompts) : call_(std::move(call)), prompts_(std::move(prompts)) {
    call_.check(prompts_);
  }

  /// Differentiable velocity, x's shape but for the family's output channels.
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    const std::int64_t rows = x.size(0);
    require(static_cast<std::int64_t>(batch.prompts.size()) == rows, "denoise batch has ", batch.prompts.size(),
            " prompts for ", rows, " rows");
    require(std::isfinite(batch.sigma), "sigma is ", batch.sigma);
    const torch::Device device = call_.device();
    const torch::Tensor v = call_(x.to(device), prompts_.rows(batch.prompts, device), batch.sigma);
    return v.to(x.scalar_type()).to(x.device());
  }

  /// The rollout's denoiser: velocity without autograd.
  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    torch::NoGradGuard no_grad;
    return velocity(x, batch);
  }

  /// The LoRA tensors when the model has adapters, else every parameter (full fine-tuning).
  std::vector<torch::Tensor> trainable_parameters() {
    std::vector<torch::Tensor> lora = lora_parameters(*call_.model);
    return lora.empty() ? call_.model->parameters() : lora;
  }

  /// Off: the frozen base model (the reference policy of a KL term). No effect without adapters.
  void set_adapters_enabled(bool enabled) { set_lora_enabled(*call_.model, enabled); }

  [[nodiscard]] typename Call::model_type& model() { return *call_.model; }
  [[nodiscard]] const Call& call() const { return call_; }

 private:
  Call call_;
  prompt_table prompts_;
};

}  // namespace branchgrpo
