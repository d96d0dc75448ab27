// The native FLUX transformer: config, both weight layouts, packing, RoPE, forward shapes, agreement with the
// independent numpy reference (tests/reference/flux_reference.py), checkpoint loading, gradient checkpointing.
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"
#include "error_text.hpp"
#include "numpy_reference.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

/// Random weights: linear weights and biases N(0, 0.2^2), norm scales 1 + N(0, 0.2^2).
void randomize(flux_transformer& model, std::uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const bool scale = item.key().ends_with(".scale");
    item.value().copy_(torch::randn(item.value().sizes()) * 0.2 + (scale ? 1.0 : 0.0));
  }
}

struct case_inputs {
  torch::Tensor x, txt, pooled, t, g;
};

case_inputs make_inputs(const flux_config& c, std::int64_t b, std::int64_t h, std::int64_t w, std::int64_t l,
                        std::uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({b, c.latent_channels(), h, w}), torch::randn({b, l, c.context_in}), torch::randn({b, c.vec_in}),
          torch::rand({b}), torch::full({b}, 3.5)};
}

torch::Tensor run(flux_transformer& model, const case_inputs& in) {
  torch::NoGradGuard no_grad;
  return model.forward_latents(in.x, in.txt, in.pooled, in.t, model.config().guidance_embed ? in.g : torch::Tensor());
}

/// Runs flux_reference.py on the model's weights and `in`; returns its output as a float64 tensor.
torch::Tensor numpy_reference(flux_transformer& model, const case_inputs& in, const std::string& tag) {
  const flux_config& c = model.config();
  std::ostringstream config;
  config << "hidden " << c.hidden << "\nheads " << c.heads << "\ndepth_double " << c.depth_double << "\ndepth_single "
         << c.depth_single << "\naxes " << c.rope_axes[0] << " " << c.rope_axes[1] << " " << c.rope_axes[2]
         << "\ntheta " << c.rope_theta << "\nguidance_embed " << c.guidance_embed << "\n";
  std::map<std::string, torch::Tensor> tensors = flux_state(model);
  tensors["input.x"] = in.x;
  tensors["input.txt"] = in.txt;
  tensors["input.pooled"] = in.pooled;
  tensors["input.t"] = in.t;
  tensors["input.g"] = in.g;
  return testing::run_numpy_reference("flux_reference.py", "flux_" + tag, config.str(), tensors, in.x.sizes().vec());
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

}  // namespace

TEST_CASE("flux_config presets and validation") {
  const flux_config dev = flux_config::dev();
  CHECK(dev.head_dim() == 128);
  CHECK(dev.mlp_hidden() == 12288);
  CHECK(dev.latent_channels() == 16);
  CHECK(dev.guidance_embed);
  CHECK_FALSE(flux_config::schnell().guidance_embed);
  CHECK(flux_config::schnell().hidden == 3072);
  const flux_config tiny = flux_config::tiny();
  CHECK(tiny.head_dim() == 32);
  CHECK(tiny.latent_channels() == 4);
  CHECK_NOTHROW(validate(dev));
  CHECK_NOTHROW(validate(tiny));
  CHECK(error_of([] { validate(flux_config{.heads = 5}); }) == "flux_config: hidden 3072 is not divisible by heads 5");
  CHECK(error_of([] { validate(flux_config{.depth_double = 100000000}); }) ==
        "flux_config: depth_double 100000000 exceeds the limit 1024");
  CHECK(error_of([] { validate(flux_config{.mlp_ratio = 1e9}); }) ==
        "flux_config: mlp_ratio 1e+09 must give an MLP width in [1, 65536]");
  CHECK(error_of([] {
          validate(flux_config{.rope_axes = {16, 56, 54}});
        }) == "flux_config: rope axes sum to 126, head dim is 128");
  CHECK(error_of([] {
          validate(flux_config{.rope_axes = {15, 57, 56}});
        }) == "flux_config: rope axis 0 has odd or empty dim 15");
  CHECK(error_of([] { validate(flux_config{.in_channels = 6}); }) ==
        "flux_config: in_channels 6 is not a positive multiple of 4 (2x2 packing)");
}

TEST_CASE("flux layouts: expected tensors, detection, key report, diffusers mapping") {
  const auto dev_bfl = flux_expected_tensors(flux_config::dev(), flux_layout::bfl);
  const auto dev_diffusers = flux_expected_tensors(flux_config::dev(), flux_layout::diffusers);
  // bfl: 16 embedder tensors + 19 x 24 + 38 x 8 + 4 = 780; diffusers: 16 + 19 x 32 + 38 x 14 + 4 = 1160.
  CHECK(dev_bfl.size() == 780);
  CHECK(dev_diffusers.size() == 1160);
  CHECK(flux_expected_tensors(flux_config::schnell(), flux_layout::bfl).size() == 776);

  const flux_config tiny = flux_config::tiny();
  const auto bfl = flux_expected_tensors(tiny, flux_layout::bfl);
  const auto find = [](const auto& specs, const std::string& name) {
    for (const auto& spec : specs)
      if (spec.name == name) return spec.shape;
    return std::vector<std::int64_t>{};
  };
  CHECK(bfl.front() == flux_tensor_spec{"img_in.weight", {64, 16}});
  CHECK(find(bfl, "double_blocks.0.img_attn.qkv.weight") == std::vector<std::int64_t>{192, 64});
  CHECK(find(bfl, "double_blocks.1.txt_attn.norm.key_norm.scale") == std::vector<std::int64_t>{32});
  CHECK(find(bfl, "double_blocks.0.img_mod.lin.weight") == std::vector<std::int64_t>{384, 64});
  CHECK(find(bfl, "double_blocks.0.txt_mlp.2.weight") == std::vector<std::int64_t>{64, 256});
  CHECK(find(bfl, "single_blocks.0.linear1.weight") == std::vector<std::int64_t>{448, 64});
  CHECK(find(bfl, "single_blocks.1.linear2.weight") == std::vector<std::int64_t>{64, 320});
  CHECK(find(bfl, "single_blocks.1.modulation.lin.bias") == std::vector<std::int64_t>{192});
  CHECK(find(bfl, "final_layer.linear.weight") == std::vector<std::int64_t>{16, 64});
  CHECK(find(bfl, "final_layer.adaLN_modulation.1.weight") == std::vector<std::int64_t>{128, 64});
  CHECK(find(bfl, "guidance_in.in_layer.weight") == std::vector<std::int64_t>{64, 256});
  CHECK(find(bfl, "time_in.in_layer.weight") == std::vector<std::int64_t>{64, 256});
  CHECK(find(bfl, "vector_in.in_layer.weight") == std::vector<std::int64_t>{64, 16});
  CHECK(find(bfl, "txt_in.weight") == std::vector<std::int64_t>{64, 32});
  const auto diffusers = flux_expected_tensors(tiny, flux_layout::diffusers);
  CHECK(find(diffusers, "transformer_blocks.0.attn.add_k_proj.weight") == std::vector<std::int64_t>{64, 64});
  CHECK(find(diffusers, "transformer_blocks.1.attn.norm_added_q.weight") == std::vector<std::int64_t>{32});
  CHECK(find(diffusers, "single_transformer_blocks.0.proj_mlp.weight") == std::vector<std::int64_t>{256, 64});
  CHECK(find(diffusers, "single_transformer_blocks.0.proj_out.weight") == std::vector<std::int64_t>{64, 320});
  CHECK(find(diffusers, "norm_out.linear.weight") == std::vector<std::int64_t>{128, 64});
  CHECK(find(diffusers, "proj_out.weight") == std::vector<std::int64_t>{16, 64});
  CHECK(find(diffusers, "time_text_embed.guidance_embedder.linear_2.bias") == std::vector<std::int64_t>{64});

  // Without qkv bias the double blocks' fused / split q, k, v biases disappear (single blocks keep theirs).
  flux_config no_bias = tiny;
  no_bias.qkv_bias = false;
  CHECK(flux_expected_tensors(no_bias, flux_layout::bfl).size() == bfl.size() - 2 * 2);
  CHECK(flux_expected_tensors(no_bias, flux_layout::diffusers).size() == diffusers.size() - 2 * 6);

  const std::vector<std::string> bfl_names = {"img_in.weight", "double_blocks.0.img_mod.lin.weight"};
  const std::vector<std::string> diffusers_names = {"x_embedder.bias"};
  const std::vector<std::string> other_names = {"encoder.conv_in.weight"};
  CHECK(detect_flux_layout(bfl_names) == flux_layout::bfl);
  CHECK(detect_flux_layout(diffusers_names) == flux_layout::diffusers);
  CHECK_FALSE(detect_flux_layout(other_names).has_value());
  CHECK(parse_flux_layout("diffusers") == flux_layout::diffusers);
  CHECK(error_of([] { parse_flux_layout("sd3"); }) == "unknown FLUX layout 'sd3' (expected bfl or diffusers)");

  // The documented report example.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& spec : bfl) shapes[spec.name] = spec.shape;
  shapes.erase("img_in.bias");
  shapes["img_in.weight"] = {64, 8};
  shapes["extra.weight"] = {1};
  const flux_key_report report = check_flux_tensors(tiny, flux_layout::bfl, shapes);
  CHECK(report.missing == std::vector<std::string>{"img_in.bias"});
  CHECK(report.mismatched == std::vector<std::string>{"img_in.weight [64, 8] (expected [64, 16])"});
  CHECK(report.unexpected == std::vector<std::string>{"extra.weight"});
  CHECK(report.message() ==
        "missing img_in.bias, unexpected extra.weight, shape mismatch img_in.weight [64, 8] (expected [64, 16])");
  // An empty checkpoint: 25 problems... truncated after 10 with a count.
  const flux_key_report empty = check_flux_tensors(tiny, flux_layout::bfl, {});
  CHECK(empty.missing.size() == bfl.size());
  CHECK(empty.message().ends_with(", ... and " + std::to_string(bfl.size() - 10) + " more"));
  CHECK(empty.message().starts_with("missing img_in.weight, missing img_in.bias, "));

  // The mapping: one entry per bfl tensor (same order), every diffusers tensor a source exactly once.
  const auto mapping = flux_diffusers_to_bfl(tiny);
  REQUIRE(mapping.size() == bfl.size());
  std::multiset<std::string> sources;
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    CHECK(mapping[i].target == bfl[i].name);
    sources.insert(mapping[i].sources.begin(), mapping[i].sources.end());
  }
  CHECK(sources.size() == diffusers.size());
  for (const auto& spec : diffusers) CHECK(sources.count(spec.name) == 1);
  CHECK(mapping[find_if(mapping.begin(), mapping.end(),
                        [](const auto& m) { return m.target == "double_blocks.0.img_attn.qkv.weight"; }) -
                mapping.begin()] ==
        flux_key_mapping{"double_blocks.0.img_attn.qkv.weight",
                         {"transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_k.weight",
                          "transformer_blocks.0.attn.to_v.weight"},
                         flux_merge::concat});
  CHECK(mapping.back() ==
        flux_key_mapping{"final_layer.adaLN_modulation.1.bias", {"norm_out.linear.bias"}, flux_merge::swap_halves});
}

TEST_CASE("packing, position ids, RoPE and the timestep embedding against hand values") {
  // pack: C = 1, 2 x 2 -> one token [1, 2, 3, 4] (feature 4c + 2 di + dj).
  const torch::Tensor x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({1, 1, 2, 2});
  CHECK(torch::equal(pack_latents(x), torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({1, 1, 4})));
  // C = 2, H = 2, W = 4: token 1 (columns 2, 3) = [c0: 3, 4, 7, 8 | c1: 11, 12, 15, 16].
  const torch::Tensor y = torch::arange(1, 17, torch::kFloat32).reshape({1, 2, 2, 4});
  const torch::Tensor packed = pack_latents(y);
  CHECK(packed.sizes() == torch::IntArrayRef({1, 2, 8}));
  CHECK(torch::equal(packed[0][1], torch::tensor({3.0f, 4.0f, 7.0f, 8.0f, 11.0f, 12.0f, 15.0f, 16.0f})));
  CHECK(torch::equal(unpack_latents(packed, 2, 4), y));
  CHECK(error_of([] { pack_latents(torch::zeros({1, 1, 3, 2})); }) == "pack_latents needs even H and W, got 3 x 2");

  CHECK(torch::equal(flux_image_ids(2, 2),
                     torch::tensor({0., 0., 0., 0., 0., 1., 0., 1., 0., 0., 1., 1.}, torch::kFloat64).reshape({4, 3})));
  CHECK(torch::equal(flux_text_ids(2), torch::zeros({2, 3}, torch::kFloat64)));

  // axes {2, 2, 4}, theta 10000, ids (0, 1, 2): angles {0 * 1, 1 * 1, 2 * 1, 2 * 10000^(-2/4) = 0.02}.
  const rope_table rope =
      flux_rope(torch::tensor({0.0, 1.0, 2.0}, torch::kFloat64).reshape({1, 3}), {2, 2, 4}, 10000.0, torch::kFloat64);
  const std::vector<double> angles = {0.0, 1.0, 2.0, 0.02};
  REQUIRE(rope.cos.sizes() == torch::IntArrayRef({1, 1, 1, 4}));
  for (int i = 0; i < 4; ++i) {
    CHECK(rope.cos[0][0][0][i].item<double>() == Approx(std::cos(angles[static_cast<std::size_t>(i)])).margin(1e-15));
    CHECK(rope.sin[0][0][0][i].item<double>() == Approx(std::sin(angles[static_cast<std::size_t>(i)])).margin(1e-15));
  }
  // Rotating pair (x0, x1) = (1, 2) by angle 1: (cos 1 - 2 sin 1, sin 1 + 2 cos 1) = (-1.1426, 1.9220).
  const torch::Tensor q =
      torch::tensor({0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0, 0.0}, torch::kFloat64).reshape({1, 1, 1, 8});
  const torch::Tensor r = apply_rope(q, rope);
  CHECK(r[0][0][0][2].item<double>() == Approx(std::cos(1.0) - 2 * std::sin(1.0)).margin(1e-12));
  CHECK(r[0][0][0][3].item<double>() == Approx(std::sin(1.0) + 2 * std::cos(1.0)).margin(1e-12));
  CHECK(r[0][0][0][6].item<double>() == Approx(3 * std::cos(0.02)).margin(1e-12));
  CHECK(r[0][0][0][7].item<double>() == Approx(3 * std::sin(0.02)).margin(1e-12));
  CHECK(r[0][0][0][0].item<double>() == 0.0);

  // t = 0 -> cos parts 1, sin parts 0; t = 0.001 -> argument 1 * freq_j, freq_0 = 1, freq_1 = 10000^(-1/128).
  const torch::Tensor e = flux_timestep_embedding(torch::tensor({0.0, 0.001}));
  REQUIRE(e.sizes() == torch::IntArrayRef({2, 256}));
  CHECK(torch::equal(e[0].narrow(0, 0, 128), torch::ones({128})));
  CHECK(torch::equal(e[0].narrow(0, 128, 128), torch::zeros({128})));
  CHECK(e[1][0].item<double>() == Approx(std::cos(1.0)).margin(1e-6));
  CHECK(e[1][128].item<double>() == Approx(std::sin(1.0)).margin(1e-6));
  CHECK(e[1][1].item<double>() == Approx(std::cos(std::pow(10000.0, -1.0 / 128))).margin(1e-6));
}

TEST_CASE("RoPE and the timestep embedding are made on their input's device") {
  // The meta device holds no data, and an operation mixing a meta tensor with a CPU tensor that is not 0-dim throws
  // "Expected all tensors to be on the same device" as a CUDA one does: a table built on the host fails here on the
  // CPU as it fails in a CUDA forward (FLUX's and Wan's, which call these two on the weights' device).
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  const rope_table rope = flux_rope(torch::zeros({2, 5, 3}, meta.dtype(torch::kFloat64)), {2, 2, 4}, 10000.0);
  CHECK(rope.cos.device().type() == torch::kMeta);
  CHECK(rope.sin.device().type() == torch::kMeta);
  CHECK(rope.cos.sizes() == torch::IntArrayRef({2, 1, 5, 4}));
  const torch::Tensor e = flux_timestep_embedding(torch::zeros({3}, meta), 7);  // odd: the zero column as well
  CHECK(e.device().type() == torch::kMeta);
  CHECK(e.sizes() == torch::IntArrayRef({3, 7}));
  CHECK(e.scalar_type() == torch::kFloat32);
}

TEST_CASE("flux forward shapes for even and odd latent sizes") {
  torch::manual_seed(0);
  flux_transformer model(flux_config::tiny());
  for (const auto& [h, w] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{6, 6}, {4, 8}, {5, 7}, {1, 1}, {3, 4}}) {
    const case_inputs in = make_inputs(model.config(), 2, h, w, 5, 1);
    const torch::Tensor v = run(model, in);
    CHECK(v.sizes() == torch::IntArrayRef({2, 4, h, w}));
    CHECK(torch::isfinite(v).all().item<bool>());
  }
  const case_inputs in = make_inputs(model.config(), 2, 4, 4, 5, 1);
  CHECK(error_of([&] {
          model.forward_latents(torch::zeros({2, 3, 4, 4}), in.txt, in.pooled, in.t, in.g);
        }).starts_with("flux latents must be [B, 4, H, W]"));
  CHECK(error_of([&] { model.forward_latents(in.x, in.txt, in.pooled, in.t, torch::Tensor()); }) ==
        "this FLUX config embeds guidance: pass one guidance value per row");
  // schnell-style config: no guidance embedding needed.
  flux_config no_guidance = flux_config::tiny();
  no_guidance.guidance_embed = false;
  flux_transformer schnell(no_guidance);
  CHECK(schnell.named_parameters().size() == flux_expected_tensors(no_guidance, flux_layout::bfl).size());
  CHECK(run(schnell, in).sizes() == torch::IntArrayRef({2, 4, 4, 4}));
}

TEST_CASE("the model's parameters are exactly the bfl layout") {
  flux_transformer model(flux_config::tiny());
  const auto params = model.named_parameters();
  const auto expected = flux_expected_tensors(model.config(), flux_layout::bfl);
  REQUIRE(params.size() == expected.size());
  for (const auto& spec : expected) {
    const torch::Tensor* found = params.find(spec.name);
    REQUIRE(found != nullptr);
    CHECK(found->sizes().vec() == spec.shape);
  }
}

TEST_CASE("flux forward agrees with the independent numpy reference to 1e-4") {
  flux_transformer model(flux_config::tiny());
  randomize(model, 7);
  for (const auto& [h, w, tag] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::string>>{{4, 6, "even"}, {5, 3, "odd"}}) {
    const case_inputs in = make_inputs(model.config(), 2, h, w, 3, 11);
    const torch::Tensor ours = run(model, in);
    const torch::Tensor reference = numpy_reference(model, in, tag);
    INFO(tag << " max |diff| " << max_abs_diff(ours, reference) << ", max |v| "
             << reference.abs().max().item<double>());
    CHECK(reference.abs().max().item<double>() > 0.1);  // not a degenerate output
    CHECK(max_abs_diff(ours, reference) < 1e-4);
  }
}

TEST_CASE("one checkpoint in each layout loads into the same module with identical outputs") {
  const flux_config config = flux_config::tiny();
  flux_transformer source(config);
  randomize(source, 3);
  const auto bfl = flux_state(source);
  const auto diffusers = convert_flux_weights(bfl, config, flux_layout::bfl, flux_layout::diffusers);
  CHECK(diffusers.size() == flux_expected_tensors(config, flux_layout::diffusers).size());
  // The norm_out swap: diffusers (scale, shift) = bfl (shift, scale) halves exchanged.
  CHECK(torch::equal(diffusers.at("norm_out.linear.bias").narrow(0, 0, 64),
                     bfl.at("final_layer.adaLN_modulation.1.bias").narrow(0, 64, 64)));
  CHECK(torch::equal(diffusers.at("transformer_blocks.0.attn.to_k.weight"),
                     bfl.at("double_blocks.0.img_attn.qkv.weight").narrow(0, 64, 64)));
  CHECK(torch::equal(diffusers.at("single_transformer_blocks.1.proj_mlp.bias"),
                     bfl.at("single_blocks.1.linear1.bias").narrow(0, 192, 256)));

  const case_inputs in = make_inputs(config, 2, 4, 4, 3, 5);
  flux_transformer from_bfl(config), from_diffusers(config);
  load_flux_weights(from_bfl, bfl);
  load_flux_weights(from_diffusers, diffusers);  // layout detected from the names
  const torch::Tensor expected = run(source, in);
  CHECK(torch::equal(run(from_bfl, in), expected));
  CHECK(torch::equal(run(from_diffusers, in), expected));
  // And back: diffusers -> bfl reproduces the original tensors exactly.
  const auto round_trip = convert_flux_weights(diffusers, config, flux_layout::diffusers, flux_layout::bfl);
  for (const auto& [name, tensor] : bfl) CHECK(torch::equal(round_trip.at(name), tensor));

  // bf16 weights load into the requested dtype (here fp32): the values are the bf16-rounded ones.
  std::map<std::string, torch::Tensor> half;
  for (const auto& [name, tensor] : diffusers) half[name] = tensor.to(torch::kBFloat16);
  flux_transformer from_bf16(config);
  load_flux_weights(from_bf16, half, flux_layout::diffusers);
  CHECK(from_bf16.img_in->weight.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(from_bf16.img_in->weight, bfl.at("img_in.weight").to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("loading names every missing, unexpected and mis-shaped key in one message") {
  const flux_config config = flux_config::tiny();
  flux_transformer model(config);
  auto diffusers = convert_flux_weights(flux_state(model), config, flux_layout::bfl, flux_layout::diffusers);
  diffusers.erase("transformer_blocks.1.attn.to_v.bias");
  diffusers.erase("proj_out.bias");
  diffusers["transformer_blocks.0.attn.bogus.weight"] = torch::zeros({2});
  diffusers["x_embedder.weight"] = torch::zeros({64, 15});
  CHECK(error_of([&] { load_flux_weights(model, diffusers); }) ==
        "FLUX checkpoint (diffusers layout) does not match the config: missing transformer_blocks.1.attn.to_v.bias, "
        "missing proj_out.bias, unexpected transformer_blocks.0.attn.bogus.weight, shape mismatch x_embedder.weight "
        "[64, 15] (expected [64, 16])");
  const std::map<std::string, torch::Tensor> unknown = {{"encoder.weight", torch::zeros({1})}};
  CHECK(error_of([&] { load_flux_weights(model, unknown); }) ==
        "cannot tell the FLUX layout of a checkpoint of 1 tensors (neither bfl nor diffusers names)");
  // A bfl checkpoint of the wrong config (dev names against tiny shapes) is rejected with a count.
  std::map<std::string, torch::Tensor> wrong;
  for (const auto& spec : flux_expected_tensors(flux_config::tiny(), flux_layout::bfl))
    wrong[spec.name] = torch::zeros({1});
  const std::string message = error_of([&] { load_flux_weights(model, wrong); });
  CHECK(message.starts_with("FLUX checkpoint (bfl layout) does not match the config: shape mismatch "));
  CHECK(message.ends_with(" more"));
}

TEST_CASE("gradient checkpointing gives the same loss and gradients") {
  const flux_config config = flux_config::tiny();
  flux_transformer model(config);
  randomize(model, 9);
  const case_inputs in = make_inputs(config, 2, 4, 4, 3, 2);
  const auto gradients = [&](bool checkpoint) {
    model.set_gradient_checkpointing(checkpoint);
    model.zero_grad();
    const torch::Tensor loss = model.forward_latents(in.x, in.txt, in.pooled, in.t, in.g).pow(2).sum();
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach()};
    for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = gradients(false);
  const auto checkpointed = gradients(true);
  REQUIRE(plain.size() == checkpointed.size());
  CHECK(torch::allclose(plain[0], checkpointed[0]));
  double worst = 0;
  for (std::size_t i = 1; i < plain.size(); ++i)  // relative to the gradient's size (fp32 rounding only)
    worst =
        std::max(worst, max_abs_diff(plain[i], checkpointed[i]) / std::max(1.0, plain[i].abs().max().item<double>()));
  CHECK(worst < 1e-5);
  CHECK(plain[1].abs().sum().item<double>() > 0);
}
