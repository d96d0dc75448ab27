// The native SD3.5 (MMDiT-X) transformer: config text, both weight layouts and their mapping, LoRA keys, agreement
// with diffusers' own SD3Transformer2DModel through the committed fixture (tests/reference/sd3_transformer_reference.py
// writes tests/reference/fixtures/sd3_transformer.safetensors), checkpoint loading, one-line errors, LoRA gradients
// and gradient checkpointing.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "branchgrpo/model_specs/sd3/config.hpp"
#include "branchgrpo/model_specs/sd3/layout.hpp"
#include "branchgrpo/model_specs/sd3/lora_keys.hpp"
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/safetensors/mapped_file.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/sd3/denoiser.hpp"
#include "branchgrpo/torch/sd3/transformer.hpp"
#include "error_text.hpp"
#include "source_tree.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

/// The fixture's tensors: "stability.*", "diffusers.*", "input.*", "output.velocity".
struct fixture {
  sd3_config config;
  std::map<std::string, torch::Tensor> stability, diffusers;
  torch::Tensor x, timestep, context, pooled, velocity;
};

const fixture& load_fixture() {
  static const fixture f = [] {
    const auto path = testing::source_root() / "tests/reference/fixtures/sd3_transformer.safetensors";
    const safetensors_checkpoint checkpoint(path);
    fixture out;
    out.config = parse_sd3_config(checkpoint.metadata().at("branchgrpo.sd3_config"), path.string());
    for (auto& [name, tensor] : load_safetensors(checkpoint)) {
      if (name.starts_with("stability."))
        out.stability[name.substr(10)] = tensor;
      else if (name.starts_with("diffusers."))
        out.diffusers[name.substr(10)] = tensor;
    }
    const auto all = load_safetensors(checkpoint);
    out.x = all.at("input.x");
    out.timestep = all.at("input.timestep");
    out.context = all.at("input.context");
    out.pooled = all.at("input.pooled");
    out.velocity = all.at("output.velocity");
    return out;
  }();
  return f;
}

torch::Tensor run(sd3_transformer& model, const fixture& f) {
  torch::NoGradGuard no_grad;
  return model.forward(f.x, f.timestep, f.context, f.pooled);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

std::vector<std::int64_t> shape_of(const std::vector<sd3_tensor_spec>& specs, const std::string& name) {
  for (const auto& spec : specs)
    if (spec.name == name) return spec.shape;
  return {};
}

std::vector<std::string> names_of(const std::vector<sd3_tensor_spec>& specs) {
  std::vector<std::string> out;
  for (const auto& spec : specs) out.push_back(spec.name);
  return out;
}

}  // namespace

TEST_CASE("sd3_config presets, validation and the metadata text") {
  const sd3_config medium = sd3_config::medium(), large = sd3_config::large(), tiny = sd3_config::tiny();
  CHECK(medium.head_dim() == 64);
  CHECK(medium.patch_features() == 64);
  CHECK(medium.dual_attention(12));
  CHECK_FALSE(medium.dual_attention(13));
  CHECK(large.hidden == 64 * large.heads);
  CHECK(large.pos_embed_max_size == 192);
  CHECK_FALSE(large.dual_attention(0));
  CHECK(tiny.dual_attention(0));
  CHECK_FALSE(tiny.dual_attention(1));
  for (const sd3_config& c : {medium, large, tiny}) {
    CHECK_NOTHROW(validate(c));
    CHECK(parse_sd3_config(format_sd3_config(c), "m") == c);
  }
  CHECK(format_sd3_config(tiny) ==
        "in_channels=4;out_channels=4;patch=2;hidden=20;heads=2;depth=2;pos_embed_max_size=8;sample_size=16;"
        "context_in=16;pooled_in=12;qk_norm=1;dual_attention_layers=1");
  CHECK(error_of([] { validate(sd3_config{.heads = 5}); }) == "sd3_config: hidden 1536 is not divisible by heads 5");
  CHECK(error_of([] { validate(sd3_config{.depth = 100000000}); }) ==
        "sd3_config: depth 100000000 exceeds the limit 1024");
  CHECK(error_of([] { validate(sd3_config{.dual_attention_layers = 25}); }) ==
        "sd3_config: dual_attention_layers 25 is not in [0, depth 24]");
  CHECK(error_of([] { validate(sd3_config{.pos_embed_max_size = 32}); }) ==
        "sd3_config: sample_size 128 is 64 patches, above pos_embed_max_size 32");
  std::string text = format_sd3_config(tiny);
  CHECK(error_of([&] { parse_sd3_config(text + ";bogus=1", "m"); }) == "m: unknown sd3_config key 'bogus'");
  CHECK(error_of([&] { parse_sd3_config(text + ";depth=3", "m"); }) == "m: sd3_config key 'depth' appears twice");
  text.replace(text.find("hidden=20"), 9, "hidden=x");
  CHECK(error_of([&] { parse_sd3_config(text, "m"); }) == "m: sd3_config hidden = x: must be an integer in [0, 65536]");
  CHECK(error_of([] { parse_sd3_config("in_channels=4", "m"); }) == "m: sd3_config has no 'out_channels'");
  CHECK(error_of([] { parse_sd3_config(format_sd3_config(sd3_config{.heads = 7}), "m"); }) ==
        "m: sd3_config: hidden 1536 is not divisible by heads 7");
  CHECK(named_sd3_config("sd3.5-large") == large);
  const sd3_config run_tiny = named_sd3_config("sd3-tiny");  // tiny's blocks on the shapes data's terms
  CHECK(run_tiny.in_channels == 3);
  CHECK(run_tiny.out_channels == 3);
  CHECK(run_tiny.context_in == 32);
  CHECK(run_tiny.pooled_in == 32);
  CHECK(run_tiny.hidden == tiny.hidden);
  CHECK(run_tiny.depth == tiny.depth);
  CHECK(error_of([] { named_sd3_config("dev"); }) ==
        "'dev' is not an SD3 config (sd3.5-medium, sd3.5-large or sd3-tiny)");
  CHECK(sd3_spec.find("sd3.5-medium")->guidance_scale == 7);
  CHECK(sd3_spec.find("sd3-tiny")->released == false);
}

TEST_CASE("sd3 layouts: counts, shapes, detection, the diffusers mapping") {
  // Stability: 13 outside the blocks (pos_embed, x_embedder 2, t_embedder 4, y_embedder 4, context_embedder 2) + 4 in
  // the final layer; per block a stream of qkv 2 + ln_q/ln_k 2 + proj 2 + mlp 4 + adaLN 2 = 12, +6 for attn2, and the
  // last block's pre-only text stream qkv 2 + ln 2 + adaLN 2 = 6.
  //   medium (24 blocks, 0..12 dual): 17 + 24 x 12 + 13 x 6 + 23 x 12 + 6 = 665; large (38, none): 17 + 38 x 12 +
  //   37 x 12 + 6 = 923.
  // Diffusers: q, k, v split (+4 per stream, +4 per attn2): a stream 16, attn2 10, the pre-only stream 10.
  //   medium: 17 + 24 x 16 + 13 x 10 + 23 x 16 + 10 = 909; large: 17 + 38 x 16 + 37 x 16 + 10 = 1227 (both the
  //   state_dict sizes of diffusers' SD3Transformer2DModel of these shapes).
  CHECK(sd3_expected_tensors(sd3_config::medium(), sd3_layout::stability).size() == 665);
  CHECK(sd3_expected_tensors(sd3_config::medium(), sd3_layout::diffusers).size() == 909);
  CHECK(sd3_expected_tensors(sd3_config::large(), sd3_layout::stability).size() == 923);
  CHECK(sd3_expected_tensors(sd3_config::large(), sd3_layout::diffusers).size() == 1227);
  CHECK(sd3_expected_tensors(sd3_config{.qk_norm = false}, sd3_layout::stability).size() == 665 - 2 * 24 * 2 - 2 * 13);

  using shape = std::vector<std::int64_t>;
  const auto medium = sd3_expected_tensors(sd3_config::medium(), sd3_layout::stability);
  CHECK(medium.front() == sd3_tensor_spec{"pos_embed", {1, 384 * 384, 1536}});
  CHECK(shape_of(medium, "x_embedder.proj.weight") == shape{1536, 16, 2, 2});
  CHECK(shape_of(medium, "context_embedder.weight") == shape{1536, 4096});
  CHECK(shape_of(medium, "y_embedder.mlp.0.weight") == shape{1536, 2048});
  CHECK(shape_of(medium, "joint_blocks.12.x_block.adaLN_modulation.1.weight") == shape{9 * 1536, 1536});
  CHECK(shape_of(medium, "joint_blocks.13.x_block.adaLN_modulation.1.weight") == shape{6 * 1536, 1536});
  CHECK(shape_of(medium, "joint_blocks.13.x_block.attn2.qkv.weight").empty());
  CHECK(shape_of(medium, "joint_blocks.0.context_block.attn.ln_k.weight") == shape{64});
  CHECK(shape_of(medium, "joint_blocks.23.context_block.adaLN_modulation.1.bias") == shape{2 * 1536});
  CHECK(shape_of(medium, "joint_blocks.23.context_block.attn.proj.weight").empty());
  CHECK(shape_of(medium, "joint_blocks.23.context_block.mlp.fc1.weight").empty());
  CHECK(shape_of(medium, "final_layer.linear.weight") == shape{64, 1536});
  const auto medium_diffusers = sd3_expected_tensors(sd3_config::medium(), sd3_layout::diffusers);
  CHECK(shape_of(medium_diffusers, "pos_embed.pos_embed") == shape{1, 384 * 384, 1536});
  CHECK(shape_of(medium_diffusers, "transformer_blocks.5.attn2.to_k.weight") == shape{1536, 1536});
  CHECK(shape_of(medium_diffusers, "transformer_blocks.23.attn.norm_added_q.weight") == shape{64});
  CHECK(shape_of(medium_diffusers, "transformer_blocks.23.attn.to_add_out.weight").empty());

  const sd3_config tiny = sd3_config::tiny();
  const auto stability = sd3_expected_tensors(tiny, sd3_layout::stability);
  const auto diffusers = sd3_expected_tensors(tiny, sd3_layout::diffusers);
  CHECK(detect_sd3_layout(names_of(stability)) == sd3_layout::stability);
  CHECK(detect_sd3_layout(names_of(diffusers)) == sd3_layout::diffusers);
  CHECK(detect_sd3_layout(std::vector<std::string>{"pos_embed"}) == sd3_layout::stability);
  CHECK(detect_sd3_layout(std::vector<std::string>{"pos_embed.pos_embed"}) == sd3_layout::diffusers);
  CHECK_FALSE(detect_sd3_layout(std::vector<std::string>{"context_embedder.weight"}).has_value());
  CHECK(parse_sd3_layout("stability") == sd3_layout::stability);
  CHECK(error_of([] { parse_sd3_layout("bfl"); }) == "unknown SD3 layout 'bfl' (expected stability or diffusers)");

  // The mapping: one entry per stability tensor (same order), every diffusers tensor a source exactly once.
  const auto mapping = sd3_diffusers_to_stability(tiny);
  REQUIRE(mapping.size() == stability.size());
  std::multiset<std::string> sources;
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    CHECK(mapping[i].target == stability[i].name);
    sources.insert(mapping[i].sources.begin(), mapping[i].sources.end());
  }
  CHECK(sources.size() == diffusers.size());
  for (const auto& spec : diffusers) CHECK(sources.count(spec.name) == 1);
  const auto has = [&](const sd3_key_mapping& entry) { return std::ranges::find(mapping, entry) != mapping.end(); };
  CHECK(has({"joint_blocks.0.x_block.attn2.qkv.bias",
             {"transformer_blocks.0.attn2.to_q.bias", "transformer_blocks.0.attn2.to_k.bias",
              "transformer_blocks.0.attn2.to_v.bias"},
             sd3_merge::concat}));
  CHECK(has({"joint_blocks.1.context_block.adaLN_modulation.1.weight",
             {"transformer_blocks.1.norm1_context.linear.weight"},
             sd3_merge::swap_halves}));
  CHECK(has({"joint_blocks.0.context_block.adaLN_modulation.1.weight",
             {"transformer_blocks.0.norm1_context.linear.weight"},
             sd3_merge::copy}));
  CHECK(has({"final_layer.adaLN_modulation.1.bias", {"norm_out.linear.bias"}, sd3_merge::swap_halves}));
  CHECK(has({"x_embedder.proj.weight", {"pos_embed.proj.weight"}, sd3_merge::copy}));

  // Both layouts' names and shapes are exactly those of the fixture, whose diffusers half diffusers' converter wrote.
  const fixture& f = load_fixture();
  CHECK(f.config == tiny);
  for (const auto& [specs, tensors] : {std::pair{&stability, &f.stability}, std::pair{&diffusers, &f.diffusers}}) {
    CHECK(tensors->size() == specs->size());
    for (const auto& spec : *specs) {
      INFO(spec.name);
      REQUIRE(tensors->contains(spec.name));
      CHECK(tensors->at(spec.name).sizes().vec() == spec.shape);
    }
  }

  // The key report and its one-line message.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& spec : stability) shapes[spec.name] = spec.shape;
  shapes.erase("pos_embed");
  shapes["final_layer.linear.bias"] = {8};
  const sd3_key_report report = check_sd3_tensors(tiny, sd3_layout::stability, shapes);
  CHECK(report.missing == std::vector<std::string>{"pos_embed"});
  CHECK(report.mismatched == std::vector<std::string>{"final_layer.linear.bias [8] (expected [16])"});
}

TEST_CASE("sd3 LoRA keys: fused qkv split by rows, the (shift, scale) swaps") {
  const auto parts = sd3_lora_diffusers_parts("joint_blocks.0.context_block.attn.qkv", 60, 20);
  REQUIRE(parts.size() == 3);
  CHECK(parts[1].name == "transformer_blocks.0.attn.add_k_proj");
  CHECK(parts[1].row_offset == 20);
  CHECK(parts[2].rows == 20);
  const auto last = sd3_lora_diffusers_parts("joint_blocks.1.context_block.adaLN_modulation.1", 40, 20);
  CHECK((last.size() == 1 && last[0].name == "transformer_blocks.1.norm1_context.linear" && last[0].swap_halves));
  CHECK_FALSE(sd3_lora_diffusers_parts("joint_blocks.0.context_block.adaLN_modulation.1", 120, 20)[0].swap_halves);
  CHECK(sd3_lora_diffusers_parts("final_layer.adaLN_modulation.1", 40, 20)[0].swap_halves);
  CHECK(sd3_lora_diffusers_parts("joint_blocks.0.x_block.mlp.fc2", 20, 80)[0].name == "transformer_blocks.0.ff.net.2");
  CHECK(sd3_lora_diffusers_parts("t_embedder.mlp.2", 20, 20)[0].name == "time_text_embed.timestep_embedder.linear_2");
  CHECK(error_of([] { sd3_lora_diffusers_parts("joint_blocks.0.x_block.attn.qkv", 50, 20); }) ==
        "LoRA layer joint_blocks.0.x_block.attn.qkv: 50 output rows do not hold q, k and v of 20");
  CHECK(error_of([] { sd3_lora_diffusers_parts("double_blocks.0.img_attn.qkv", 60, 20); }) ==
        "LoRA layer 'double_blocks.0.img_attn.qkv' is not a linear layer of the SD3 transformer (stability names)");
  // Every adapted layer of the model has its diffusers modules, and they are diffusers tensors of the tiny shape.
  sd3_transformer model(sd3_config::tiny());
  add_lora(model, lora_options{.rank = 2, .modulation = true, .embedding = true});
  std::set<std::string> diffusers;
  for (const auto& spec : sd3_expected_tensors(model.config(), sd3_layout::diffusers)) diffusers.insert(spec.name);
  for (const auto& [name, layer] : lora_layers(model)) {
    INFO(name);
    CHECK(sd3_lora_layer(name));
    for (const auto& part : sd3_lora_diffusers_parts(name, layer->weight.size(0), layer->weight.size(1)))
      CHECK(diffusers.contains(part.name + ".weight"));
  }
  CHECK_FALSE(sd3_lora_layer("blocks.0.self_attn.q"));
  CHECK_FALSE(sd3_lora_layer("joint_blocks.0.x_block.bogus"));
}

TEST_CASE("the model's parameters are exactly the stability layout, in order") {
  for (const sd3_config& config : {sd3_config::tiny(), sd3_config{.hidden = 24,
                                                       .heads = 2,
                                                       .depth = 3,
                                                       .pos_embed_max_size = 4,
                                                       .sample_size = 8,
                                                       .context_in = 8,
                                                       .pooled_in = 8,
                                                       .qk_norm = false,
                                                       .dual_attention_layers = 2}}) {
    sd3_transformer model(config);
    const auto params = model.named_parameters();
    const auto expected = sd3_expected_tensors(config, sd3_layout::stability);
    REQUIRE(params.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CHECK(params[i].key() == expected[i].name);
      CHECK(params[i].value().sizes().vec() == expected[i].shape);
    }
  }
}

TEST_CASE("sd3 forward agrees with diffusers' SD3Transformer2DModel to 1e-4") {
  const fixture& f = load_fixture();
  sd3_transformer model(f.config);
  load_sd3_weights(model, f.stability);
  const torch::Tensor ours = run(model, f);
  REQUIRE(ours.sizes() == f.velocity.sizes());
  const double scale = f.velocity.abs().max().item<double>();
  const double relative = max_abs_diff(ours, f.velocity) / scale;
  INFO("float32: max |diff| " << max_abs_diff(ours, f.velocity) << ", max |v| " << scale);
  CHECK(scale > 0.1);  // not a degenerate output
  CHECK(relative < 1e-4);
  // In float64 the only float32 left is the sinusoid (diffusers computes it in float32 too).
  model.to(torch::kFloat64);
  const double relative64 = max_abs_diff(run(model, f), f.velocity) / scale;
  INFO("float32 relative " << relative << ", float64 relative " << relative64);
  CHECK(relative64 < 1e-5);
  WARN("sd3 vs diffusers, max |diff| / max |v|: float32 " << relative << ", float64 " << relative64);
}

TEST_CASE("sd3 checkpoints in either layout and the released single file load with identical outputs") {
  const fixture& f = load_fixture();
  sd3_transformer from_stability(f.config), from_diffusers(f.config), from_released(f.config);
  load_sd3_weights(from_stability, f.stability);
  load_sd3_weights(from_diffusers, f.diffusers);  // layout detected from the names
  std::map<std::string, torch::Tensor> released;
  for (const auto& [name, tensor] : f.stability) released["model.diffusion_model." + name] = tensor;
  released["first_stage_model.decoder.conv_in.weight"] = torch::zeros({3});
  released["text_encoders.t5xxl.transformer.shared.weight"] = torch::zeros({2});
  load_sd3_weights(from_released, released);
  const torch::Tensor expected = run(from_stability, f);
  CHECK(torch::equal(run(from_diffusers, f), expected));
  CHECK(torch::equal(run(from_released, f), expected));

  // Our conversion to diffusers' names reproduces diffusers' converter bit for bit, and back.
  const auto converted = convert_sd3_weights(f.stability, f.config, sd3_layout::stability, sd3_layout::diffusers);
  REQUIRE(converted.size() == f.diffusers.size());
  for (const auto& [name, tensor] : f.diffusers) CHECK(torch::equal(converted.at(name), tensor));
  const auto round_trip = convert_sd3_weights(converted, f.config, sd3_layout::diffusers, sd3_layout::stability);
  for (const auto& [name, tensor] : f.stability) CHECK(torch::equal(round_trip.at(name), tensor));

  // bf16 weights load into an fp32 model as their bf16-rounded values.
  std::map<std::string, torch::Tensor> half;
  for (const auto& [name, tensor] : f.diffusers) half[name] = tensor.to(torch::kBFloat16);
  sd3_transformer from_bf16(f.config);
  load_sd3_weights(from_bf16, half);
  CHECK(torch::equal(from_bf16.pos_embed, f.stability.at("pos_embed").to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("sd3 one-line errors") {
  const fixture& f = load_fixture();
  sd3_transformer model(f.config);
  CHECK(error_of([&] {
          load_sd3_weights(model, std::map<std::string, torch::Tensor>{{"x.weight", torch::zeros({1})}});
        }) ==
        "SD3 checkpoint of 1 tensors is in neither layout: no pos_embed (stability) and no "
        "pos_embed.pos_embed (diffusers)");
  auto broken = f.diffusers;
  broken.erase("proj_out.bias");
  broken["transformer_blocks.1.attn.to_add_out.weight"] = torch::zeros({20, 20});  // the pre-only block has none
  CHECK(error_of([&] { load_sd3_weights(model, broken); }) ==
        "SD3 checkpoint (diffusers layout) does not match the config: missing proj_out.bias, unexpected "
        "transformer_blocks.1.attn.to_add_out.weight");
  // A checkpoint of SD3.5 Medium's names against the tiny config: shape mismatches, counted after 10.
  std::map<std::string, torch::Tensor> medium;
  for (const auto& spec : sd3_expected_tensors(sd3_config::medium(), sd3_layout::stability))
    if (spec.name.starts_with("joint_blocks.0.")) medium[spec.name] = torch::zeros({1});
  medium["pos_embed"] = torch::zeros({1});
  const std::string message = error_of([&] { load_sd3_weights(model, medium); });
  CHECK(message.starts_with("SD3 checkpoint (stability layout) does not match the config: missing "));
  CHECK(message.find(" more") != std::string::npos);

  // Latent sizes: odd, above the position grid, wrong channels.
  CHECK(error_of([&] {
          model.forward(torch::zeros({2, 4, 5, 6}), f.timestep, f.context, f.pooled);
        }) == "sd3 latent 5 x 6 is not a whole number of 2 x 2 patches");
  CHECK(error_of([&] {
          model.forward(torch::zeros({2, 4, 18, 4}), f.timestep, f.context, f.pooled);
        }) == "sd3 latent 18 x 4 is 9 x 2 patches, above pos_embed_max_size 8");
  CHECK(error_of([&] {
          model.forward(torch::zeros({2, 3, 4, 6}), f.timestep, f.context, f.pooled);
        }) == "sd3 latents must be [B, 4, H, W], got [2, 3, 4, 6]");
  CHECK(error_of([&] {
          model.forward(f.x, f.timestep, f.context, torch::zeros({2, 16}));
        }) == "sd3 pooled must be [2, 12], got [2, 16]");

  // Prompt tables of other families, against a small model of the released text widths (4096, pooled 2048): FLUX's
  // [N, L, 4096] with pooled [N, 768], told apart by the pooled width; Wan's, without pooled vectors.
  const auto wide = std::make_shared<sd3_transformer>(sd3_config{.in_channels = 4,
                                                                 .out_channels = 4,
                                                                 .hidden = 8,
                                                                 .heads = 1,
                                                                 .depth = 1,
                                                                 .pos_embed_max_size = 4,
                                                                 .sample_size = 8,
                                                                 .dual_attention_layers = 0});
  CHECK(error_of([&] {
          sd3_denoiser(wide, prompt_table(torch::zeros({2, 8, 4096}), torch::zeros({2, 768})));
        }) ==
        "sd3 prompt embeddings must be [N, L, 4096] with pooled [N, 2048], got [2, 8, 4096] with pooled [2, 768]");
  CHECK(error_of([&] {
          sd3_denoiser(wide, prompt_table(torch::zeros({2, 8, 4096}), torch::Tensor()));
        }) ==
        "sd3 prompt embeddings must be [N, L, 4096] with pooled [N, 2048], got [2, 8, 4096] with no pooled vectors");
  CHECK_NOTHROW(sd3_denoiser(wide, prompt_table(torch::zeros({2, 8, 4096}), torch::zeros({2, 2048}))));
  const auto model_ptr = std::make_shared<sd3_transformer>(f.config);
  CHECK(error_of([&] {
          sd3_denoiser(model_ptr, prompt_table(torch::zeros({2, 5, 16}), torch::zeros({2, 16})));
        }) == "sd3 prompt embeddings must be [N, L, 16] with pooled [N, 12], got [2, 5, 16] with pooled [2, 16]");
  CHECK(error_of([&] {
          sd3_denoiser(model_ptr, prompt_table(torch::zeros({2, 5, 16}), torch::Tensor()));
        }) == "sd3 prompt embeddings must be [N, L, 16] with pooled [N, 12], got [2, 5, 16] with no pooled vectors");
}

TEST_CASE("sd3_denoiser: 1000 sigma, the rows' prompts") {
  const fixture& f = load_fixture();
  const auto model = std::make_shared<sd3_transformer>(f.config);
  load_sd3_weights(*model, f.stability);
  sd3_denoiser denoiser(model, prompt_table(f.context, f.pooled));
  // Rows of the fixture's two prompts at sigma 0.25: row 0 of the fixture (timestep 250) is reproduced.
  const std::vector<std::int64_t> prompts{0, 1};
  const torch::Tensor v = denoiser(f.x, denoise_batch{.step = 0, .sigma = 0.25, .trees = {}, .prompts = prompts});
  torch::NoGradGuard no_grad;
  const torch::Tensor direct = model->forward(f.x, torch::full({2}, 250.0), f.context, f.pooled);
  CHECK(torch::allclose(v, direct));
  CHECK(max_abs_diff(v[0], f.velocity[0]) / f.velocity.abs().max().item<double>() < 1e-4);
}

TEST_CASE("sd3 LoRA: zero B is the base, gradients reach the adapters, gradient checkpointing agrees") {
  const fixture& f = load_fixture();
  sd3_transformer model(f.config);
  load_sd3_weights(model, f.stability);
  const torch::Tensor base = run(model, f);
  // Block 0: x qkv, proj, attn2 qkv, attn2 proj, fc1, fc2 + context qkv, proj, fc1, fc2; block 1: x 4 + context qkv.
  CHECK(add_lora(model, lora_options{.rank = 2, .alpha = 4}) == 15);
  CHECK(torch::equal(run(model, f), base));
  {
    torch::NoGradGuard no_grad;
    for (const auto& tensor : lora_parameters(model))
      if (tensor.size(1) == 2) tensor.normal_(0, 0.05);  // the B's: [out, rank]
  }
  const auto gradients = [&](bool checkpoint) {
    model.set_gradient_checkpointing(checkpoint);
    model.zero_grad();
    const torch::Tensor loss = model.forward(f.x, f.timestep, f.context, f.pooled).pow(2).sum();
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach()};
    for (const auto& p : lora_parameters(model)) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = gradients(false);
  const auto checkpointed = gradients(true);
  REQUIRE(plain.size() == 1 + 2 * 15);
  CHECK(torch::allclose(plain[0], checkpointed[0]));
  double worst = 0;
  for (std::size_t i = 1; i < plain.size(); ++i) {
    CHECK(plain[i].abs().sum().item<double>() > 0);  // every A and B gets a gradient
    worst =
        std::max(worst, max_abs_diff(plain[i], checkpointed[i]) / std::max(1.0, plain[i].abs().max().item<double>()));
  }
  CHECK(worst < 1e-5);
  CHECK_FALSE(model.x_embedder->proj->weight.grad().defined());  // the base stays frozen
}
