// The native Wan2.1 VAE decoder: config, Wan2.1_VAE.pth names and shapes, decode shapes, chunked = whole-clip
// decoding, causality, agreement with the independent numpy reference tests/reference/wan_vae_reference.py, and
// the safetensors round trip with key reports.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/wan/autoencoder.hpp"
#include "error_text.hpp"
#include "numpy_reference.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

/// Random weights: convs N(0, 0.2^2), RMS-norm gammas 1 + N(0, 0.2^2).
void randomize(wan_vae_decoder& model, std::uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const bool gamma = item.key().ends_with(".gamma");
    item.value().copy_(torch::randn(item.value().sizes()) * 0.2 + (gamma ? 1.0 : 0.0));
  }
}

torch::Tensor decode(wan_vae_decoder& model, const torch::Tensor& latents, std::int64_t chunk = 1) {
  torch::NoGradGuard no_grad;
  return model.decode(latents, false, chunk);
}

/// Runs wan_vae_reference.py on the model's weights and `latents`; returns its output as a float64 tensor.
torch::Tensor numpy_reference(wan_vae_decoder& model, const torch::Tensor& latents, std::vector<std::int64_t> shape) {
  const wan_vae_config& c = model.config();
  std::ostringstream config;
  config.precision(17);
  config << "z_dim " << c.z_dim << "\ndim " << c.dim << "\ndim_mult";
  for (auto m : c.dim_mult) config << " " << m;
  config << "\nnum_res_blocks " << c.num_res_blocks << "\ntemporal_upsample";
  for (bool up : c.temporal_upsample()) config << " " << (up ? 1 : 0);
  config << "\nlatents_mean";
  for (double v : c.latents_mean) config << " " << v;
  config << "\nlatents_std";
  for (double v : c.latents_std) config << " " << v;
  config << "\n";
  std::map<std::string, torch::Tensor> tensors = wan_vae_decoder_state(model);
  tensors["input.latents"] = latents;
  return testing::run_numpy_reference("wan_vae_reference.py", "wan_vae", config.str(), tensors, shape);
}

/// max |a - b| / max |b|.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor b64 = b.to(torch::kFloat64);
  return (a.to(torch::kFloat64) - b64).abs().max().item<double>() / b64.abs().max().item<double>();
}

std::vector<std::int64_t> find_shape(const std::vector<flux_tensor_spec>& specs, const std::string& name) {
  for (const auto& spec : specs)
    if (spec.name == name) return spec.shape;
  return {};
}

}  // namespace

TEST_CASE("wan_vae_config presets and validation") {
  const auto wan21 = wan_vae_config::wan21();
  CHECK(wan21.z_dim == 16);
  CHECK(wan21.dim == 96);
  CHECK(wan21.dim_mult == std::vector<std::int64_t>{1, 2, 4, 4});
  CHECK(wan21.num_res_blocks == 2);
  CHECK(wan21.temporal_downsample == std::vector<bool>{false, true, true});
  CHECK(wan21.temporal_upsample() == std::vector<bool>{true, true, false});
  CHECK(wan21.latents_mean.size() == 16);
  CHECK(wan21.latents_mean.front() == -0.7571);
  CHECK(wan21.latents_std.back() == 1.9160);
  CHECK(wan21.spatial_upscale() == 8);
  CHECK(wan21.video_frames(1) == 1);
  CHECK(wan21.video_frames(21) == 81);
  CHECK(wan_vae_config::tiny().spatial_upscale() == 8);
  CHECK(wan_vae_config::tiny().video_frames(3) == 9);
  CHECK_NOTHROW(validate(wan21));
  CHECK_NOTHROW(validate(wan_vae_config::tiny()));
  auto bad = wan_vae_config::tiny();
  bad.dim = 7;
  CHECK(error_of([&] { validate(bad); }) == "wan_vae_config: level 0's width 7 must be even (upsampling halves it)");
  bad = wan_vae_config::tiny();
  bad.temporal_downsample = {true};
  CHECK(error_of([&] { validate(bad); }) == "wan_vae_config: temporal_downsample needs 3 flags (levels - 1), got 1");
  CHECK(error_of([] { validate(wan_vae_config{.z_dim = 4}); }) ==
        "wan_vae_config: latents_mean and latents_std need z_dim 4 values, got 16 and 16");
  bad = wan_vae_config::tiny();
  bad.latents_std[2] = 0;
  CHECK(error_of([&] { wan_vae_decoder model(bad); }) ==
        "wan_vae_config: latents_std[2] 0 must be finite and positive");
}

TEST_CASE("Wan2.1_VAE.pth decoder names and shapes") {
  const auto wan21 = wan_vae_decoder_expected_tensors(wan_vae_config::wan21());
  // Listed from the official WanVAE_(dim=96, z_dim=16, ...).state_dict(): 108 conv2.* / decoder.* tensors,
  // 73,295,603 weights.
  CHECK(wan21.size() == 108);
  std::int64_t weights = 0;
  for (const auto& spec : wan21) {
    std::int64_t n = 1;
    for (auto d : spec.shape) n *= d;
    weights += n;
  }
  CHECK(weights == 73295603);
  CHECK(wan21.front() == flux_tensor_spec{"conv2.weight", {16, 16, 1, 1, 1}});
  CHECK(wan21[2] == flux_tensor_spec{"decoder.conv1.weight", {384, 16, 3, 3, 3}});
  CHECK(wan21.back() == flux_tensor_spec{"decoder.head.2.bias", {3}});
  using shape = std::vector<std::int64_t>;
  CHECK(find_shape(wan21, "decoder.middle.0.residual.0.gamma") == shape{384, 1, 1, 1});
  CHECK(find_shape(wan21, "decoder.middle.1.norm.gamma") == shape{384, 1, 1});
  CHECK(find_shape(wan21, "decoder.middle.1.to_qkv.weight") == shape{1152, 384, 1, 1});
  CHECK(find_shape(wan21, "decoder.middle.1.proj.weight") == shape{384, 384, 1, 1});
  CHECK(find_shape(wan21, "decoder.upsamples.3.time_conv.weight") == shape{768, 384, 3, 1, 1});
  CHECK(find_shape(wan21, "decoder.upsamples.3.resample.1.weight") == shape{192, 384, 3, 3});
  CHECK(find_shape(wan21, "decoder.upsamples.4.shortcut.weight") == shape{384, 192, 1, 1, 1});
  CHECK(find_shape(wan21, "decoder.upsamples.4.residual.2.weight") == shape{384, 192, 3, 3, 3});
  CHECK(find_shape(wan21, "decoder.upsamples.7.time_conv.weight") == shape{768, 384, 3, 1, 1});
  CHECK(find_shape(wan21, "decoder.upsamples.11.resample.1.weight") == shape{96, 192, 3, 3});
  CHECK(find_shape(wan21, "decoder.upsamples.11.time_conv.weight").empty());  // the third resample is 2-D
  CHECK(find_shape(wan21, "decoder.upsamples.12.shortcut.weight").empty());   // 192 / 2 -> 96: no shortcut
  CHECK(find_shape(wan21, "decoder.upsamples.14.residual.6.weight") == shape{96, 96, 3, 3, 3});
  CHECK(find_shape(wan21, "decoder.upsamples.15.residual.0.gamma").empty());  // 4 x 3 blocks + 3 resamples
  CHECK(find_shape(wan21, "decoder.head.2.weight") == shape{3, 96, 3, 3, 3});

  // The module's parameters are exactly the expected list (names and shapes), for the tiny config.
  wan_vae_decoder model(wan_vae_config::tiny());
  std::map<std::string, std::vector<std::int64_t>> expected, actual;
  for (const auto& spec : wan_vae_decoder_expected_tensors(model.config())) expected[spec.name] = spec.shape;
  for (const auto& item : model.named_parameters()) actual[item.key()] = item.value().sizes().vec();
  CHECK(actual == expected);
  // tiny: conv2 2 + conv1 2 + middle 17 + 8 blocks x 6 + 2 shortcuts x 2 + 3 resamples x 2 + 2 time convs x 2
  //   + head 3 = 87.
  CHECK(expected.size() == 86);

  // The documented report example: the encoder's names are skipped, other extras are unexpected.
  std::map<std::string, std::vector<std::int64_t>> shapes = expected;
  shapes.erase("conv2.bias");
  shapes["encoder.conv1.weight"] = {8, 3, 3, 3, 3};
  shapes["conv1.weight"] = {8, 8, 1, 1, 1};
  shapes["extra"] = {1};
  const flux_key_report report = check_wan_vae_decoder_tensors(model.config(), shapes);
  CHECK(report.missing == std::vector<std::string>{"conv2.bias"});
  CHECK(report.unexpected == std::vector<std::string>{"extra"});
  CHECK(report.mismatched.empty());
  CHECK(wan_vae_encoder_name("encoder.conv1.weight"));
  CHECK(wan_vae_encoder_name("conv1.bias"));
  CHECK(wan_vae_encoder_name("quant_conv.bias"));
  CHECK_FALSE(wan_vae_encoder_name("decoder.conv1.weight"));
  CHECK_FALSE(wan_vae_encoder_name("conv2.bias"));
  CHECK_FALSE(wan_vae_encoder_name("post_quant_conv.bias"));
}

TEST_CASE("diffusers AutoencoderKLWan names") {
  // The renames of diffusers' scripts/convert_wan_to_diffusers.py (convert_vae) for Wan2.1_VAE.pth.
  const wan_vae_config wan21 = wan_vae_config::wan21();
  const std::map<std::string, std::string> renames = {
      {"conv2.weight", "post_quant_conv.weight"},
      {"decoder.conv1.bias", "decoder.conv_in.bias"},
      {"decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.norm1.gamma"},
      {"decoder.middle.2.residual.6.weight", "decoder.mid_block.resnets.1.conv2.weight"},
      {"decoder.middle.1.to_qkv.bias", "decoder.mid_block.attentions.0.to_qkv.bias"},
      {"decoder.upsamples.0.residual.2.weight", "decoder.up_blocks.0.resnets.0.conv1.weight"},
      {"decoder.upsamples.3.time_conv.weight", "decoder.up_blocks.0.upsamplers.0.time_conv.weight"},
      {"decoder.upsamples.4.shortcut.bias", "decoder.up_blocks.1.resnets.0.conv_shortcut.bias"},
      {"decoder.upsamples.6.residual.3.gamma", "decoder.up_blocks.1.resnets.2.norm2.gamma"},
      {"decoder.upsamples.11.resample.1.weight", "decoder.up_blocks.2.upsamplers.0.resample.1.weight"},
      {"decoder.upsamples.14.residual.6.bias", "decoder.up_blocks.3.resnets.2.conv2.bias"},
      {"decoder.head.0.gamma", "decoder.norm_out.gamma"},
      {"decoder.head.2.weight", "decoder.conv_out.weight"}};
  for (const auto& [official, diffusers] : renames) CHECK(wan_vae_diffusers_name(wan21, official) == diffusers);
  const auto official = wan_vae_decoder_expected_tensors(wan21);
  const auto diffusers = wan_vae_decoder_expected_tensors(wan21, wan_vae_layout::diffusers);
  REQUIRE(diffusers.size() == official.size());
  std::map<std::string, std::vector<std::int64_t>> names;
  for (std::size_t i = 0; i < official.size(); ++i) {
    CHECK(diffusers[i].shape == official[i].shape);
    names[diffusers[i].name] = diffusers[i].shape;
  }
  CHECK(names.size() == official.size());  // the renaming is one-to-one
  CHECK(diffusers.front() == flux_tensor_spec{"post_quant_conv.weight", {16, 16, 1, 1, 1}});
  CHECK(detect_wan_vae_layout(names) == wan_vae_layout::diffusers);
  CHECK(check_wan_vae_decoder_tensors(wan21, names, wan_vae_layout::diffusers).ok());
  std::map<std::string, std::vector<std::int64_t>> official_names;
  for (const auto& spec : official) official_names[spec.name] = spec.shape;
  CHECK(detect_wan_vae_layout(official_names) == wan_vae_layout::official);
}

TEST_CASE("wan_vae_decoder decode: shapes, clamp, chunking, errors") {
  wan_vae_decoder model(wan_vae_config::tiny());
  randomize(model, 1);
  torch::manual_seed(2);
  const torch::Tensor latents = torch::randn({2, 4, 3, 2, 3});
  const torch::Tensor video = decode(model, latents);
  CHECK(video.sizes() == torch::IntArrayRef({2, 3, 9, 16, 24}));
  CHECK(decode(model, latents.narrow(2, 0, 1)).sizes() == torch::IntArrayRef({2, 3, 1, 16, 24}));
  // Any chunking decodes the same video: whole clip (0), 2 then 1 latent frames, one frame at a time (1).
  CHECK(torch::allclose(decode(model, latents, 0), video, 1e-5, 1e-5));
  CHECK(torch::allclose(decode(model, latents, 2), video, 1e-5, 1e-5));
  CHECK(torch::allclose(decode(model, latents, 5), video, 1e-5, 1e-5));
  torch::NoGradGuard no_grad;
  const torch::Tensor clamped = model.decode(latents, /*clamp=*/true);
  CHECK(clamped.min().item<double>() >= -1.0);
  CHECK(clamped.max().item<double>() <= 1.0);
  CHECK(torch::equal(clamped, video.clamp(-1, 1)));
  CHECK(error_of([&] {
          model.decode(torch::zeros({1, 3, 2, 4, 4}));
        }) == "wan_vae_decoder::decode expects latents [B, 4, T >= 1, h, w], got [1, 3, 2, 4, 4]");
  CHECK(error_of([&] {
          model.decode(torch::zeros({1, 4, 4, 4}));
        }) == "wan_vae_decoder::decode expects latents [B, 4, T >= 1, h, w], got [1, 4, 4, 4]");
  CHECK(error_of([&] { model.decode(latents, false, -1); }) ==
        "wan_vae_decoder::decode: latent_frames_per_chunk -1 must be non-negative");
}

TEST_CASE("wan_vae_decoder is causal: a later latent frame never changes earlier video frames") {
  wan_vae_decoder model(wan_vae_config::tiny());
  randomize(model, 3);
  torch::manual_seed(4);
  const torch::Tensor latents = torch::randn({1, 4, 3, 2, 2});
  const torch::Tensor video = decode(model, latents);
  for (std::int64_t changed = 0; changed < 3; ++changed) {
    torch::Tensor other = latents.clone();
    other.narrow(2, changed, 1).add_(1.0);
    // Latent frame t first shows in video frame 1 + 4 (t - 1) (frame 0 for t = 0).
    const std::int64_t first = changed == 0 ? 0 : 1 + 4 * (changed - 1);
    for (std::int64_t chunk : {1, 0}) {
      const torch::Tensor changed_video = decode(model, other, chunk);
      if (first > 0) CHECK(torch::allclose(changed_video.narrow(2, 0, first), video.narrow(2, 0, first), 1e-5, 1e-5));
      CHECK((changed_video.narrow(2, first, 1) - video.narrow(2, first, 1)).abs().max().item<double>() > 1e-3);
    }
  }
}

TEST_CASE("wan_vae_decoder agrees with the numpy reference") {
  SECTION("tiny config: 4 levels, shortcuts, both resample kinds, non-square, batch 2") {
    wan_vae_decoder model(wan_vae_config::tiny());
    randomize(model, 5);
    torch::manual_seed(6);
    const torch::Tensor latents = torch::randn({2, 4, 3, 2, 3});
    const torch::Tensor ours = decode(model, latents);
    const torch::Tensor reference = numpy_reference(model, latents, {2, 3, 9, 16, 24});
    CHECK(ours.abs().max().item<double>() > 0.1);  // not a degenerate all-zero comparison
    const double difference = relative_diff(ours, reference);
    INFO("relative difference " << difference);
    CHECK(difference < 1e-4);
    CHECK(relative_diff(decode(model, latents, 0), reference) < 1e-4);
  }
  SECTION("3 levels, time upsampled at the second resample only, 16 channels, the Wan2.1 constants") {
    const wan_vae_config config{
        .dim = 4, .dim_mult = {2, 1, 2}, .num_res_blocks = 0, .temporal_downsample = {true, false}};
    wan_vae_decoder model(config);
    randomize(model, 7);
    torch::manual_seed(8);
    const torch::Tensor latents = torch::randn({1, 16, 2, 3, 2});
    const torch::Tensor ours = decode(model, latents);
    CHECK(ours.sizes() == torch::IntArrayRef({1, 3, 3, 12, 8}));
    CHECK(relative_diff(ours, numpy_reference(model, latents, {1, 3, 3, 12, 8})) < 1e-4);
  }
}

TEST_CASE("wan_vae_decoder weights: safetensors round trip and key reports") {
  const auto dir = std::filesystem::temp_directory_path() / "branchgrpo_wan_vae_weights";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  wan_vae_decoder model(wan_vae_config::tiny());
  randomize(model, 9);
  torch::manual_seed(10);
  const torch::Tensor latents = torch::randn({1, 4, 2, 2, 2});
  const torch::Tensor before = decode(model, latents);

  // A full Wan2.1_VAE state dict: the decoder's tensors plus encoder ones (ignored on load).
  std::map<std::string, torch::Tensor> file = wan_vae_decoder_state(model);
  file["encoder.conv1.weight"] = torch::zeros({8, 3, 3, 3, 3});
  file["conv1.weight"] = torch::zeros({8, 8, 1, 1, 1});
  file["conv1.bias"] = torch::zeros({8});
  save_safetensors(dir / "Wan2.1_VAE.safetensors", file);
  wan_vae_decoder loaded(wan_vae_config::tiny());
  load_wan_vae_decoder_weights(loaded, dir / "Wan2.1_VAE.safetensors");
  CHECK(torch::equal(decode(loaded, latents), before));

  // A float64 map converts into the float32 model.
  std::map<std::string, torch::Tensor> doubles;
  for (const auto& [name, tensor] : wan_vae_decoder_state(model)) doubles[name] = tensor.to(torch::kFloat64);
  wan_vae_decoder from_doubles(wan_vae_config::tiny());
  load_wan_vae_decoder_weights(from_doubles, doubles);
  CHECK(torch::equal(decode(from_doubles, latents), before));

  // diffusers names (with diffusers' encoder-side names, ignored), from a file.
  std::map<std::string, torch::Tensor> renamed;
  for (const auto& [name, tensor] : wan_vae_decoder_state(model))
    renamed[wan_vae_diffusers_name(model.config(), name)] = tensor;
  renamed["quant_conv.weight"] = torch::zeros({8, 8, 1, 1, 1});
  renamed["encoder.conv_in.weight"] = torch::zeros({8, 3, 3, 3, 3});
  save_safetensors(dir / "diffusion_pytorch_model.safetensors", renamed);
  wan_vae_decoder from_diffusers(wan_vae_config::tiny());
  load_wan_vae_decoder_weights(from_diffusers, dir / "diffusion_pytorch_model.safetensors");
  CHECK(torch::equal(decode(from_diffusers, latents), before));
  renamed.erase("decoder.conv_out.bias");
  CHECK(error_of([&] { load_wan_vae_decoder_weights(from_diffusers, renamed); }) ==
        "Wan VAE weights do not match the config: missing decoder.conv_out.bias");

  // Missing, unexpected and mismatched names in one line; the file's path first.
  std::map<std::string, torch::Tensor> broken = wan_vae_decoder_state(model);
  broken.erase("conv2.bias");
  broken["extra"] = torch::zeros({1});
  broken["decoder.head.2.weight"] = torch::zeros({3, 8, 1, 1, 1});
  wan_vae_decoder target(wan_vae_config::tiny());
  const std::string problems =
      "Wan VAE weights do not match the config: missing conv2.bias, unexpected extra, shape mismatch "
      "decoder.head.2.weight [3, 8, 1, 1, 1] (expected [3, 8, 3, 3, 3])";
  CHECK(error_of([&] { load_wan_vae_decoder_weights(target, broken); }) == problems);
  save_safetensors(dir / "broken.safetensors", broken);
  CHECK(error_of([&] { load_wan_vae_decoder_weights(target, dir / "broken.safetensors"); }) ==
        (dir / "broken.safetensors").string() + ": " + problems);
  std::filesystem::remove_all(dir);
}
