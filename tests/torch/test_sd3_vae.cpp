// SD3's VAE decoder (torch/sd3/autoencoder.hpp = FLUX's decoder with SD3's latent scale and shift): the config,
// the diffusers -> ldm name mapping, agreement with diffusers' AutoencoderKL on the fixture written by
// tests/reference/sd3_vae_reference.py (diffusers names), the same weights as SD3.5's single file names it
// (first_stage_model.decoder.*, bit-identical output), and the one-line errors for a file of neither layout.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/sd3/autoencoder.hpp"
#include "error_text.hpp"
#include "source_tree.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

const std::filesystem::path fixture = testing::source_root() / "tests/reference/fixtures/sd3_vae.safetensors";

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("branchgrpo_sd3_vae_" + name + ".safetensors");
}

/// The fixture's decoder weights, "diffusers." removed: decoder.up_blocks.*, decoder.mid_block.* ...
std::map<std::string, torch::Tensor> diffusers_weights(const std::map<std::string, torch::Tensor>& file) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : file)
    if (name.starts_with("diffusers.")) out.emplace(name.substr(10), tensor);
  return out;
}

torch::Tensor decode(flux_autoencoder& model, const torch::Tensor& latents) {
  torch::NoGradGuard no_grad;
  return model.decode(latents);
}

/// max |a - b| / max |b|.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor b64 = b.to(torch::kFloat64);
  return (a.to(torch::kFloat64) - b64).abs().max().item<double>() / b64.abs().max().item<double>();
}

}  // namespace

TEST_CASE("sd3_autoencoder_config: FLUX's decoder shape with SD3's scale and shift") {
  const flux_autoencoder_config sd3 = sd3_autoencoder_config();
  CHECK(sd3.scale_factor == 1.5305);
  CHECK(sd3.shift_factor == 0.0609);
  flux_autoencoder_config as_flux = sd3;
  as_flux.scale_factor = flux_autoencoder_config::dev().scale_factor;
  as_flux.shift_factor = flux_autoencoder_config::dev().shift_factor;
  CHECK(as_flux == flux_autoencoder_config::dev());  // z 16, ch 128, ch_mult {1, 2, 4, 4}, 2 blocks, 32 groups
  CHECK(sd3.upscale() == 8);
  const flux_autoencoder_config tiny = sd3_autoencoder_tiny_config();
  CHECK(tiny.ch_mult == std::vector<std::int64_t>{1, 2, 2});
  CHECK(tiny.upscale() == 4);
  CHECK(tiny.scale_factor == 1.5305);
  CHECK_NOTHROW(validate(tiny));
}

TEST_CASE("SD3 VAE diffusers names") {
  const flux_autoencoder_config dev = sd3_autoencoder_config();
  const auto spec = [&](const std::string& name, std::vector<std::int64_t> shape) {
    return sd3_vae_diffusers_spec(dev, {name, std::move(shape)});
  };
  CHECK(spec("decoder.up.3.block.2.conv1.weight", {512, 512, 3, 3}) ==
        flux_tensor_spec{"decoder.up_blocks.0.resnets.2.conv1.weight", {512, 512, 3, 3}});
  CHECK(spec("decoder.up.1.block.0.nin_shortcut.bias", {256}) ==
        flux_tensor_spec{"decoder.up_blocks.2.resnets.0.conv_shortcut.bias", {256}});
  CHECK(spec("decoder.up.1.upsample.conv.weight", {256, 256, 3, 3}).name ==
        "decoder.up_blocks.2.upsamplers.0.conv.weight");
  CHECK(spec("decoder.mid.attn_1.proj_out.weight", {512, 512, 1, 1}) ==
        flux_tensor_spec{"decoder.mid_block.attentions.0.to_out.0.weight", {512, 512}});
  CHECK(spec("decoder.mid.attn_1.q.bias", {512}).name == "decoder.mid_block.attentions.0.to_q.bias");
  CHECK(spec("decoder.mid.attn_1.norm.weight", {512}).name == "decoder.mid_block.attentions.0.group_norm.weight");
  CHECK(spec("decoder.mid.block_2.norm1.bias", {512}).name == "decoder.mid_block.resnets.1.norm1.bias");
  CHECK(spec("decoder.norm_out.bias", {128}).name == "decoder.conv_norm_out.bias");
  CHECK(spec("decoder.conv_in.weight", {512, 16, 3, 3}).name == "decoder.conv_in.weight");
  CHECK(sd3_vae_decoder_expected_tensors(dev, sd3_vae_layout::diffusers).size() == 138);

  // The mapped names are exactly the decoder's names in diffusers' AutoencoderKL (the fixture holds them all).
  std::set<std::string> mapped, in_fixture;
  for (const auto& s : sd3_vae_decoder_expected_tensors(sd3_autoencoder_tiny_config(), sd3_vae_layout::diffusers))
    mapped.insert(s.name);
  for (const auto& [name, tensor] : diffusers_weights(load_safetensors(fixture))) in_fixture.insert(name);
  CHECK(mapped == in_fixture);

  CHECK(sd3_vae_decoder_name("first_stage_model.decoder.conv_in.bias", true) == "decoder.conv_in.bias");
  CHECK_FALSE(sd3_vae_decoder_name("model.diffusion_model.x_embedder.proj.weight", true));
  CHECK_FALSE(sd3_vae_decoder_name("first_stage_model.encoder.conv_in.weight", true));
  CHECK(sd3_vae_decoder_name("decoder.conv_in.bias", false) == "decoder.conv_in.bias");
}

TEST_CASE("SD3 VAE decodes like diffusers' AutoencoderKL; ldm and single-file names give the same output") {
  const std::map<std::string, torch::Tensor> file = load_safetensors(fixture);
  const torch::Tensor latents = file.at("input.latents");
  const torch::Tensor expected = file.at("output.images");
  REQUIRE(expected.sizes() == torch::IntArrayRef{2, 3, 12, 20});

  flux_autoencoder model(sd3_autoencoder_tiny_config());
  model.to(torch::kFloat64);
  load_sd3_autoencoder_weights(model, diffusers_weights(file));
  const torch::Tensor images = decode(model, latents);
  const double error64 = relative_diff(images, expected);
  flux_autoencoder model32(sd3_autoencoder_tiny_config());
  load_sd3_autoencoder_weights(model32, diffusers_weights(file));
  const double error32 = relative_diff(decode(model32, latents), expected);
  WARN("SD3 VAE vs diffusers: relative error " << error64 << " (float64), " << error32 << " (float32)");
  CHECK(error64 <= 1e-4);
  CHECK(error32 <= 1e-4);

  // The same weights as SD3.5's single file holds them (ldm names under first_stage_model., next to other
  // models' tensors and the encoder, both skipped), through the file loader: bit-identical.
  std::map<std::string, torch::Tensor> single;
  for (const auto& [name, tensor] : flux_autoencoder_state(model))
    single.emplace("first_stage_model." + name, tensor.to(torch::kFloat32));
  single.emplace("first_stage_model.encoder.conv_in.weight", torch::zeros({8, 3, 3, 3}));
  single.emplace("model.diffusion_model.x_embedder.proj.weight", torch::zeros({4, 16, 2, 2}));
  const auto single_path = temp_file("single");
  save_safetensors(single_path, single);
  flux_autoencoder from_single(sd3_autoencoder_tiny_config());
  from_single.to(torch::kFloat64);
  load_sd3_autoencoder_weights(from_single, single_path);
  CHECK(torch::equal(decode(from_single, latents), images));
  std::filesystem::remove(single_path);
}

TEST_CASE("SD3 VAE weights of neither layout: one line naming a missing key") {
  flux_autoencoder model(sd3_autoencoder_tiny_config());
  const auto path = temp_file("neither");
  save_safetensors(path, {{"foo", torch::zeros({2})}});
  const std::string error = error_of([&] { load_sd3_autoencoder_weights(model, path); });
  CHECK(error.starts_with(path.string() + ": SD3 autoencoder weights (ldm names) do not match the config: missing "
                                          "decoder.conv_in.weight, missing decoder.conv_in.bias, "));
  CHECK(error.find('\n') == std::string::npos);
  std::filesystem::remove(path);

  // diffusers names with an attention weight kept as a 1x1 conv: named with both shapes.
  std::map<std::string, torch::Tensor> weights = diffusers_weights(load_safetensors(fixture));
  weights["decoder.mid_block.attentions.0.to_q.weight"] = torch::zeros({16, 16, 1, 1});
  weights.erase("decoder.conv_norm_out.bias");
  CHECK(error_of([&] { load_sd3_autoencoder_weights(model, weights); }) ==
        "SD3 autoencoder weights (diffusers names) do not match the config: missing decoder.conv_norm_out.bias, "
        "shape mismatch decoder.mid_block.attentions.0.to_q.weight [16, 16, 1, 1] (expected [16, 16])");
}
