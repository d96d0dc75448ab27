#pragma once
// The Wan2.1 text-to-video transformer as torch::nn modules, with the parameter names of the official layout
// (model_specs/wan/layout.hpp), so model.named_parameters() lists exactly wan_expected_tensors(config, official).
//
//   latents [B, C_in, F, H, W] --Conv3d, kernel = stride = patch--> tokens [B, N = f h w, dim]  (f, h, w) ids
//   e  = time_embedding(sinusoid(t))           [B, dim]     Linear -> SiLU -> Linear
//   e0 = time_projection(SiLU(e))              [B, 6, dim]  (shift, scale, gate) x (self-attention, FFN)
//   context = text_embedding(text zero-padded to text_len)  Linear -> GELU tanh -> Linear
//   layers x block:
//     x += gate1 * self_attn((1 + scale1) LN(x) + shift1)     q, k RMSNorm over dim, 3-axis RoPE per head
//     x += cross_attn(norm3(x), context)                      affine LayerNorm, no gate, no RoPE, no mask
//     x += gate2 * ffn((1 + scale2) LN(x) + shift2)           Linear -> GELU tanh -> Linear
//     with (shift1, scale1, gate1, shift2, scale2, gate2) = block.modulation + e0
//   head: (shift, scale) = head.modulation + e (e itself, not SiLU(e)), head((1 + scale) LN(x) + shift)
//   unpatchify: token feature ((p_f ph + p_h) pw + p_w) C_out + c -> [B, C_out, F, H, W]
//
// Float32 whatever the weights' dtype (as the official code, which runs these under autocast(float32)): the
// sinusoid (float64, then float32), e and e0, the modulation sums, the residual stream x, every LayerNorm and
// RMSNorm, and the RoPE rotation (angles in float64). The linear layers, the patch embedding and the attention
// products run in the weights' dtype.
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"  // make_linear, flux_rope, apply_rope, detail::run_block
#include "branchgrpo/torch/lora.hpp"

namespace branchgrpo {

/// RoPE position ids of the tokens of an f x h x w grid, frame-major then row-major (the order of the patch
/// embedding's flatten): token (i h + j) w + k has (i, j, k). Shape [f h w, 3], float64.
/// Example: f = 1, h = 1, w = 2 -> [[0, 0, 0], [0, 0, 1]].
inline torch::Tensor wan_grid_ids(std::int64_t f, std::int64_t h, std::int64_t w) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor a = torch::arange(f, f64).view({f, 1, 1}).expand({f, h, w});
  const torch::Tensor b = torch::arange(h, f64).view({1, h, 1}).expand({f, h, w});
  const torch::Tensor c = torch::arange(w, f64).view({1, 1, w}).expand({f, h, w});
  return torch::stack({a, b, c}, -1).reshape({f * h * w, 3});
}

namespace detail {

/// LayerNorm over the last dim in float32 (affine when weight is defined); returns float32.
inline torch::Tensor wan_layer_norm(const torch::Tensor& x, double eps, const torch::Tensor& weight = {},
                                    const torch::Tensor& bias = {}) {
  const auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat32) : t; };
  return torch::layer_norm(x.to(torch::kFloat32), {x.size(-1)}, f32(weight), f32(bias), eps);
}

}  // namespace detail

/// x * rsqrt(mean(x^2) + eps) * weight over the whole dim (all heads together, unlike FLUX), in float32.
class wan_rms_norm : public torch::nn::Module {
 public:
  wan_rms_norm(std::int64_t dim, double eps) : eps_(eps) { weight = register_parameter("weight", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor f = x.to(torch::kFloat32);
    return f * torch::rsqrt(f.pow(2).mean(-1, true) + eps_) * weight.to(torch::kFloat32);
  }
  torch::Tensor weight;

 private:
  double eps_;
};

/// The affine LayerNorm before the cross-attention (official "norm3"), in float32.
class wan_affine_norm : public torch::nn::Module {
 public:
  wan_affine_norm(std::int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
    bias = register_parameter("bias", torch::zeros({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return detail::wan_layer_norm(x, eps_, weight, bias); }
  torch::Tensor weight, bias;

 private:
  double eps_;
};

/// q, k, v, o projections with q / k RMSNorm; self-attention (with RoPE) or cross-attention (without).
class wan_attention : public torch::nn::Module {
 public:
  wan_attention(std::int64_t dim, std::int64_t heads, double eps)
      : q(flux_child(*this, "q", make_linear(dim, dim, linear_role::attention))),
        k(flux_child(*this, "k", make_linear(dim, dim, linear_role::attention))),
        v(flux_child(*this, "v", make_linear(dim, dim, linear_role::attention))),
        o(flux_child(*this, "o", make_linear(dim, dim, linear_role::attention))),
        norm_q(flux_child(*this, "norm_q", std::make_shared<wan_rms_norm>(dim, eps))),
        norm_k(flux_child(*this, "norm_k", std::make_shared<wan_rms_norm>(dim, eps))),
        heads_(heads) {}

  /// x [B, Lq, dim] attends to source [B, Lk, dim] (x itself for self-attention); rope only for self-attention.
  /// Inputs may be float32; the projections run in the weights' dtype. Returns [B, Lq, dim] in that dtype.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& source, const rope_table* rope) {
    const auto dtype = q->weight.scalar_type();
    const torch::Tensor xs = x.to(dtype), ss = source.to(dtype);
    const auto split = [&](const torch::Tensor& t) {  // [B, L, dim] -> [B, heads, L, head_dim]
      return t.reshape({t.size(0), t.size(1), heads_, t.size(2) / heads_}).permute({0, 2, 1, 3});
    };
    torch::Tensor qh = split(norm_q->forward(q->forward(xs))), kh = split(norm_k->forward(k->forward(ss)));
    if (rope) {  // rotate in float32 (the norms' output), then back to the weights' dtype
      qh = apply_rope(qh, *rope);
      kh = apply_rope(kh, *rope);
    }
    const torch::Tensor out = attention(qh.to(dtype), kh.to(dtype), split(v->forward(ss)));
    return o->forward(out.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(1), -1}));
  }

  std::shared_ptr<lora_linear> q, k, v, o;
  std::shared_ptr<wan_rms_norm> norm_q, norm_k;

 private:
  std::int64_t heads_;
};

/// Linear "0" -> activation -> Linear "2", named as the official nn.Sequential (text embedding, time
/// embedding, FFN).
class wan_mlp : public torch::nn::Module {
 public:
  enum class activation { gelu_tanh, silu };
  wan_mlp(std::int64_t in, std::int64_t hidden, std::int64_t out, linear_role role, activation act)
      : fc1(flux_child(*this, "0", make_linear(in, hidden, role))),
        fc2(flux_child(*this, "2", make_linear(hidden, out, role))),
        act_(act) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor h = fc1->forward(x.to(fc1->weight.scalar_type()));
    return fc2->forward(act_ == activation::silu ? torch::silu(h) : torch::gelu(h, "tanh"));
  }
  std::shared_ptr<lora_linear> fc1, fc2;

 private:
  activation act_;
};

/// SiLU -> Linear "1" (dim -> 6 dim), named as the official nn.Sequential.
class wan_time_projection : public torch::nn::Module {
 public:
  explicit wan_time_projection(std::int64_t dim)
      : linear(flux_child(*this, "1", make_linear(dim, 6 * dim, linear_role::modulation))) {}
  torch::Tensor forward(const torch::Tensor& e) {
    return linear->forward(torch::silu(e).to(linear->weight.scalar_type()));
  }
  std::shared_ptr<lora_linear> linear;
};

/// One Wan block: modulated self-attention with RoPE, cross-attention to the text, modulated FFN.
class wan_block : public torch::nn::Module {
 public:
  explicit wan_block(const wan_config& c)
      : self_attn(flux_child(*this, "self_attn", std::make_shared<wan_attention>(c.dim, c.heads, c.eps))),
        cross_attn(flux_child(*this, "cross_attn", std::make_shared<wan_attention>(c.dim, c.heads, c.eps))),
        norm3(flux_child(*this, "norm3", std::make_shared<wan_affine_norm>(c.dim, c.eps))),
        ffn(flux_child(
            *this, "ffn",
            std::make_shared<wan_mlp>(c.dim, c.ffn_dim, c.dim, linear_role::mlp, wan_mlp::activation::gelu_tanh))),
        eps_(c.eps) {
    // The official initialization: randn / sqrt(dim).
    modulation = register_parameter("modulation", torch::randn({1, 6, c.dim}) / std::sqrt(double(c.dim)));
  }

  /// {x [B, N, dim] float32, e0 [B, 6, dim] float32, context [B, L, dim], rope cos, rope sin} -> {x float32}.
  std::vector<torch::Tensor> run(const std::vector<torch::Tensor>& in) {
    const torch::Tensor &x0 = in[0], &e0 = in[1], &context = in[2];
    const rope_table rope{in[3], in[4]};
    const auto e = (modulation.to(torch::kFloat32) + e0).chunk(6, 1);  // each [B, 1, dim]
    const auto modulated = [&](const torch::Tensor& x, const torch::Tensor& shift, const torch::Tensor& scale) {
      return detail::wan_layer_norm(x, eps_) * (1 + scale) + shift;
    };
    torch::Tensor x = x0;
    const torch::Tensor h = modulated(x, e[0], e[1]);
    x = x + self_attn->forward(h, h, &rope).to(torch::kFloat32) * e[2];
    x = x + cross_attn->forward(norm3->forward(x), context, nullptr).to(torch::kFloat32);
    x = x + ffn->forward(modulated(x, e[3], e[4])).to(torch::kFloat32) * e[5];
    return {x};
  }

  std::shared_ptr<wan_attention> self_attn, cross_attn;
  std::shared_ptr<wan_affine_norm> norm3;
  std::shared_ptr<wan_mlp> ffn;
  torch::Tensor modulation;

 private:
  double eps_;
};

/// The output head: (shift, scale) = modulation + e, then Linear "head" to C_out x patch volume features.
class wan_head : public torch::nn::Module {
 public:
  explicit wan_head(const wan_config& c)
      : head(flux_child(*this, "head", make_linear(c.dim, c.out_dim * c.patch_volume(), linear_role::embedding))),
        eps_(c.eps) {
    modulation = register_parameter("modulation", torch::randn({1, 2, c.dim}) / std::sqrt(double(c.dim)));
  }
  /// x [B, N, dim] float32, e [B, dim] float32 -> [B, N, C_out x patch volume] in the weights' dtype.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& e) {
    const auto m = (modulation.to(torch::kFloat32) + e.unsqueeze(1)).chunk(2, 1);  // shift, scale
    return head->forward((detail::wan_layer_norm(x, eps_) * (1 + m[1]) + m[0]).to(head->weight.scalar_type()));
  }
  std::shared_ptr<lora_linear> head;
  torch::Tensor modulation;

 private:
  double eps_;
};

/// The Wan2.1 T2V transformer. Parameter names are the official checkpoint names; the attention and FFN
/// linears are lora_linear (roles attention / mlp: adapted by lora_options{} defaults), the embeddings, time
/// projection and head are lora_linear of roles embedding / modulation (frozen unless asked for).
/// Example: wan_transformer(wan_config::tiny()).forward(x [2, 4, 3, 4, 6], t [2] in [0, 1000], text [2, 5, 24])
///   has shape [2, 3, 3, 4, 6]; an odd 3 x 5 latent frame gives [2, 3, 3, 3, 5].
class wan_transformer : public torch::nn::Module {
 public:
  explicit wan_transformer(const wan_config& config) : config_((validate(config), config)) {
    const std::int64_t d = config.dim;
    const auto& p = config.patch;
    patch_embedding = register_module(
        "patch_embedding",
        torch::nn::Conv3d(torch::nn::Conv3dOptions(config.in_dim, d, {p[0], p[1], p[2]}).stride({p[0], p[1], p[2]})));
    text_embedding = flux_child(
        *this, "text_embedding",
        std::make_shared<wan_mlp>(config.text_dim, d, d, linear_role::embedding, wan_mlp::activation::gelu_tanh));
    time_embedding =
        flux_child(*this, "time_embedding",
                   std::make_shared<wan_mlp>(config.freq_dim, d, d, linear_role::embedding, wan_mlp::activation::silu));
    time_projection = flux_child(*this, "time_projection", std::make_shared<wan_time_projection>(d));
    auto list = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.layers; ++i) {
      blocks.push_back(std::make_shared<wan_block>(config));
      list->push_back(blocks.back());
    }
    head = flux_child(*this, "head", std::make_shared<wan_head>(config));
  }

  [[nodiscard]] const wan_config& config() const { return config_; }

  /// Recompute each block in the backward instead of storing its activations (less memory, ~1 more forward).
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  [[nodiscard]] bool gradient_checkpointing() const { return checkpointing_; }

  /// latents [B, in_dim, F, H, W], timestep [B] (Wan's scale: 1000 sigma), text [B, L, text_dim] with
  /// L <= text_len -> velocity [B, out_dim, F, H, W] in the weights' dtype.
  /// The text is zero-padded to text_len tokens and every token is attended (the official code passes no
  /// text lengths to the cross-attention), so pass the encoder's features of the real tokens only, or zeros
  /// after them. F, H, W that are not multiples of the patch are zero-padded at the end and the output cropped
  /// back (the pad cells are ordinary tokens with their own RoPE positions).
  /// @pre shapes as above (else invalid_input naming the shapes).
  torch::Tensor forward(const torch::Tensor& latents, const torch::Tensor& timestep, const torch::Tensor& text) {
    const wan_config& c = config_;
    require(latents.dim() == 5 && latents.size(1) == c.in_dim, "wan latents must be [B, ", c.in_dim, ", F, H, W], got ",
            latents.sizes());
    const std::int64_t b = latents.size(0);
    require(text.dim() == 3 && text.size(0) == b && text.size(2) == c.text_dim && text.size(1) <= c.text_len,
            "wan text must be [", b, ", L <= ", c.text_len, ", ", c.text_dim, "], got ", text.sizes());
    require(timestep.numel() == b, "wan needs one timestep per row: ", timestep.numel(), " for ", b);
    const torch::Tensor& w = patch_embedding->weight;
    const auto like = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());

    std::array<std::int64_t, 3> size{}, padded{}, grid{};
    for (std::size_t a = 0; a < 3; ++a) {
      size[a] = latents.size(static_cast<std::int64_t>(a) + 2);
      grid[a] = (size[a] + c.patch[a] - 1) / c.patch[a];
      padded[a] = grid[a] * c.patch[a];
    }
    const torch::Tensor input =
        padded == size
            ? latents
            : torch::constant_pad_nd(latents, {0, padded[2] - size[2], 0, padded[1] - size[1], 0, padded[0] - size[0]});
    torch::Tensor x = patch_embedding->forward(input.to(like)).flatten(2).transpose(1, 2).to(torch::kFloat32);

    const torch::Tensor sinusoid = flux_timestep_embedding(timestep.reshape({b}).to(w.device()), c.freq_dim, 1.0);
    const torch::Tensor e = time_embedding->forward(sinusoid).to(torch::kFloat32);
    const torch::Tensor e0 = time_projection->forward(e).to(torch::kFloat32).reshape({b, 6, c.dim});
    const torch::Tensor padded_text =
        torch::constant_pad_nd(text.to(like), {0, 0, 0, c.text_len - text.size(1)});  // zeros after the text
    const torch::Tensor context = text_embedding->forward(padded_text);

    const rope_table rope =
        flux_rope(wan_grid_ids(grid[0], grid[1], grid[2]).to(w.device()), c.rope_axes(), c.rope_theta);
    for (auto& block : blocks) x = detail::run_block(*block, {x, e0, context, rope.cos, rope.sin}, checkpointing_)[0];
    const torch::Tensor tokens = head->forward(x, e);  // [B, N, patch volume x out_dim]

    const auto& p = c.patch;
    const torch::Tensor video = tokens.reshape({b, grid[0], grid[1], grid[2], p[0], p[1], p[2], c.out_dim})
                                    .permute({0, 7, 1, 4, 2, 5, 3, 6})
                                    .reshape({b, c.out_dim, padded[0], padded[1], padded[2]});
    return padded == size ? video : video.narrow(2, 0, size[0]).narrow(3, 0, size[1]).narrow(4, 0, size[2]);
  }

  torch::nn::Conv3d patch_embedding{nullptr};
  std::shared_ptr<wan_mlp> text_embedding, time_embedding;
  std::shared_ptr<wan_time_projection> time_projection;
  std::vector<std::shared_ptr<wan_block>> blocks;
  std::shared_ptr<wan_head> head;

 private:
  wan_config config_;
  bool checkpointing_ = false;
};

// ---- Weights ------------------------------------------------------------------------------------------------

/// Renames a complete checkpoint between layouts (the tensors themselves are shared, not copied).
/// Example: a diffusers map with "blocks.0.attn2.to_q.weight" -> official "blocks.0.cross_attn.q.weight".
/// @pre `tensors` passes check_wan_tensors(config, from) (else invalid_input listing the problems).
inline std::map<std::string, torch::Tensor> convert_wan_weights(const std::map<std::string, torch::Tensor>& tensors,
                                                                const wan_config& config, wan_layout from,
                                                                wan_layout to) {
  const wan_key_report report = check_wan_tensors(config, from, detail::tensor_shapes(tensors));
  require(report.ok(), "Wan checkpoint (", layout_name(from), " layout) does not match the config: ", report.message());
  if (from == to) return tensors;
  std::map<std::string, torch::Tensor> out;
  for (const wan_key_mapping& entry : wan_diffusers_to_official(config)) {
    if (from == wan_layout::diffusers)
      out[entry.target] = tensors.at(entry.source);
    else
      out[entry.source] = tensors.at(entry.target);
  }
  return out;
}

/// The model's base weights by official name (LoRA tensors excluded), detached.
inline std::map<std::string, torch::Tensor> wan_state(wan_transformer& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters())
    if (item.key().find("lora_") == std::string::npos) out.emplace(item.key(), item.value().detach());
  return out;
}

/// Loads a checkpoint in either layout (detected from the names when `layout` is empty) into `model`,
/// converting each tensor to the model's dtype and device (e.g. bf16 files into an fp32 model).
/// Every missing / unexpected key and shape mismatch is named in one invalid_input message (the first 10,
/// then a count). LoRA adapters are left as they are.
/// @pre the model's adapters are not merged (merged weights would be overwritten by the base).
inline void load_wan_weights(wan_transformer& model, const std::map<std::string, torch::Tensor>& tensors,
                             std::optional<wan_layout> layout = std::nullopt) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  if (!layout) layout = detect_wan_layout(names);
  require(layout.has_value(), "cannot tell the Wan layout of a checkpoint of ", tensors.size(),
          " tensors (neither official nor diffusers names)");
  const auto official = convert_wan_weights(tensors, model.config(), *layout, wan_layout::official);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (item.key().find("lora_") != std::string::npos) continue;
    item.value().copy_(official.at(item.key()));
  }
}

}  // namespace branchgrpo
