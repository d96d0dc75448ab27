#pragma once
// The FLUX.1 transformer as torch::nn modules, with the parameter names of the bfl layout
// (model_specs/flux/layout.hpp), so model.named_parameters() lists exactly flux_expected_tensors(config, bfl).
//
//   latents [B, C, H, W] --pack 2x2--> img tokens [B, H/2 * W/2, 4C]         ids (0, row, col)
//   text features [B, L, context_in]                                          ids (0, 0, 0)
//   vec = time_in(emb(1000 t)) + guidance_in(emb(1000 g)) + vector_in(pooled)
//   img = img_in(img), txt = txt_in(txt)
//   depth_double x double-stream block (own weights per stream, joint attention over [txt; img])
//   depth_single x single-stream block over [txt; img] (parallel attention + MLP in linear1 / linear2)
//   final layer on the image tokens: adaLN (shift, scale) then linear -> [B, N, 4C] --unpack--> [B, C, H, W]
//
// Attention: per head, q and k RMS-normalized (learned scale), rotated by 3-axis RoPE (per-axis frequencies
// theta^(-2j / d_axis) times the position along that axis, pairs (x_2i, x_2i+1) rotated as complex numbers),
// then softmax(q k^T / sqrt(d)) v through compat.hpp's attention. Modulation: (1 + scale) * LN(x) + shift,
// residuals gated; LayerNorms without affine, eps 1e-6; GELU tanh.
#include <algorithm>
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
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"

namespace branchgrpo {

// ---- Packing and positions ---------------------------------------------------------------------------------

/// [B, C, H, W] -> [B, (H/2)(W/2), 4C]: token (i, j) holds, channel-major, the 2x2 patch at rows 2i, 2i+1 and
/// columns 2j, 2j+1, i.e. feature 4c + 2 di + dj = x[c, 2i + di, 2j + dj].
/// Example: C = 1, H = W = 2, x = [[1, 2], [3, 4]] -> one token [1, 2, 3, 4].
/// @pre x is 4-D with even H and W (flux_transformer::forward_latents pads odd sizes first).
inline torch::Tensor pack_latents(const torch::Tensor& x) {
  require(x.dim() == 4, "pack_latents expects [B, C, H, W], got ", x.dim(), " dimensions");
  const std::int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  require(h % 2 == 0 && w % 2 == 0, "pack_latents needs even H and W, got ", h, " x ", w);
  return x.reshape({b, c, h / 2, 2, w / 2, 2}).permute({0, 2, 4, 1, 3, 5}).reshape({b, (h / 2) * (w / 2), c * 4});
}

/// Inverse of pack_latents: [B, (H/2)(W/2), 4C] -> [B, C, H, W].
/// @pre H and W even, tokens == (H/2)(W/2), features divisible by 4.
inline torch::Tensor unpack_latents(const torch::Tensor& tokens, std::int64_t height, std::int64_t width) {
  require(tokens.dim() == 3, "unpack_latents expects [B, N, 4C], got ", tokens.dim(), " dimensions");
  require(height % 2 == 0 && width % 2 == 0, "unpack_latents needs even H and W, got ", height, " x ", width);
  const std::int64_t b = tokens.size(0), n = tokens.size(1), f = tokens.size(2);
  require(n == (height / 2) * (width / 2) && f % 4 == 0, "unpack_latents: ", n, " tokens of ", f,
          " features do not make a ", height, " x ", width, " latent");
  return tokens.reshape({b, height / 2, width / 2, f / 4, 2, 2})
      .permute({0, 3, 1, 4, 2, 5})
      .reshape({b, f / 4, height, width});
}

/// Position ids of the packed image tokens, row-major: token i * cols + j has (0, i, j). Shape [rows*cols, 3].
/// Example: rows 2, cols 2 -> [[0,0,0], [0,0,1], [0,1,0], [0,1,1]].
inline torch::Tensor flux_image_ids(std::int64_t rows, std::int64_t cols) {
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const torch::Tensor r = torch::arange(rows, f64).view({rows, 1}).expand({rows, cols});
  const torch::Tensor c = torch::arange(cols, f64).view({1, cols}).expand({rows, cols});
  return torch::stack({torch::zeros({rows, cols}, f64), r, c}, -1).reshape({rows * cols, 3});
}

/// Position ids of the text tokens: all zero, [tokens, 3].
inline torch::Tensor flux_text_ids(std::int64_t tokens) { return torch::zeros({tokens, 3}, torch::kFloat64); }

/// cos and sin of the rotary angles, each [B, 1, L, head_dim / 2] (one angle per rotated pair).
struct rope_table {
  torch::Tensor cos, sin;
};

/// 3-axis RoPE angles: for axis a of width d_a, pair j < d_a / 2 gets angle pos_a * theta^(-2j / d_a); the
/// axes' pairs are concatenated in axis order. Computed in float64, returned in `dtype` on the ids' device.
/// Example: axes {2, 2, 4}, theta 10000, ids (0, 1, 2) -> angles {0, 1, 2, 2 * 10000^(-1/2) = 0.02}.
/// @pre ids [B, L, 3] (or [L, 3]), every axis width even.
inline rope_table flux_rope(const torch::Tensor& ids, const std::array<std::int64_t, 3>& axes, double theta,
                            torch::Dtype dtype = torch::kFloat32) {
  const torch::Tensor pos = (ids.dim() == 2 ? ids.unsqueeze(0) : ids).to(torch::kFloat64);
  require(pos.dim() == 3 && pos.size(2) == 3, "flux_rope expects ids [B, L, 3]");
  // The frequencies on the ids' device: a host table times CUDA ids is a device mismatch.
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(pos.device());
  std::vector<torch::Tensor> angles;
  for (std::int64_t a = 0; a < 3; ++a) {
    const auto d = axes[static_cast<std::size_t>(a)];
    const torch::Tensor exponent = torch::arange(0, d, 2, f64) / static_cast<double>(d);
    const torch::Tensor omega = torch::pow(theta, -exponent);  // [d/2]
    angles.push_back(pos.select(2, a).unsqueeze(-1) * omega);  // [B, L, d/2]
  }
  const torch::Tensor angle = torch::cat(angles, -1).unsqueeze(1);  // [B, 1, L, D/2]
  return {torch::cos(angle).to(dtype), torch::sin(angle).to(dtype)};
}

/// Rotates pairs (x_2i, x_2i+1) of x [B, H, L, D] by the table's angles: (c x0 - s x1, s x0 + c x1).
inline torch::Tensor apply_rope(const torch::Tensor& x, const rope_table& rope) {
  const auto sizes = x.sizes().vec();
  const torch::Tensor pairs = x.reshape({x.size(0), x.size(1), x.size(2), x.size(3) / 2, 2});
  const torch::Tensor x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  return torch::stack({rope.cos * x0 - rope.sin * x1, rope.sin * x0 + rope.cos * x1}, -1).reshape(sizes);
}

/// Sinusoidal embedding of t [B] with FLUX's conventions: t scaled by `time_factor`, frequencies
/// exp(-ln(max_period) j / half), cos first then sin. Returns [B, dim] in float32 on t's device.
/// Example: t = 0 -> [1 (half times), 0 (half times)].
inline torch::Tensor flux_timestep_embedding(const torch::Tensor& t, std::int64_t dim = 256,
                                             double time_factor = 1000.0, double max_period = 10000.0) {
  const std::int64_t half = dim / 2;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(t.device());  // as flux_rope's frequencies
  const torch::Tensor freqs = torch::exp(-std::log(max_period) * torch::arange(half, f64) / static_cast<double>(half));
  const torch::Tensor args = (t.to(torch::kFloat64) * time_factor).unsqueeze(1) * freqs.unsqueeze(0);
  torch::Tensor embedding = torch::cat({torch::cos(args), torch::sin(args)}, -1);
  if (dim % 2) embedding = torch::cat({embedding, torch::zeros_like(embedding.narrow(1, 0, 1))}, -1);
  return embedding.to(torch::kFloat32);
}

// ---- Building blocks -----------------------------------------------------------------------------------------

/// Registers `module` under `name` in `parent` and returns it typed.
template <class M>
std::shared_ptr<M> flux_child(torch::nn::Module& parent, const std::string& name, std::shared_ptr<M> module) {
  return parent.register_module(name, std::move(module));
}

inline std::shared_ptr<lora_linear> make_linear(std::int64_t in, std::int64_t out, linear_role role, bool bias = true) {
  return std::make_shared<lora_linear>(in, out, bias, role);
}

/// x * rsqrt(mean(x^2) + 1e-6) * scale, computed in float32.
class flux_rms_norm : public torch::nn::Module {
 public:
  explicit flux_rms_norm(std::int64_t dim) { scale = register_parameter("scale", torch::ones({dim})); }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor f = x.to(torch::kFloat32);
    return (f * torch::rsqrt(f.pow(2).mean(-1, true) + 1e-6)).to(x.scalar_type()) * scale;
  }
  torch::Tensor scale;
};

class flux_qk_norm : public torch::nn::Module {
 public:
  explicit flux_qk_norm(std::int64_t dim)
      : query_norm(flux_child(*this, "query_norm", std::make_shared<flux_rms_norm>(dim))),
        key_norm(flux_child(*this, "key_norm", std::make_shared<flux_rms_norm>(dim))) {}
  std::shared_ptr<flux_rms_norm> query_norm, key_norm;
};

/// in_layer -> SiLU -> out_layer.
class flux_mlp_embedder : public torch::nn::Module {
 public:
  flux_mlp_embedder(std::int64_t in, std::int64_t hidden)
      : in_layer(flux_child(*this, "in_layer", make_linear(in, hidden, linear_role::embedding))),
        out_layer(flux_child(*this, "out_layer", make_linear(hidden, hidden, linear_role::embedding))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out_layer->forward(torch::silu(in_layer->forward(x))); }
  std::shared_ptr<lora_linear> in_layer, out_layer;
};

/// The (shift, scale, gate) triples of a block: lin(SiLU(vec)) split in `count` chunks of `hidden`.
class flux_modulation : public torch::nn::Module {
 public:
  flux_modulation(std::int64_t hidden, std::int64_t count)
      : lin(flux_child(*this, "lin", make_linear(hidden, count * hidden, linear_role::modulation))), count_(count) {}
  std::vector<torch::Tensor> forward(const torch::Tensor& vec) {
    return lin->forward(torch::silu(vec)).unsqueeze(1).chunk(count_, -1);
  }
  std::shared_ptr<lora_linear> lin;

 private:
  std::int64_t count_;
};

/// Fused qkv projection, q/k norm and output projection of one stream of a double block.
class flux_self_attention : public torch::nn::Module {
 public:
  flux_self_attention(std::int64_t hidden, std::int64_t head_dim, bool qkv_bias)
      : qkv(flux_child(*this, "qkv", make_linear(hidden, 3 * hidden, linear_role::attention, qkv_bias))),
        norm(flux_child(*this, "norm", std::make_shared<flux_qk_norm>(head_dim))),
        proj(flux_child(*this, "proj", make_linear(hidden, hidden, linear_role::attention))) {}
  std::shared_ptr<lora_linear> qkv;
  std::shared_ptr<flux_qk_norm> norm;
  std::shared_ptr<lora_linear> proj;
};

/// Linear ("0") -> GELU tanh -> Linear ("2"), named as the bfl Sequential.
class flux_mlp : public torch::nn::Module {
 public:
  flux_mlp(std::int64_t hidden, std::int64_t mlp_hidden)
      : fc1(flux_child(*this, "0", make_linear(hidden, mlp_hidden, linear_role::mlp))),
        fc2(flux_child(*this, "2", make_linear(mlp_hidden, hidden, linear_role::mlp))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::gelu(fc1->forward(x), "tanh")); }
  std::shared_ptr<lora_linear> fc1, fc2;
};

namespace detail {

inline torch::Tensor flux_layer_norm(const torch::Tensor& x) {
  return torch::layer_norm(x, {x.size(-1)}, {}, {}, 1e-6);
}

/// [B, L, 3 * hidden] -> q, k, v each [B, heads, L, head_dim].
inline std::vector<torch::Tensor> split_heads(const torch::Tensor& qkv, std::int64_t heads) {
  const std::int64_t b = qkv.size(0), l = qkv.size(1), d = qkv.size(2) / (3 * heads);
  return qkv.reshape({b, l, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
}

/// Attention of q, k, v [B, H, L, D] with RoPE, merged back to [B, L, H * D].
inline torch::Tensor rope_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    const rope_table& rope) {
  const torch::Tensor out = attention(apply_rope(q, rope), apply_rope(k, rope), v);
  return out.permute({0, 2, 1, 3}).reshape({q.size(0), q.size(2), q.size(1) * q.size(3)});
}

}  // namespace detail

/// Double-stream block: image and text keep their own weights; attention runs jointly over [txt; img].
class flux_double_block : public torch::nn::Module {
 public:
  explicit flux_double_block(const flux_config& c)
      : img_mod(flux_child(*this, "img_mod", std::make_shared<flux_modulation>(c.hidden, 6))),
        img_attn(
            flux_child(*this, "img_attn", std::make_shared<flux_self_attention>(c.hidden, c.head_dim(), c.qkv_bias))),
        img_mlp(flux_child(*this, "img_mlp", std::make_shared<flux_mlp>(c.hidden, c.mlp_hidden()))),
        txt_mod(flux_child(*this, "txt_mod", std::make_shared<flux_modulation>(c.hidden, 6))),
        txt_attn(
            flux_child(*this, "txt_attn", std::make_shared<flux_self_attention>(c.hidden, c.head_dim(), c.qkv_bias))),
        txt_mlp(flux_child(*this, "txt_mlp", std::make_shared<flux_mlp>(c.hidden, c.mlp_hidden()))),
        heads_(c.heads) {}

  /// {img, txt, vec, rope cos, rope sin} -> {img, txt}.
  std::vector<torch::Tensor> run(const std::vector<torch::Tensor>& in) {
    const torch::Tensor &img = in[0], &txt = in[1], &vec = in[2];
    const rope_table rope{in[3], in[4]};
    const auto im = img_mod->forward(vec), tm = txt_mod->forward(vec);  // shift, scale, gate x 2
    const auto prepare = [&](const torch::Tensor& x, const std::vector<torch::Tensor>& mod, flux_self_attention& attn) {
      const torch::Tensor modulated = (1 + mod[1]) * detail::flux_layer_norm(x) + mod[0];
      auto qkv = detail::split_heads(attn.qkv->forward(modulated), heads_);
      qkv[0] = attn.norm->query_norm->forward(qkv[0]).to(qkv[2].scalar_type());
      qkv[1] = attn.norm->key_norm->forward(qkv[1]).to(qkv[2].scalar_type());
      return qkv;
    };
    const auto iq = prepare(img, im, *img_attn), tq = prepare(txt, tm, *txt_attn);
    const torch::Tensor joint = detail::rope_attention(torch::cat({tq[0], iq[0]}, 2), torch::cat({tq[1], iq[1]}, 2),
                                                       torch::cat({tq[2], iq[2]}, 2), rope);
    const std::int64_t l = txt.size(1);
    const torch::Tensor txt_out = joint.narrow(1, 0, l), img_out = joint.narrow(1, l, joint.size(1) - l);
    torch::Tensor new_img = img + im[2] * img_attn->proj->forward(img_out);
    new_img = new_img + im[5] * img_mlp->forward((1 + im[4]) * detail::flux_layer_norm(new_img) + im[3]);
    torch::Tensor new_txt = txt + tm[2] * txt_attn->proj->forward(txt_out);
    new_txt = new_txt + tm[5] * txt_mlp->forward((1 + tm[4]) * detail::flux_layer_norm(new_txt) + tm[3]);
    return {new_img, new_txt};
  }

  std::shared_ptr<flux_modulation> img_mod;
  std::shared_ptr<flux_self_attention> img_attn;
  std::shared_ptr<flux_mlp> img_mlp;
  std::shared_ptr<flux_modulation> txt_mod;
  std::shared_ptr<flux_self_attention> txt_attn;
  std::shared_ptr<flux_mlp> txt_mlp;

 private:
  std::int64_t heads_;
};

/// Single-stream block: linear1 -> [q k v | mlp_in]; attention and GELU-tanh MLP in parallel; linear2 of both.
class flux_single_block : public torch::nn::Module {
 public:
  explicit flux_single_block(const flux_config& c)
      : linear1(flux_child(*this, "linear1",
                           make_linear(c.hidden, 3 * c.hidden + c.mlp_hidden(), linear_role::attention_mlp))),
        linear2(
            flux_child(*this, "linear2", make_linear(c.hidden + c.mlp_hidden(), c.hidden, linear_role::attention_mlp))),
        norm(flux_child(*this, "norm", std::make_shared<flux_qk_norm>(c.head_dim()))),
        modulation(flux_child(*this, "modulation", std::make_shared<flux_modulation>(c.hidden, 3))),
        hidden_(c.hidden),
        heads_(c.heads) {}

  /// {x, vec, rope cos, rope sin} -> {x}.
  std::vector<torch::Tensor> run(const std::vector<torch::Tensor>& in) {
    const torch::Tensor &x = in[0], &vec = in[1];
    const rope_table rope{in[2], in[3]};
    const auto mod = modulation->forward(vec);
    const torch::Tensor fused = linear1->forward((1 + mod[1]) * detail::flux_layer_norm(x) + mod[0]);
    auto qkv = detail::split_heads(fused.narrow(-1, 0, 3 * hidden_), heads_);
    const torch::Tensor mlp = fused.narrow(-1, 3 * hidden_, fused.size(-1) - 3 * hidden_);
    const torch::Tensor q = norm->query_norm->forward(qkv[0]).to(qkv[2].scalar_type());
    const torch::Tensor k = norm->key_norm->forward(qkv[1]).to(qkv[2].scalar_type());
    const torch::Tensor attn = detail::rope_attention(q, k, qkv[2], rope);
    return {x + mod[2] * linear2->forward(torch::cat({attn, torch::gelu(mlp, "tanh")}, -1))};
  }

  std::shared_ptr<lora_linear> linear1, linear2;
  std::shared_ptr<flux_qk_norm> norm;
  std::shared_ptr<flux_modulation> modulation;

 private:
  std::int64_t hidden_, heads_;
};

/// adaLN_modulation = Sequential(SiLU, Linear): only the Linear ("1") has weights.
class flux_ada_ln : public torch::nn::Module {
 public:
  explicit flux_ada_ln(std::int64_t hidden)
      : linear(flux_child(*this, "1", make_linear(hidden, 2 * hidden, linear_role::modulation))) {}
  std::shared_ptr<lora_linear> linear;
};

/// (shift, scale) = adaLN(SiLU(vec)); linear((1 + scale) LN(x) + shift).
class flux_last_layer : public torch::nn::Module {
 public:
  flux_last_layer(std::int64_t hidden, std::int64_t out)
      : linear(flux_child(*this, "linear", make_linear(hidden, out, linear_role::embedding))),
        adaLN_modulation(flux_child(*this, "adaLN_modulation", std::make_shared<flux_ada_ln>(hidden))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& vec) {
    const auto mod = adaLN_modulation->linear->forward(torch::silu(vec)).unsqueeze(1).chunk(2, -1);
    return linear->forward((1 + mod[1]) * detail::flux_layer_norm(x) + mod[0]);
  }
  std::shared_ptr<lora_linear> linear;
  std::shared_ptr<flux_ada_ln> adaLN_modulation;
};

namespace detail {

/// Recompute-in-backward for one block (gradient checkpointing): the forward keeps only the block's inputs;
/// the backward reruns the block with autograd on and differentiates it. Inputs: the block's tensors, then
/// its trainable parameters (so their gradients flow through this node). The block must outlive the graph.
template <class Block>
struct flux_checkpoint : torch::autograd::Function<flux_checkpoint<Block>> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, Block* block,
                                                at::TensorList inputs,
                                                at::TensorList /*parameters: inputs only for autograd*/) {
    ctx->saved_data["block"] = reinterpret_cast<std::int64_t>(block);
    ctx->saved_data["inputs"] = static_cast<std::int64_t>(inputs.size());
    ctx->save_for_backward(inputs.vec());
    torch::NoGradGuard no_grad;
    return block->run(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* block = reinterpret_cast<Block*>(ctx->saved_data["block"].toInt());
    std::vector<torch::Tensor> inputs;
    for (const auto& saved : ctx->get_saved_variables()) {
      torch::Tensor input = saved.detach();
      if (input.is_floating_point()) input.set_requires_grad(true);
      inputs.push_back(input);
    }
    std::vector<torch::Tensor> parameters;
    for (const auto& parameter : block->parameters())
      if (parameter.requires_grad()) parameters.push_back(parameter);
    torch::AutoGradMode enable(true);
    const auto outputs = block->run(inputs);
    std::vector<torch::Tensor> roots, grads;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      roots.push_back(outputs[i]);
      grads.push_back(grad_outputs[i].defined() ? grad_outputs[i] : torch::zeros_like(outputs[i]));
    }
    std::vector<torch::Tensor> wrt = inputs;
    wrt.insert(wrt.end(), parameters.begin(), parameters.end());
    auto result = torch::autograd::grad(roots, wrt, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                        /*allow_unused=*/true);
    result.insert(result.begin(), torch::Tensor());  // the non-tensor `block` argument
    return result;
  }
};

template <class Block>
std::vector<torch::Tensor> run_block(Block& block, const std::vector<torch::Tensor>& inputs, bool checkpoint) {
  if (!checkpoint || !torch::GradMode::is_enabled()) return block.run(inputs);
  std::vector<torch::Tensor> parameters;
  for (const auto& parameter : block.parameters())
    if (parameter.requires_grad()) parameters.push_back(parameter);
  return flux_checkpoint<Block>::apply(&block, at::TensorList(inputs), at::TensorList(parameters));
}

}  // namespace detail

/// Inputs of one forward in token form (flux_transformer::forward).
struct flux_inputs {
  torch::Tensor img;        ///< [B, N, in_channels] packed image tokens
  torch::Tensor img_ids;    ///< [B, N, 3] or [N, 3]
  torch::Tensor txt;        ///< [B, L, context_in]
  torch::Tensor txt_ids;    ///< [B, L, 3] or [L, 3]
  torch::Tensor timesteps;  ///< [B], sigma in [0, 1] (scaled by 1000 inside)
  torch::Tensor pooled;     ///< [B, vec_in]
  torch::Tensor guidance;   ///< [B]; required iff config.guidance_embed
};

/// The FLUX.1 transformer. Parameter names are the bfl checkpoint names; linear layers are lora_linear.
/// Example: flux_transformer(flux_config::tiny()).forward_latents(x [2, 4, 6, 6], txt [2, 5, 32],
///   pooled [2, 16], t [2], g [2]) has shape [2, 4, 6, 6]; an odd 5 x 7 latent gives [2, 4, 5, 7].
class flux_transformer : public torch::nn::Module {
 public:
  explicit flux_transformer(const flux_config& config) : config_((validate(config), config)) {
    const std::int64_t h = config.hidden;
    img_in = flux_child(*this, "img_in", make_linear(config.in_channels, h, linear_role::embedding));
    time_in = flux_child(*this, "time_in", std::make_shared<flux_mlp_embedder>(256, h));
    vector_in = flux_child(*this, "vector_in", std::make_shared<flux_mlp_embedder>(config.vec_in, h));
    if (config.guidance_embed)
      guidance_in = flux_child(*this, "guidance_in", std::make_shared<flux_mlp_embedder>(256, h));
    txt_in = flux_child(*this, "txt_in", make_linear(config.context_in, h, linear_role::embedding));
    auto doubles = register_module("double_blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.depth_double; ++i) {
      double_blocks.push_back(std::make_shared<flux_double_block>(config));
      doubles->push_back(double_blocks.back());
    }
    auto singles = register_module("single_blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.depth_single; ++i) {
      single_blocks.push_back(std::make_shared<flux_single_block>(config));
      singles->push_back(single_blocks.back());
    }
    final_layer = flux_child(*this, "final_layer", std::make_shared<flux_last_layer>(h, config.in_channels));
  }

  [[nodiscard]] const flux_config& config() const { return config_; }

  /// Recompute each block in the backward instead of storing its activations (less memory, ~1 more forward).
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  [[nodiscard]] bool gradient_checkpointing() const { return checkpointing_; }

  /// Token-level forward -> [B, N, in_channels] (the velocity of the packed tokens).
  torch::Tensor forward(const flux_inputs& in) {
    require(in.img.dim() == 3 && in.img.size(2) == config_.in_channels, "flux img must be [B, N, ", config_.in_channels,
            "], got ", in.img.sizes());
    require(in.txt.dim() == 3 && in.txt.size(2) == config_.context_in, "flux txt must be [B, L, ", config_.context_in,
            "], got ", in.txt.sizes());
    const std::int64_t b = in.img.size(0);
    require(
        in.txt.size(0) == b && in.pooled.dim() == 2 && in.pooled.size(0) == b && in.pooled.size(1) == config_.vec_in,
        "flux txt / pooled batch or width mismatch: img ", in.img.sizes(), ", txt ", in.txt.sizes(), ", pooled ",
        in.pooled.sizes());
    require(in.timesteps.numel() == b, "flux needs one timestep per row: ", in.timesteps.numel(), " for ", b);
    const torch::Tensor& w = img_in->weight;
    const auto dtype = w.scalar_type();
    const auto like = torch::TensorOptions().dtype(dtype).device(w.device());

    torch::Tensor vec = time_in->forward(flux_timestep_embedding(in.timesteps.reshape({b})).to(like));
    if (config_.guidance_embed) {
      require(in.guidance.defined() && in.guidance.numel() == b,
              "this FLUX config embeds guidance: pass one "
              "guidance value per row");
      vec = vec + guidance_in->forward(flux_timestep_embedding(in.guidance.reshape({b})).to(like));
    }
    vec = vec + vector_in->forward(in.pooled.to(like));
    torch::Tensor img = img_in->forward(in.img.to(like));
    torch::Tensor txt = txt_in->forward(in.txt.to(like));

    const auto batch_ids = [&](const torch::Tensor& ids) { return ids.dim() == 2 ? ids.unsqueeze(0) : ids; };
    const torch::Tensor txt_ids = batch_ids(in.txt_ids), img_ids = batch_ids(in.img_ids);
    const std::int64_t id_batch = std::max(txt_ids.size(0), img_ids.size(0));
    const torch::Tensor ids = torch::cat({txt_ids.expand({id_batch, -1, -1}), img_ids.expand({id_batch, -1, -1})}, 1);
    require(ids.size(1) == txt.size(1) + img.size(1), "flux ids cover ", ids.size(1), " tokens, inputs have ",
            txt.size(1) + img.size(1));
    const rope_table rope = flux_rope(ids.to(w.device()), config_.rope_axes, config_.rope_theta, dtype);

    for (auto& block : double_blocks) {
      const auto out = detail::run_block(*block, {img, txt, vec, rope.cos, rope.sin}, checkpointing_);
      img = out[0];
      txt = out[1];
    }
    torch::Tensor x = torch::cat({txt, img}, 1);
    for (auto& block : single_blocks) x = detail::run_block(*block, {x, vec, rope.cos, rope.sin}, checkpointing_)[0];
    x = x.narrow(1, txt.size(1), img.size(1));
    return final_layer->forward(x, vec);
  }

  /// Latent-level forward: x [B, C, H, W] (C = in_channels / 4) -> velocity [B, C, H, W]. Odd H or W are
  /// zero-padded at the bottom / right to even, and the output cropped back (the pad cells get ids too).
  torch::Tensor forward_latents(const torch::Tensor& x, const torch::Tensor& txt, const torch::Tensor& pooled,
                                const torch::Tensor& timesteps, const torch::Tensor& guidance = {}) {
    require(x.dim() == 4 && x.size(1) == config_.latent_channels(), "flux latents must be [B, ",
            config_.latent_channels(), ", H, W], got ", x.sizes());
    const std::int64_t height = x.size(2), width = x.size(3);
    const std::int64_t even_h = height + height % 2, even_w = width + width % 2;
    const torch::Tensor padded =
        (even_h == height && even_w == width) ? x : torch::constant_pad_nd(x, {0, even_w - width, 0, even_h - height});
    const torch::Tensor tokens = forward({.img = pack_latents(padded),
                                          .img_ids = flux_image_ids(even_h / 2, even_w / 2),
                                          .txt = txt,
                                          .txt_ids = flux_text_ids(txt.size(1)),
                                          .timesteps = timesteps,
                                          .pooled = pooled,
                                          .guidance = guidance});
    const torch::Tensor out = unpack_latents(tokens, even_h, even_w);
    return out.narrow(2, 0, height).narrow(3, 0, width);
  }

  std::shared_ptr<lora_linear> img_in;
  std::shared_ptr<flux_mlp_embedder> time_in, vector_in, guidance_in;
  std::shared_ptr<lora_linear> txt_in;
  std::vector<std::shared_ptr<flux_double_block>> double_blocks;
  std::vector<std::shared_ptr<flux_single_block>> single_blocks;
  std::shared_ptr<flux_last_layer> final_layer;

 private:
  flux_config config_;
  bool checkpointing_ = false;
};

// ---- Weights ------------------------------------------------------------------------------------------------

namespace detail {

inline std::map<std::string, std::vector<std::int64_t>> tensor_shapes(const std::map<std::string, torch::Tensor>& m) {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& [name, tensor] : m) shapes.emplace(name, tensor.sizes().vec());
  return shapes;
}

}  // namespace detail

/// Converts a complete checkpoint between layouts (names, fused/split projections, the norm_out swap).
/// Example: a diffusers map with to_q, to_k, to_v [h, h] -> bfl qkv [3h, h] = cat(q, k, v); and back.
/// @pre `tensors` passes check_flux_tensors(config, from) (else invalid_input listing the problems).
inline std::map<std::string, torch::Tensor> convert_flux_weights(const std::map<std::string, torch::Tensor>& tensors,
                                                                 const flux_config& config, flux_layout from,
                                                                 flux_layout to) {
  const flux_key_report report = check_flux_tensors(config, from, detail::tensor_shapes(tensors));
  require(report.ok(), "FLUX checkpoint (", layout_name(from),
          " layout) does not match the config: ", report.message());
  if (from == to) return tensors;
  const auto swap = [](const torch::Tensor& t) {
    const auto halves = t.chunk(2, 0);
    return torch::cat({halves[1], halves[0]}, 0);
  };
  std::map<std::string, torch::Tensor> out;
  for (const flux_key_mapping& entry : flux_diffusers_to_bfl(config)) {
    if (from == flux_layout::diffusers) {
      std::vector<torch::Tensor> parts;
      for (const auto& source : entry.sources) parts.push_back(tensors.at(source));
      out[entry.target] = entry.merge == flux_merge::concat        ? torch::cat(parts, 0)
                          : entry.merge == flux_merge::swap_halves ? swap(parts[0])
                                                                   : parts[0];
      continue;
    }
    const torch::Tensor& t = tensors.at(entry.target);
    if (entry.merge == flux_merge::swap_halves) {
      out[entry.sources[0]] = swap(t);
    } else if (entry.merge == flux_merge::copy) {
      out[entry.sources[0]] = t;
    } else {  // split a fused tensor: q, k, v are hidden rows each, the rest (single-block MLP) last
      std::int64_t offset = 0;
      for (std::size_t i = 0; i < entry.sources.size(); ++i) {
        const std::int64_t rows = i < 3 ? config.hidden : t.size(0) - 3 * config.hidden;
        out[entry.sources[i]] = t.narrow(0, offset, rows);
        offset += rows;
      }
    }
  }
  return out;
}

/// The model's base weights by bfl name (LoRA tensors excluded), detached.
inline std::map<std::string, torch::Tensor> flux_state(flux_transformer& model) {
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
inline void load_flux_weights(flux_transformer& model, const std::map<std::string, torch::Tensor>& tensors,
                              std::optional<flux_layout> layout = std::nullopt) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  if (!layout) layout = detect_flux_layout(names);
  require(layout.has_value(), "cannot tell the FLUX layout of a checkpoint of ", tensors.size(),
          " tensors (neither bfl nor diffusers names)");
  const auto bfl = convert_flux_weights(tensors, model.config(), *layout, flux_layout::bfl);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (item.key().find("lora_") != std::string::npos) continue;
    item.value().copy_(bfl.at(item.key()));
  }
}

}  // namespace branchgrpo
