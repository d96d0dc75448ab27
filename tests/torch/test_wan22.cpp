// Wan2.2's two-expert transformer against diffusers' WanPipeline (tests/reference/wan22_switch_reference.py wrote
// tests/reference/fixtures/wan22_switch.safetensors): the expert picked at each recorded step and its velocity, both
// checkpoint namings, the release-directory loader, the one-line errors, and LoRA on both experts.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/model_specs/wan22/config.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"
#include "branchgrpo/torch/wan22/denoiser.hpp"
#include "branchgrpo/torch/wan22/transformer.hpp"
#include "error_text.hpp"
#include "source_tree.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

/// The fixture: the experts (diffusers names under transformer. / transformer_2.) and the recorded steps.
struct switch_fixture {
  std::map<std::string, torch::Tensor> experts;
  torch::Tensor text, timesteps, chosen, inputs, outputs;
  wan22_config config;
};

const switch_fixture& fixture() {
  static const switch_fixture out = [] {
    std::map<std::string, torch::Tensor> all =
        load_safetensors(testing::source_root() / "tests/reference/fixtures/wan22_switch.safetensors");
    switch_fixture f;
    for (const auto& [name, tensor] : all)
      if (name.starts_with("transformer.") || name.starts_with("transformer_2.")) f.experts.emplace(name, tensor);
    f.text = all.at("prompt_embeds");
    f.timesteps = all.at("timesteps");
    f.chosen = all.at("experts");
    f.inputs = all.at("inputs");
    f.outputs = all.at("outputs");
    // The generator's experts: wan22-tiny's with one block, and its boundary_ratio.
    f.config = wan22_config::tiny();
    f.config.expert.layers = 1;
    f.config.boundary = all.at("boundary").item<double>();
    return f;
  }();
  return out;
}

/// The official naming of the fixture's experts: each expert renamed by Wan's diffusers -> official mapping.
std::map<std::string, torch::Tensor> official_names(const std::map<std::string, torch::Tensor>& diffusers,
                                                    const wan_config& expert) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [from, to] :
       {std::pair{"transformer.", "high_noise_model."}, std::pair{"transformer_2.", "low_noise_model."}}) {
    std::map<std::string, torch::Tensor> inner;
    for (const auto& [name, tensor] : diffusers)
      if (name.starts_with(from)) inner.emplace(name.substr(std::string(from).size()), tensor);
    for (auto& [name, tensor] : convert_wan_weights(inner, expert, wan_layout::diffusers, wan_layout::official))
      out.emplace(std::string(to) + name, tensor);
  }
  return out;
}

torch::Tensor step_velocity(wan22_transformer& model, std::int64_t step) {
  torch::NoGradGuard no_grad;
  const switch_fixture& f = fixture();
  return model.forward(f.inputs[step], f.timesteps.narrow(0, step, 1), f.text);
}

double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor w = want.to(torch::kFloat64);
  return (got.to(torch::kFloat64) - w).abs().max().item<double>() / w.abs().max().item<double>();
}

std::shared_ptr<wan22_transformer> fixture_model() {
  auto model = std::make_shared<wan22_transformer>(fixture().config);
  load_wan22_weights(*model, fixture().experts);
  return model;
}

}  // namespace

TEST_CASE("wan22_config: named shapes, the boundary and its one-line errors") {
  const wan22_config a14b = named_wan22_config("wan2.2-t2v-a14b");
  CHECK(a14b.expert == wan_config::t2v_14b());  // dim 5120, ffn 13824, 40 heads, 40 layers, 16 -> 16, text 512
  CHECK(a14b.expert.in_dim == 16);
  CHECK(a14b.expert.out_dim == 16);
  CHECK(a14b.expert.text_len == 512);
  CHECK(a14b.boundary == 0.875);
  CHECK(a14b.experts == 2);
  const wan22_config tiny = named_wan22_config("wan22-tiny");
  CHECK(tiny.expert.out_dim == 3);  // the moving-shapes data's pixel channels and 32-wide text features
  CHECK(tiny.expert.in_dim == 3);
  CHECK(tiny.expert.text_dim == 32);
  CHECK(tiny.boundary_timestep() == 875);
  const wan22_transformer model(tiny);
  CHECK(model.expert_for(1000) == wan22_expert::high_noise);
  CHECK(model.expert_for(875) == wan22_expert::high_noise);  // t >= 1000 boundary, as diffusers
  CHECK(model.expert_for(874.99) == wan22_expert::low_noise);
  CHECK(model.expert_for(0) == wan22_expert::low_noise);
  CHECK(wan22_spec.find("wan2.2-t2v-a14b")->guidance_scale == 4);
  CHECK_FALSE(wan22_spec.find("wan22-tiny")->released);
  CHECK(error_of([] { named_wan22_config("wan-tiny"); }) ==
        "'wan-tiny' is not a Wan2.2 config (wan2.2-t2v-a14b or wan22-tiny)");
  CHECK(error_of([] { validate(wan22_config{.boundary = 0}); }) == "wan22_config: boundary 0 is outside (0, 1)");
  CHECK(error_of([] { validate(wan22_config{.boundary = 1}); }) == "wan22_config: boundary 1 is outside (0, 1)");
  CHECK(error_of([] { validate(wan22_config{.boundary = 1.2}); }) == "wan22_config: boundary 1.2 is outside (0, 1)");
  CHECK(error_of([] { validate(wan22_config{.boundary = std::numeric_limits<double>::quiet_NaN()}); }) ==
        "wan22_config: boundary nan is outside (0, 1)");
  CHECK(error_of([] { wan22_transformer model(wan22_config{.expert = wan_config::tiny(), .boundary = 1.2}); }) ==
        "wan22_config: boundary 1.2 is outside (0, 1)");
}

TEST_CASE("wan22 LoRA names: the expert prefix stripped, Wan's keys inside") {
  CHECK(wan22_spec.lora_layer("low_noise_model.blocks.1.cross_attn.k"));
  CHECK_FALSE(wan22_spec.lora_layer("blocks.1.cross_attn.k"));
  const auto parts = wan22_spec.lora_parts("high_noise_model.blocks.0.ffn.2", 40, 56);
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].name == "blocks.0.ffn.net.2");
  CHECK(parts[0].rows == 40);
  CHECK(error_of([] { wan22_spec.lora_parts("blocks.0.ffn.2", 40, 56); }) ==
        "LoRA layer 'blocks.0.ffn.2' is not a Wan2.2 layer (names start with high_noise_model. or low_noise_model.)");
}

TEST_CASE("wan22_transformer picks diffusers' expert and returns its velocity at every recorded step") {
  const switch_fixture& f = fixture();
  const std::shared_ptr<wan22_transformer> model = fixture_model();
  // Named as the official release, renamed from the same tensors: bit-identical outputs.
  wan22_transformer official(f.config);
  load_wan22_weights(official, official_names(f.experts, f.config.expert));
  REQUIRE(f.timesteps.size(0) >= 4);
  std::set<int> used;
  for (std::int64_t s = 0; s < f.timesteps.size(0); ++s) {
    const double t = f.timesteps[s].item<double>();
    const int want = static_cast<int>(f.chosen[s].item<float>());
    CAPTURE(s, t, want);
    CHECK(static_cast<int>(model->expert_for(t)) == want);
    used.insert(want);
    const torch::Tensor v = step_velocity(*model, s);
    CHECK(relative_error(v, f.outputs[s]) <= 1e-4);
    CHECK(torch::equal(step_velocity(official, s), v));
  }
  CHECK(used == std::set<int>{0, 1});  // both experts ran
}

TEST_CASE("wan22 weights: one-line errors for a missing expert, a mixed batch, a missing folder") {
  const switch_fixture& f = fixture();
  wan22_transformer model(f.config);
  std::map<std::string, torch::Tensor> high_only;
  for (const auto& [name, tensor] : f.experts)
    if (name.starts_with("transformer.")) high_only.emplace(name, tensor);
  CHECK(error_of([&] { load_wan22_weights(model, high_only); }) ==
        "Wan2.2 checkpoint has no low-noise expert (no low_noise_model.* or transformer_2.* tensors)");
  std::map<std::string, torch::Tensor> stray = f.experts;
  stray.emplace("vae.decoder.weight", torch::zeros({1}));
  CHECK(error_of([&] { load_wan22_weights(model, stray); }) ==
        "Wan2.2 checkpoint: tensor 'vae.decoder.weight' is in neither expert (transformer.* or transformer_2.*)");

  const torch::Tensor x = f.inputs[0].expand({2, -1, -1, -1, -1});
  const torch::Tensor text = f.text.expand({2, -1, -1});
  CHECK(error_of([&] {
          model.forward(x, torch::tensor({900.0F, 300.0F}), text);
        }) ==
        "Wan2.2 batch mixes timesteps 900 and 300 across the expert boundary 600 (boundary 0.6): one call runs one "
        "expert");

  // A release directory: the official folders, and one folder missing.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "branchgrpo_test_wan22";
  std::filesystem::remove_all(dir);
  const std::map<std::string, torch::Tensor> official = official_names(f.experts, f.config.expert);
  for (const std::string_view expert : wan22_official_prefixes) {
    std::map<std::string, torch::Tensor> inner;
    for (const auto& [name, tensor] : official)
      if (name.starts_with(std::string(expert) + ".")) inner.emplace(name.substr(expert.size() + 1), tensor);
    std::filesystem::create_directories(dir / expert);
    save_safetensors(dir / expert / "diffusion_pytorch_model.safetensors", inner);
  }
  const std::map<std::string, torch::Tensor> loaded = load_wan22_checkpoint(dir);
  CHECK(loaded.size() == official.size());
  CHECK(torch::equal(loaded.at("low_noise_model.head.modulation"), official.at("low_noise_model.head.modulation")));
  std::filesystem::remove_all(dir / "low_noise_model");
  CHECK(error_of([&] { load_wan22_checkpoint(dir); }) ==
        dir.string() + ": no low_noise_model/ folder (the official Wan2.2 release has high_noise_model/ and " +
            "low_noise_model/)");
  std::filesystem::remove_all(dir);
}

TEST_CASE("wan22 LoRA: both experts adapted, gradient only where the expert ran") {
  const switch_fixture& f = fixture();
  const std::shared_ptr<wan22_transformer> model = fixture_model();
  add_lora(*model, lora_options{.rank = 2, .seed = 7});
  wan22_denoiser denoiser(model, f.text);
  std::vector<torch::Tensor> trainable = denoiser.trainable_parameters();
  std::vector<torch::Tensor> high, low;
  for (const auto& item : model->named_parameters()) {
    if (item.key().find("lora_") == std::string::npos) continue;
    CHECK(item.value().requires_grad());
    (item.key().starts_with("high_noise_model.") ? high : low).push_back(item.value());
  }
  CHECK(!high.empty());
  CHECK(high.size() == low.size());
  CHECK(trainable.size() == high.size() + low.size());

  const auto grads_after = [&](double sigma) {
    for (torch::Tensor& p : trainable) p.mutable_grad() = torch::Tensor();
    const std::vector<std::int64_t> prompts = {0};
    denoiser.velocity(f.inputs[0], {.sigma = sigma, .trees = {}, .prompts = prompts}).square().sum().backward();
    const auto touched = [](const std::vector<torch::Tensor>& ps) {
      std::size_t n = 0;
      for (const torch::Tensor& p : ps) n += p.grad().defined() && p.grad().abs().sum().item<double>() > 0;
      return n;
    };
    return std::pair{touched(high), touched(low)};
  };
  const auto [high_at_high, low_at_high] = grads_after(0.9);  // timestep 900 >= 600: the high-noise expert
  CHECK(high_at_high > 0);
  CHECK(low_at_high == 0);
  const auto [high_at_low, low_at_low] = grads_after(0.3);
  CHECK(high_at_low == 0);
  CHECK(low_at_low > 0);
}
