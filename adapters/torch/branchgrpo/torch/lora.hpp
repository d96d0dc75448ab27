#pragma once
// LoRA (low-rank adaptation) for any torch module built from `lora_linear` layers:
//   y = W x + b + (alpha / r) * B (A x),   A: [r, in], B: [out, r], B = 0 at creation (so y starts at the base).
// Only A and B train; the base weights are frozen when adapters are added. merge() folds (alpha / r) B A into W
// (inference without the extra matmuls), unmerge() takes it back out; disabling the adapters gives the frozen
// base model (the reference policy of a KL term).
//
// Parameter names: a lora_linear registers "weight", "bias" (the base, so a model's state keeps the checkpoint
// names) and, once adapted, "lora_A" and "lora_B". lora_state() names them "<layer>.lora_A.weight" and
// "<layer>.lora_B.weight" (the PEFT convention), e.g. "double_blocks.0.img_attn.qkv.lora_A.weight".
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

/// What a linear layer of a model does; LoRA targets are chosen by role.
enum class linear_role {
  attention,      ///< q/k/v and output projections
  mlp,            ///< feed-forward layers
  attention_mlp,  ///< fused attention + MLP projections (FLUX single blocks' linear1 / linear2)
  modulation,     ///< adaLN modulation (shift, scale, gate) projections
  embedding,      ///< input embedders and the output projection
};

/// Which layers get adapters, their rank and scale.
/// Example: lora_options{} adapts attention, MLP and fused layers with rank 16, alpha 16 (scale 1), leaving
///   modulation and embedding layers frozen; lora_options{.rank = 4, .alpha = 8} scales updates by 2.
/// @pre rank >= 1, alpha finite and positive (checked by validate).
struct lora_options {
  std::int64_t rank = 16;
  double alpha = 16;
  bool attention = true;
  bool mlp = true;
  bool modulation = false;
  bool embedding = false;
  std::uint64_t seed = 0;  ///< initialization of A (B starts at zero)

  [[nodiscard]] bool targets(linear_role role) const {
    switch (role) {
      case linear_role::attention:
        return attention;
      case linear_role::mlp:
        return mlp;
      case linear_role::attention_mlp:
        return attention || mlp;
      case linear_role::modulation:
        return modulation;
      case linear_role::embedding:
        return embedding;
    }
    return false;
  }
  friend bool operator==(const lora_options&, const lora_options&) = default;
};

inline void validate(const lora_options& options) {
  require(options.rank >= 1, "LoRA rank must be at least 1, got ", options.rank);
  require(std::isfinite(options.alpha) && options.alpha > 0, "LoRA alpha must be finite and positive, got ",
          options.alpha);
}

/// A linear layer y = x W^T + b with an optional LoRA adapter.
/// Example: in 2, out 1, W = [[1, 2]], b = [0], adapter rank 1 alpha 2 (scale 2) with A = [[1, 1]], B = [[0.5]]:
///   x = [1, 1] -> 3 + 2 * 0.5 * 2 = 5 enabled, 3 disabled; after merge() W = [[2, 3]] and the output is 5.
class lora_linear : public torch::nn::Module {
 public:
  lora_linear(std::int64_t in_features, std::int64_t out_features, bool bias, linear_role role)
      : in_(in_features), out_(out_features), role_(role) {
    // nn.Linear's initialization: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    weight = register_parameter("weight", torch::empty({out_features, in_features}).uniform_(-bound, bound));
    if (bias) this->bias = register_parameter("bias", torch::empty({out_features}).uniform_(-bound, bound));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::linear(x, weight, bias);
    if (!has_adapter() || enabled_ == merged_) return y;  // no adapter, merged and on, or plain and off
    const torch::Tensor delta = torch::linear(torch::linear(x, lora_A), lora_B) * scale_;
    return enabled_ ? y + delta : y - delta;  // merged but disabled: take the merged delta back out
  }

  /// Adds a rank-r adapter: A ~ U(-1/sqrt(in), 1/sqrt(in)) from `seed`, B = 0; freezes the base weights.
  /// @pre no adapter yet; valid options.
  void add_adapter(const lora_options& options) {
    validate(options);
    require(!has_adapter(), "this layer already has a LoRA adapter");
    require(options.rank <= std::min(in_, out_), "LoRA rank ", options.rank, " exceeds the layer's smaller side (", in_,
            " -> ", out_, ")");
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    auto generator = at::detail::createCPUGenerator(options.seed);
    torch::Tensor a = torch::rand({options.rank, in_}, generator, torch::kFloat64) * (2 * bound) - bound;
    const auto like = torch::TensorOptions().dtype(weight.dtype()).device(weight.device());
    lora_A = register_parameter("lora_A", a.to(like));
    lora_B = register_parameter("lora_B", torch::zeros({out_, options.rank}, like));
    scale_ = options.alpha / static_cast<double>(options.rank);
    weight.set_requires_grad(false);
    if (bias.defined()) bias.set_requires_grad(false);
  }

  [[nodiscard]] bool has_adapter() const { return lora_A.defined(); }
  [[nodiscard]] bool enabled() const { return enabled_; }
  [[nodiscard]] bool merged() const { return merged_; }
  [[nodiscard]] double scale() const { return scale_; }
  [[nodiscard]] linear_role role() const { return role_; }
  [[nodiscard]] std::int64_t in_features() const { return in_; }
  [[nodiscard]] std::int64_t out_features() const { return out_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }

  /// W += scale * B A. The output is unchanged (up to rounding) and no longer needs the adapter's matmuls.
  void merge() {
    if (!has_adapter() || merged_) return;
    torch::NoGradGuard no_grad;
    weight.add_(torch::matmul(lora_B, lora_A), scale_);
    merged_ = true;
  }
  /// W -= scale * B A: undoes merge().
  void unmerge() {
    if (!has_adapter() || !merged_) return;
    torch::NoGradGuard no_grad;
    weight.sub_(torch::matmul(lora_B, lora_A), scale_);
    merged_ = false;
  }

  torch::Tensor weight, bias, lora_A, lora_B;

 private:
  std::int64_t in_ = 0, out_ = 0;
  linear_role role_ = linear_role::attention;
  double scale_ = 1.0;
  bool enabled_ = true;
  bool merged_ = false;
};

/// Every lora_linear of `module`, by its dotted path (e.g. "double_blocks.0.img_attn.qkv"), in module order.
inline std::vector<std::pair<std::string, std::shared_ptr<lora_linear>>> lora_layers(torch::nn::Module& module) {
  std::vector<std::pair<std::string, std::shared_ptr<lora_linear>>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    if (auto layer = std::dynamic_pointer_cast<lora_linear>(item.value())) out.emplace_back(item.key(), layer);
  return out;
}

/// Adds adapters to the layers whose role `options` targets and freezes every other parameter of `module`.
/// Each layer's A is drawn from options.seed + its index among the lora_linear layers, so the adapters do
/// not depend on which other layers are targeted. Returns the number of adapted layers.
/// @pre at least one layer is targeted (else invalid_input).
inline std::int64_t add_lora(torch::nn::Module& module, const lora_options& options) {
  validate(options);
  // The rank is checked against every targeted layer before any adapter is allocated: a rank above a layer's
  // smaller side adds nothing but memory (lora.rank = 1000000000 would ask for terabytes).
  for (auto& [name, layer] : lora_layers(module))
    if (options.targets(layer->role()))
      require(options.rank <= std::min(layer->in_features(), layer->out_features()), "LoRA rank ", options.rank,
              " exceeds ", std::min(layer->in_features(), layer->out_features()), ", the smaller side of layer ", name,
              " (", layer->in_features(), " -> ", layer->out_features(), ")");
  for (auto& parameter : module.parameters()) parameter.set_requires_grad(false);
  std::int64_t adapted = 0;
  std::uint64_t index = 0;
  for (auto& [name, layer] : lora_layers(module)) {
    if (options.targets(layer->role())) {
      lora_options layer_options = options;
      layer_options.seed = options.seed + index;
      layer->add_adapter(layer_options);
      ++adapted;
    }
    ++index;
  }
  require(adapted > 0, "lora_options target no linear layer of this model (attention ", options.attention, ", mlp ",
          options.mlp, ", modulation ", options.modulation, ", embedding ", options.embedding, ")");
  return adapted;
}

/// The adapters' A and B tensors, in module order (what trains under LoRA).
inline std::vector<torch::Tensor> lora_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (auto& [name, layer] : lora_layers(module))
    if (layer->has_adapter()) {
      out.push_back(layer->lora_A);
      out.push_back(layer->lora_B);
    }
  return out;
}

inline void set_lora_enabled(torch::nn::Module& module, bool enabled) {
  for (auto& [name, layer] : lora_layers(module)) layer->set_enabled(enabled);
}
inline void merge_lora(torch::nn::Module& module) {
  for (auto& [name, layer] : lora_layers(module)) layer->merge();
}
inline void unmerge_lora(torch::nn::Module& module) {
  for (auto& [name, layer] : lora_layers(module)) layer->unmerge();
}

/// The adapters as a name -> tensor map: "<layer>.lora_A.weight" [r, in], "<layer>.lora_B.weight" [out, r].
inline std::map<std::string, torch::Tensor> lora_state(torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, layer] : lora_layers(module))
    if (layer->has_adapter()) {
      out.emplace(name + ".lora_A.weight", layer->lora_A.detach());
      out.emplace(name + ".lora_B.weight", layer->lora_B.detach());
    }
  return out;
}

/// Copies adapter tensors into `module`'s adapters (converted to each adapter's dtype and device). Every
/// missing, unexpected or mis-shaped name is listed in one invalid_input message.
/// @pre the module's adapters were added with the rank of the saved ones.
inline void load_lora_state(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors) {
  std::vector<std::string> problems;
  std::map<std::string, torch::Tensor> wanted;
  for (auto& [name, layer] : lora_layers(module))
    if (layer->has_adapter()) {
      wanted.emplace(name + ".lora_A.weight", layer->lora_A);
      wanted.emplace(name + ".lora_B.weight", layer->lora_B);
    }
  for (const auto& [name, target] : wanted) {
    const auto found = tensors.find(name);
    if (found == tensors.end())
      problems.push_back("missing " + name);
    else if (found->second.sizes() != target.sizes())
      problems.push_back("shape mismatch " + name);
  }
  for (const auto& [name, tensor] : tensors)
    if (!wanted.contains(name)) problems.push_back("unexpected " + name);
  if (!problems.empty()) {
    std::string line;
    for (std::size_t i = 0; i < problems.size() && i < 10; ++i) line += (i ? ", " : "") + problems[i];
    if (problems.size() > 10) line += ", ... and " + std::to_string(problems.size() - 10) + " more";
    fail("cannot load LoRA weights: ", line);
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : wanted) target.copy_(tensors.at(name));
}

/// Writes the adapters (lora_state) to a safetensors file, with metadata "format" = "branchgrpo-lora" plus
/// `metadata`. The tensors keep their dtype.
inline void save_lora(torch::nn::Module& module, const std::filesystem::path& path,
                      std::map<std::string, std::string> metadata = {}) {
  const auto state = lora_state(module);
  require(!state.empty(), "save_lora: the model has no LoRA adapters (", path.string(), ")");
  metadata.emplace("format", "branchgrpo-lora");
  save_safetensors(path, state, metadata);
}

/// Reads adapters written by save_lora into `module` (which must have adapters of the same ranks).
inline void load_lora(torch::nn::Module& module, const std::filesystem::path& path) {
  load_lora_state(module, load_safetensors(path));
}

}  // namespace branchgrpo
