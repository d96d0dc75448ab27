#pragma once
// The Stable Diffusion 3.5 transformer (MMDiT-X) as torch::nn modules, with the parameter names of the stability
// layout (model_specs/sd3/layout.hpp), so model.named_parameters() lists exactly sd3_expected_tensors(config,
// stability), in order.
//
//   latents [B, C, H, W] --Conv2d, kernel = stride = patch--> x [B, N = (H/p)(W/p), hidden], row-major
//   x += pos_embed cropped at the centre of its grid: rows from (grid - H/p) / 2, columns from (grid - W/p) / 2
//   c   = t_embedder(sinusoid(timestep)) + y_embedder(pooled)     each Linear -> SiLU -> Linear
//   ctx = context_embedder(context)                               [B, L, hidden]
//   depth x joint block (text stream "context_block", image stream "x_block", each with its own weights):
//     (shift, scale, gate) x (attention, MLP) [, x (attention 2)] = adaLN_modulation(SiLU(c)) per stream
//     q, k, v per stream from (1 + scale) LN(stream) + shift; q, k RMSNorm per head; one attention over [x; ctx]
//     x   += gate1 proj(x's rows);  dual blocks: x += gate3 attn2((1 + scale3) LN(x_in) + shift3)  (x_in: the block's
//            input, normalized once for both);  x += gate2 mlp((1 + scale2) LN(x) + shift2)
//     ctx likewise with its own proj and MLP, except in the last block, whose text stream is "pre only": it gives
//     the attention its q, k, v (modulated by a (shift, scale) pair) and is not updated
//   final layer: (shift, scale) = adaLN(SiLU(c)), linear((1 + scale) LN(x) + shift) -> [B, N, p p C_out]
//   unpatchify: token (i, j) feature (a p + b) C_out + k -> out[k, i p + a, j p + b]
//
// LayerNorms without affine, eps 1e-6; RMSNorm eps 1e-6 in float32; MLPs 4 x hidden with GELU tanh; the sinusoid is
// 256 wide, cos then sin, frequencies exp(-ln(10000) j / 128), of the timestep as given (1000 sigma). Everything else
// runs in the weights' dtype. Attention goes through compat.hpp's attention (LibTorch 1.13 has no fused kernel).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/sd3/config.hpp"
#include "branchgrpo/model_specs/sd3/layout.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"  // flux_child, make_linear, flux_last_layer, run_block, ...
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"  // wan_rms_norm, wan_mlp

namespace branchgrpo {

/// adaLN_modulation = Sequential(SiLU, Linear "1"): `count` chunks of hidden, each [B, 1, hidden].
class sd3_modulation : public torch::nn::Module {
 public:
  sd3_modulation(std::int64_t hidden, std::int64_t count)
      : linear(flux_child(*this, "1", make_linear(hidden, count * hidden, linear_role::modulation))), count_(count) {}
  std::vector<torch::Tensor> forward(const torch::Tensor& c) {
    return linear->forward(torch::silu(c)).unsqueeze(1).chunk(count_, -1);
  }
  std::shared_ptr<lora_linear> linear;

 private:
  std::int64_t count_;
};

/// One stream's attention projections: fused qkv, q / k RMSNorm per head (qk_norm), the output projection (none
/// in the pre-only text stream).
class sd3_attention : public torch::nn::Module {
 public:
  sd3_attention(const sd3_config& c, bool with_proj)
      : qkv(flux_child(*this, "qkv", make_linear(c.hidden, 3 * c.hidden, linear_role::attention))), heads_(c.heads) {
    if (c.qk_norm) {
      ln_q = flux_child(*this, "ln_q", std::make_shared<wan_rms_norm>(c.head_dim(), 1e-6));
      ln_k = flux_child(*this, "ln_k", std::make_shared<wan_rms_norm>(c.head_dim(), 1e-6));
    }
    if (with_proj) proj = flux_child(*this, "proj", make_linear(c.hidden, c.hidden, linear_role::attention));
  }

  /// x [B, L, hidden] -> q, k, v, each [B, heads, L, head_dim] in x's dtype, q and k normalized.
  std::vector<torch::Tensor> project(const torch::Tensor& x) {
    auto out = detail::split_heads(qkv->forward(x), heads_);
    if (ln_q) {
      out[0] = ln_q->forward(out[0]).to(out[2].scalar_type());
      out[1] = ln_k->forward(out[1]).to(out[2].scalar_type());
    }
    return out;
  }

  std::shared_ptr<lora_linear> qkv;
  std::shared_ptr<wan_rms_norm> ln_q, ln_k;
  std::shared_ptr<lora_linear> proj;

 private:
  std::int64_t heads_;
};

/// fc1 -> GELU tanh -> fc2, hidden -> 4 hidden -> hidden.
class sd3_mlp : public torch::nn::Module {
 public:
  explicit sd3_mlp(std::int64_t hidden)
      : fc1(flux_child(*this, "fc1", make_linear(hidden, 4 * hidden, linear_role::mlp))),
        fc2(flux_child(*this, "fc2", make_linear(4 * hidden, hidden, linear_role::mlp))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::gelu(fc1->forward(x), "tanh")); }
  std::shared_ptr<lora_linear> fc1, fc2;
};

/// One stream of a joint block (stability's DismantledBlock): attention, the image stream's second attention
/// (dual blocks), MLP (not in a pre-only stream), modulation of 2 (pre only), 6 or 9 (dual) chunks.
class sd3_stream : public torch::nn::Module {
 public:
  sd3_stream(const sd3_config& c, bool pre_only, bool dual)
      : attn(flux_child(*this, "attn", std::make_shared<sd3_attention>(c, !pre_only))) {
    if (dual) attn2 = flux_child(*this, "attn2", std::make_shared<sd3_attention>(c, true));
    if (!pre_only) mlp = flux_child(*this, "mlp", std::make_shared<sd3_mlp>(c.hidden));
    adaLN_modulation = flux_child(*this, "adaLN_modulation",
                                  std::make_shared<sd3_modulation>(c.hidden, pre_only ? 2
                                                                             : dual   ? 9
                                                                                      : 6));
  }
  std::shared_ptr<sd3_attention> attn, attn2;
  std::shared_ptr<sd3_mlp> mlp;
  std::shared_ptr<sd3_modulation> adaLN_modulation;
};

namespace detail {

/// (1 + scale) LN(x) + shift, given LN(x).
inline torch::Tensor sd3_modulate(const torch::Tensor& normed, const torch::Tensor& shift, const torch::Tensor& scale) {
  return normed * (1 + scale) + shift;
}

/// Attention of q, k, v [B, H, L, D] merged back to [B, L, H D].
inline torch::Tensor sd3_attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const torch::Tensor out = attention(q, k, v);
  return out.permute({0, 2, 1, 3}).reshape({q.size(0), q.size(2), q.size(1) * q.size(3)});
}

}  // namespace detail

/// Joint block: the text stream (context_block) and the image stream (x_block) attend together.
class sd3_joint_block : public torch::nn::Module {
 public:
  sd3_joint_block(const sd3_config& c, std::int64_t index)
      : context_block(flux_child(*this, "context_block", std::make_shared<sd3_stream>(c, index == c.depth - 1, false))),
        x_block(flux_child(*this, "x_block", std::make_shared<sd3_stream>(c, false, c.dual_attention(index)))) {}

  /// {x [B, N, hidden], ctx [B, L, hidden], c [B, hidden]} -> {x, ctx}, or {x} for the pre-only last block.
  std::vector<torch::Tensor> run(const std::vector<torch::Tensor>& in) {
    const torch::Tensor &x = in[0], &ctx = in[1], &c = in[2];
    const auto xm = x_block->adaLN_modulation->forward(c);  // shift, scale, gate: attention, MLP[, attention 2]
    const auto cm = context_block->adaLN_modulation->forward(c);
    const torch::Tensor x_normed = detail::flux_layer_norm(x);
    const auto xq = x_block->attn->project(detail::sd3_modulate(x_normed, xm[0], xm[1]));
    const auto cq = context_block->attn->project(detail::sd3_modulate(detail::flux_layer_norm(ctx), cm[0], cm[1]));
    const torch::Tensor joint =
        detail::sd3_attend(torch::cat({xq[0], cq[0]}, 2), torch::cat({xq[1], cq[1]}, 2), torch::cat({xq[2], cq[2]}, 2));
    const std::int64_t n = x.size(1);
    torch::Tensor new_x = x + xm[2] * x_block->attn->proj->forward(joint.narrow(1, 0, n));
    if (x_block->attn2) {
      const auto q2 = x_block->attn2->project(detail::sd3_modulate(x_normed, xm[6], xm[7]));
      new_x = new_x + xm[8] * x_block->attn2->proj->forward(detail::sd3_attend(q2[0], q2[1], q2[2]));
    }
    new_x = new_x + xm[5] * x_block->mlp->forward(detail::sd3_modulate(detail::flux_layer_norm(new_x), xm[3], xm[4]));
    if (!context_block->mlp) return {new_x};
    torch::Tensor new_ctx = ctx + cm[2] * context_block->attn->proj->forward(joint.narrow(1, n, ctx.size(1)));
    new_ctx = new_ctx +
              cm[5] * context_block->mlp->forward(detail::sd3_modulate(detail::flux_layer_norm(new_ctx), cm[3], cm[4]));
    return {new_x, new_ctx};
  }

  std::shared_ptr<sd3_stream> context_block, x_block;
};

/// The patch embedding, stability's x_embedder: a Conv2d "proj" with kernel = stride = patch.
class sd3_patch_embed : public torch::nn::Module {
 public:
  explicit sd3_patch_embed(const sd3_config& c)
      : proj(register_module(
            "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.in_channels, c.hidden, c.patch).stride(c.patch)))) {}
  torch::nn::Conv2d proj;
};

/// t_embedder / y_embedder: a module "mlp" = Linear "0" -> SiLU -> Linear "2".
class sd3_embedder : public torch::nn::Module {
 public:
  sd3_embedder(std::int64_t in, std::int64_t hidden)
      : mlp(flux_child(
            *this, "mlp",
            std::make_shared<wan_mlp>(in, hidden, hidden, linear_role::embedding, wan_mlp::activation::silu))) {}
  std::shared_ptr<wan_mlp> mlp;
};

/// The SD3.5 transformer. Parameter names are the stability checkpoint names; the attention and MLP linears are
/// lora_linear of roles attention / mlp (adapted by lora_options{} defaults), the embedders, modulations and final
/// linear lora_linear of roles embedding / modulation; the patch embedding is a Conv2d and pos_embed a parameter.
/// Example: sd3_transformer(sd3_config::tiny()).forward(x [2, 4, 4, 6], timestep [2] (1000 sigma),
///   context [2, 5, 16], pooled [2, 12]) has shape [2, 4, 4, 6]; a 5 x 6 latent is refused (2 x 2 patches).
class sd3_transformer : public torch::nn::Module {
 public:
  explicit sd3_transformer(const sd3_config& config) : config_((validate(config), config)) {
    const std::int64_t h = config.hidden, grid = config.pos_embed_max_size;
    pos_embed = register_parameter("pos_embed", torch::randn({1, grid * grid, h}) * 0.02);
    x_embedder = flux_child(*this, "x_embedder", std::make_shared<sd3_patch_embed>(config));
    t_embedder = flux_child(*this, "t_embedder", std::make_shared<sd3_embedder>(256, h));
    y_embedder = flux_child(*this, "y_embedder", std::make_shared<sd3_embedder>(config.pooled_in, h));
    context_embedder = flux_child(*this, "context_embedder", make_linear(config.context_in, h, linear_role::embedding));
    auto list = register_module("joint_blocks", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.depth; ++i) {
      joint_blocks.push_back(std::make_shared<sd3_joint_block>(config, i));
      list->push_back(joint_blocks.back());
    }
    final_layer = flux_child(*this, "final_layer", std::make_shared<flux_last_layer>(h, config.patch_features()));
  }

  [[nodiscard]] const sd3_config& config() const { return config_; }

  /// Recompute each block in the backward instead of storing its activations (less memory, ~1 more forward).
  void set_gradient_checkpointing(bool on) { checkpointing_ = on; }
  [[nodiscard]] bool gradient_checkpointing() const { return checkpointing_; }

  /// x [B, in_channels, H, W], timestep [B] (1000 sigma), context [B, L, context_in], pooled [B, pooled_in] ->
  /// velocity [B, out_channels, H, W] in the weights' dtype.
  /// @pre H and W multiples of the patch, H / patch and W / patch at most pos_embed_max_size, shapes as above
  ///   (else invalid_input naming the sizes, e.g. "sd3 latent 5 x 6 is not a whole number of 2 x 2 patches").
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& timestep, const torch::Tensor& context,
                        const torch::Tensor& pooled) {
    const std::int64_t b = check_inputs(x, timestep, context, pooled);
    const std::int64_t p = config_.patch, rows = x.size(2) / p, cols = x.size(3) / p;
    const torch::Tensor& w = context_embedder->weight;
    const auto like = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());

    torch::Tensor tokens = x_embedder->proj->forward(x.to(like)).flatten(2).transpose(1, 2);
    tokens = tokens + cropped_pos_embed(rows, cols);
    const torch::Tensor sinusoid = flux_timestep_embedding(timestep.reshape({b}).to(w.device()), 256, 1.0);
    const torch::Tensor c = t_embedder->mlp->forward(sinusoid.to(like)) + y_embedder->mlp->forward(pooled.to(like));
    torch::Tensor ctx = context_embedder->forward(context.to(like));
    for (auto& block : joint_blocks) {
      const auto out = detail::run_block(*block, {tokens, ctx, c}, checkpointing_);
      tokens = out[0];
      if (out.size() > 1) ctx = out[1];
    }
    const torch::Tensor patches = final_layer->forward(tokens, c);  // [B, N, p p C_out]
    const std::int64_t oc = config_.out_channels;
    return patches.reshape({b, rows, cols, p, p, oc}).permute({0, 5, 1, 3, 2, 4}).reshape({b, oc, rows * p, cols * p});
  }

  /// pos_embed's [1, rows cols, hidden] at the centre of its grid (diffusers' PatchEmbed.cropped_pos_embed).
  /// Example: grid 5, rows 2, cols 3 -> grid rows 1..2, columns 1..3, row-major.
  /// @pre rows, cols <= pos_embed_max_size.
  [[nodiscard]] torch::Tensor cropped_pos_embed(std::int64_t rows, std::int64_t cols) const {
    const std::int64_t grid = config_.pos_embed_max_size;
    return pos_embed.reshape({1, grid, grid, -1})
        .narrow(1, (grid - rows) / 2, rows)
        .narrow(2, (grid - cols) / 2, cols)
        .reshape({1, rows * cols, -1});
  }

  torch::Tensor pos_embed;
  std::shared_ptr<sd3_patch_embed> x_embedder;
  std::shared_ptr<sd3_embedder> t_embedder, y_embedder;
  std::shared_ptr<lora_linear> context_embedder;
  std::vector<std::shared_ptr<sd3_joint_block>> joint_blocks;
  std::shared_ptr<flux_last_layer> final_layer;

 private:
  /// The batch size, after checking every input's shape (one line naming the shapes).
  std::int64_t check_inputs(const torch::Tensor& x, const torch::Tensor& timestep, const torch::Tensor& context,
                            const torch::Tensor& pooled) const {
    const sd3_config& c = config_;
    require(x.dim() == 4 && x.size(1) == c.in_channels, "sd3 latents must be [B, ", c.in_channels, ", H, W], got ",
            x.sizes());
    const std::int64_t b = x.size(0), h = x.size(2), w = x.size(3);
    require(h % c.patch == 0 && w % c.patch == 0, "sd3 latent ", h, " x ", w, " is not a whole number of ", c.patch,
            " x ", c.patch, " patches");
    require(h / c.patch <= c.pos_embed_max_size && w / c.patch <= c.pos_embed_max_size, "sd3 latent ", h, " x ", w,
            " is ", h / c.patch, " x ", w / c.patch, " patches, above pos_embed_max_size ", c.pos_embed_max_size);
    require(context.dim() == 3 && context.size(0) == b && context.size(2) == c.context_in, "sd3 context must be [", b,
            ", L, ", c.context_in, "], got ", context.sizes());
    require(pooled.dim() == 2 && pooled.size(0) == b && pooled.size(1) == c.pooled_in, "sd3 pooled must be [", b, ", ",
            c.pooled_in, "], got ", pooled.sizes());
    require(timestep.numel() == b, "sd3 needs one timestep per row: ", timestep.numel(), " for ", b);
    return b;
  }

  sd3_config config_;
  bool checkpointing_ = false;
};

// ---- Weights ------------------------------------------------------------------------------------------------

/// Converts a complete checkpoint between layouts (names, fused / split q, k, v, the (shift, scale) swaps).
/// Example: a diffusers map with to_q, to_k, to_v [h, h] -> stability qkv [3h, h] = cat(q, k, v); and back.
/// @pre `tensors` passes check_sd3_tensors(config, from) (else invalid_input listing the problems).
inline std::map<std::string, torch::Tensor> convert_sd3_weights(const std::map<std::string, torch::Tensor>& tensors,
                                                                const sd3_config& config, sd3_layout from,
                                                                sd3_layout to) {
  const sd3_key_report report = check_sd3_tensors(config, from, detail::tensor_shapes(tensors));
  require(report.ok(), "SD3 checkpoint (", layout_name(from), " layout) does not match the config: ", report.message());
  if (from == to) return tensors;
  const auto swap = [](const torch::Tensor& t) {
    const auto halves = t.chunk(2, 0);
    return torch::cat({halves[1], halves[0]}, 0);
  };
  std::map<std::string, torch::Tensor> out;
  for (const sd3_key_mapping& entry : sd3_diffusers_to_stability(config)) {
    if (from == sd3_layout::diffusers) {
      std::vector<torch::Tensor> parts;
      for (const auto& source : entry.sources) parts.push_back(tensors.at(source));
      out[entry.target] = entry.merge == sd3_merge::concat        ? torch::cat(parts, 0)
                          : entry.merge == sd3_merge::swap_halves ? swap(parts[0])
                                                                  : parts[0];
      continue;
    }
    const torch::Tensor& t = tensors.at(entry.target);
    if (entry.merge == sd3_merge::concat) {  // q, k, v: equal thirds
      const auto thirds = t.chunk(static_cast<std::int64_t>(entry.sources.size()), 0);
      for (std::size_t i = 0; i < entry.sources.size(); ++i) out[entry.sources[i]] = thirds[i];
    } else {
      out[entry.sources[0]] = entry.merge == sd3_merge::swap_halves ? swap(t) : t;
    }
  }
  return out;
}

/// The model's base weights by stability name (LoRA tensors excluded), detached.
inline std::map<std::string, torch::Tensor> sd3_state(sd3_transformer& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters())
    if (item.key().find("lora_") == std::string::npos) out.emplace(item.key(), item.value().detach());
  return out;
}

/// Loads a checkpoint into `model`: a released single file (names under "model.diffusion_model.", the file's other
/// components skipped), stability names or diffusers names (detected when `layout` is empty), each tensor converted
/// to the model's dtype and device. Every missing / unexpected key and shape mismatch is named in one invalid_input
/// message (the first 10, then a count); a checkpoint of neither layout names a key of each. LoRA adapters are
/// left as they are.
/// Example: {"model.diffusion_model.pos_embed": ..., ..., "first_stage_model.decoder.conv_in.weight": ...} loads as
///   the stability names; {"x.weight"} -> "SD3 checkpoint of 1 tensors is in neither layout: no pos_embed
///   (stability) and no pos_embed.pos_embed (diffusers)".
/// @pre the model's adapters are not merged (merged weights would be overwritten by the base).
inline void load_sd3_weights(sd3_transformer& model, const std::map<std::string, torch::Tensor>& tensors,
                             std::optional<sd3_layout> layout = std::nullopt) {
  const auto part = sd3_transformer_part(tensors);
  const sd3_layout from = layout ? *layout : require_sd3_layout(model.config(), part);
  const auto stability = convert_sd3_weights(part, model.config(), from, sd3_layout::stability);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (item.key().find("lora_") != std::string::npos) continue;
    item.value().copy_(stability.at(item.key()));
  }
}

}  // namespace branchgrpo
