// torch/lora_export.hpp: the key tables agree with the layouts' own conversions (model_specs/*/layout.hpp), the
// fused split is exact, merging matches lora_linear, and the fixture checkpoints `export-lora`'s CLI tests and
// scripts/check_lora_export.py read (BRANCHGRPO_LORA_EXPORT_DIR: tiny FLUX, Wan, SD3 and Wan2.2 runs with
// trained-looking adapters, their EMA, the inputs and the C++ velocity of the adapted model, and a full fine-tuning
// checkpoint). Wan2.2's adapters go to one file per expert, in Wan's keys (lora_export_files).
#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"
#include "branchgrpo/torch/checkpoint.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/lora_export.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/sd3/transformer.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"
#include "branchgrpo/torch/wan22/transformer.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;

namespace {

// Every LoRA-adaptable layer of `model`, each with an adapter whose B is random (a trained adapter, not B = 0).
template <class Model>
std::map<std::string, torch::Tensor> trained_adapters(Model& model, const lora_options& options, std::uint64_t seed) {
  add_lora(model, options);
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& [name, layer] : lora_layers(model))
    if (layer->has_adapter()) layer->lora_B.copy_(torch::randn_like(layer->lora_B) * 0.05);
  return lora_state(model);
}

lora_options every_layer(std::int64_t rank, double alpha) {
  return {.rank = rank, .alpha = alpha, .attention = true, .mlp = true, .modulation = true, .embedding = true};
}

// The config text a training run of `toml` would store (no input checksums: the fixture has no input files).
std::string stored_config(const std::string& toml) {
  return config_text(parse_run_config(toml, "fixture.toml"), false);
}

// A run's checkpoint of `model` at iteration 2 under `dir`: every layer adapted with trained-looking adapters
// (seed `adapter_seed`), their EMA at half, and the config the run stored (`model_toml` + LoRA + run sections); the
// base weights (before the adapters) in dir/base.safetensors.
template <class Model>
void write_trained_run(Model& model, const std::filesystem::path& dir, std::uint64_t adapter_seed,
                       const std::string& config_toml) {
  std::map<std::string, torch::Tensor> base;
  for (const auto& item : model.named_parameters()) base[item.key()] = item.value().detach().clone();
  const auto weights = trained_adapters(model, every_layer(4, 8), adapter_seed);
  std::map<std::string, torch::Tensor> state;
  for (const auto& [name, tensor] : weights) state["ema." + name] = tensor * 0.5;
  write_checkpoint(
      dir / "iter-000002",
      {.iteration = 2, .seed = 3, .weights = weights, .state = state, .config_text = stored_config(config_toml)});
  save_safetensors(dir / "base.safetensors", base);
}

}  // namespace

// The LoRA table of a family that fuses projections (FLUX, SD3): every linear layer of `expected` (its 2-D
// ".weight" tensors) is the target of one entry of `mappings` (diffusers -> our names), whose sources are exactly the
// modules `parts(layer, rows, columns)` names, in order, their rows covering the layer's.
template <class Parts>
void check_lora_table(const std::vector<flux_key_mapping>& mappings, const std::vector<flux_tensor_spec>& expected,
                      Parts parts_of) {
  std::map<std::string, std::vector<std::int64_t>> linear;  // our names of 2-D weights: the linear layers
  for (const auto& spec : expected)
    if (spec.shape.size() == 2 && spec.name.ends_with(".weight")) linear.emplace(spec.name, spec.shape);
  std::size_t checked = 0;
  for (const flux_key_mapping& entry : mappings) {
    const auto it = linear.find(entry.target);
    if (it == linear.end()) continue;
    const std::string layer = entry.target.substr(0, entry.target.size() - 7);  // without ".weight"
    const std::int64_t rows = it->second[0];
    const auto parts = parts_of(layer, rows, it->second[1]);
    REQUIRE(parts.size() == entry.sources.size());
    std::int64_t covered = 0;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      CHECK(parts[i].name + ".weight" == entry.sources[i]);
      CHECK(parts[i].row_offset == covered);
      covered += parts[i].rows;
      CHECK(parts[i].swap_halves == (entry.merge == flux_merge::swap_halves));
    }
    CHECK(covered == rows);
    ++checked;
  }
  CHECK(checked == linear.size());
}

TEST_CASE("the FLUX LoRA table is flux_diffusers_to_bfl's linear layers read backwards") {
  const flux_config config = flux_config::tiny();
  check_lora_table(flux_diffusers_to_bfl(config), flux_expected_tensors(config, flux_layout::bfl),
                   flux_lora_diffusers_parts);
  flux_transformer model(config);
  for (const auto& [name, layer] : lora_layers(model))
    CHECK_NOTHROW(flux_lora_diffusers_parts(name, layer->out_features(), layer->in_features()));
  CHECK_THROWS_WITH(flux_lora_diffusers_parts("double_blocks.0.img_attn.norm", 64, 64),
                    Catch::Matchers::Contains("not a linear layer of the FLUX transformer"));
}

TEST_CASE("the Wan LoRA table is wan_diffusers_to_official's linear layers read backwards") {
  const wan_config config = wan_config::tiny();
  std::set<std::string> linear_weights;
  for (const auto& spec : wan_expected_tensors(config, wan_layout::official))
    if (spec.shape.size() == 2 && spec.name.ends_with(".weight")) linear_weights.insert(spec.name);
  std::size_t checked = 0;
  for (const wan_key_mapping& entry : wan_diffusers_to_official(config)) {
    if (!linear_weights.contains(entry.target)) continue;
    const std::string layer = entry.target.substr(0, entry.target.size() - 7);
    CHECK(wan_lora_diffusers_name(layer) + ".weight" == entry.source);
    ++checked;
  }
  CHECK(checked == linear_weights.size());
  // Every adaptable layer of the model is in the table.
  wan_transformer model(config);
  for (const auto& [name, layer] : lora_layers(model)) CHECK_NOTHROW(wan_lora_diffusers_name(name));
}

TEST_CASE("the SD3 LoRA table is sd3_diffusers_to_stability's linear layers read backwards") {
  const sd3_config config = sd3_config::tiny();
  check_lora_table(sd3_diffusers_to_stability(config), sd3_expected_tensors(config, sd3_layout::stability),
                   sd3_lora_diffusers_parts);
  sd3_transformer model(config);
  for (const auto& [name, layer] : lora_layers(model))
    CHECK_NOTHROW(sd3_lora_diffusers_parts(name, layer->out_features(), layer->in_features()));
}

TEST_CASE("Wan2.2's adapters go to one file per expert, in Wan's keys") {
  const torch::Tensor a = torch::ones({1, 40}), b = torch::ones({40, 1});
  const std::map<std::string, lora_adapter> adapters = {{"high_noise_model.blocks.0.self_attn.q", {.down = a, .up = b}},
                                                        {"low_noise_model.blocks.0.self_attn.q", {.down = a, .up = b}},
                                                        {"low_noise_model.blocks.1.ffn.2", {.down = a, .up = b}}};
  const model_spec* family = lora_family_of(adapters);  // an entry of model_spec_table, as export-lora finds it
  REQUIRE((family != nullptr && family->name == "wan22"));
  const auto files = lora_export_files(adapters, *family, "out/l.safetensors");
  REQUIRE(files.size() == 2);
  CHECK(files[0].path == "out/l.high_noise_model.safetensors");
  CHECK(files[0].module == "high_noise_model");
  CHECK(files[0].family->name == "wan");
  CHECK(files[0].adapters.size() == 1);
  CHECK(files[0].adapters.contains("blocks.0.self_attn.q"));
  CHECK(files[1].path == "out/l.low_noise_model.safetensors");
  CHECK(files[1].adapters.size() == 2);
  const auto low =
      export_lora_tensors(files[1].adapters, *files[1].family, lora_export_format::diffusers, 1, std::nullopt);
  CHECK(low.contains("transformer.blocks.0.attn1.to_q.lora_A.weight"));
  CHECK(low.contains("transformer.blocks.1.ffn.net.2.lora_B.weight"));
  // One file for a family without lora_files; a layer outside both experts is named.
  const auto flux = lora_export_files({{"final_layer.linear", {.down = a, .up = b}}}, flux_spec, "f.safetensors");
  CHECK((flux.size() == 1 && flux[0].path == "f.safetensors" && flux[0].family == &flux_spec));
  CHECK_THROWS_WITH(lora_export_files({{"blocks.0.self_attn.q", {.down = a, .up = b}}}, wan22_spec, "l.safetensors"),
                    Catch::Matchers::Contains("LoRA layer 'blocks.0.self_attn.q' is in none of the Wan2.2 modules"));
  CHECK_THROWS_WITH(check_lora_export_format(wan22_spec, lora_export_format::kohya),
                    "--format kohya: Wan2.2 models export as diffusers or comfyui");
  CHECK_NOTHROW(check_lora_export_format(sd3_spec, lora_export_format::kohya));
}

TEST_CASE("a fused adapter split by rows with A shared is exact; the scale folds into B") {
  torch::manual_seed(1);
  const std::int64_t hidden = 8, rank = 2;
  const torch::Tensor w = torch::randn({3 * hidden, hidden}, torch::kFloat64),
                      a = torch::randn({rank, hidden}, torch::kFloat64),
                      b = torch::randn({3 * hidden, rank}, torch::kFloat64),
                      x = torch::randn({5, hidden}, torch::kFloat64);
  const double alpha = 6;
  const torch::Tensor fused = torch::linear(x, w + alpha / rank * torch::matmul(b, a));
  const auto exported = export_lora_tensors({{"double_blocks.0.img_attn.qkv", {.down = a, .up = b}}}, flux_spec,
                                            lora_export_format::diffusers, alpha, std::nullopt);
  REQUIRE(exported.size() == 6);
  const char* names[] = {"to_q", "to_k", "to_v"};
  for (std::int64_t i = 0; i < 3; ++i) {
    const std::string prefix = std::string("transformer.transformer_blocks.0.attn.") + names[i];
    const torch::Tensor& down = exported.at(prefix + ".lora_A.weight");
    const torch::Tensor& up = exported.at(prefix + ".lora_B.weight");
    CHECK(torch::equal(down, a));
    // PEFT without alphas: scale 1.
    const torch::Tensor part = torch::linear(x, w.narrow(0, i * hidden, hidden) + torch::matmul(up, down));
    CHECK(torch::allclose(part, fused.narrow(1, i * hidden, hidden), 1e-12, 1e-12));
  }
  const auto kohya = export_lora_tensors({{"double_blocks.0.img_attn.qkv", {.down = a, .up = b}}}, flux_spec,
                                         lora_export_format::kohya, alpha, torch::kFloat32);
  CHECK(torch::equal(kohya.at("lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight"), b.to(torch::kFloat32)));
  CHECK(kohya.at("lora_unet_double_blocks_0_img_attn_qkv.alpha").item<double>() == alpha);
  CHECK(kohya.at("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight").scalar_type() == torch::kFloat32);
  CHECK_THROWS_WITH(check_lora_export_format(wan_spec, lora_export_format::kohya),
                    "--format kohya: Wan models export as diffusers or comfyui");
}

TEST_CASE("the norm_out swap and the merge") {
  const torch::Tensor a = torch::ones({1, 2}), b = torch::tensor({{1.0f}, {2.0f}, {3.0f}, {4.0f}});
  const auto exported = export_lora_tensors({{"final_layer.adaLN_modulation.1", {.down = a, .up = b}}}, flux_spec,
                                            lora_export_format::diffusers, 1, std::nullopt);
  CHECK(torch::equal(exported.at("transformer.norm_out.linear.lora_B.weight").flatten(),
                     torch::tensor({3.0f, 4.0f, 1.0f, 2.0f})));
  // lora.hpp's example: W = [[1, 2]], A = [[1, 1]], B = [[0.5]], alpha 2, rank 1 -> [[2, 3]].
  const auto merged = merge_lora_tensors(
      {{"l.weight", torch::tensor({{1.0f, 2.0f}})}, {"l.bias", torch::zeros({1})}},
      {{"l", {.down = torch::tensor({{1.0f, 1.0f}}), .up = torch::tensor({{0.5f}})}}}, 2, torch::kBFloat16);
  CHECK(torch::equal(merged.at("l.weight").to(torch::kFloat32), torch::tensor({{2.0f, 3.0f}})));
  CHECK(merged.at("l.bias").scalar_type() == torch::kBFloat16);
}

TEST_CASE("a pending stop ends the export and the merge before their first layer") {
  const torch::Tensor a = torch::ones({1, 2}), b = torch::ones({4, 1});
  branchgrpo::request_stop(SIGTERM);
  CHECK_THROWS_WITH(export_lora_tensors({{"final_layer.adaLN_modulation.1", {.down = a, .up = b}}}, flux_spec,
                                        lora_export_format::diffusers, 1, std::nullopt),
                    "stopped by SIGTERM during the LoRA export");
  CHECK_THROWS_WITH(
      merge_lora_tensors({{"l.weight", torch::ones({1, 2})}}, {{"l", {.down = a, .up = b}}}, 1, std::nullopt),
      "stopped by SIGTERM during the LoRA merge");
  branchgrpo::clear_stop();
}

TEST_CASE("fixture checkpoints for export-lora") {
  const std::filesystem::path root = BRANCHGRPO_LORA_EXPORT_DIR;
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::uint64_t seed = 3;
  const std::string lora =
      "[lora]\nrank = 4\nalpha = 8.0\ntargets = [\"attention\", \"mlp\", \"modulation\", \"embedding\"]\n";
  const std::string run = "[run]\nseed = 3\n[optimizer]\nema_decay = 0.9\n";

  {  // FLUX tiny, random base from run.seed as load_run_model makes it.
    torch::manual_seed(seed);
    flux_transformer model(flux_config::tiny());
    const auto base = flux_state(model);
    std::map<std::string, torch::Tensor> base_copy;
    for (const auto& [name, tensor] : base) base_copy[name] = tensor.clone();
    const auto weights = trained_adapters(model, every_layer(4, 8), 11);
    std::map<std::string, torch::Tensor> state;
    for (const auto& [name, tensor] : weights) state["ema." + name] = tensor * 0.5;
    write_checkpoint(
        root / "flux" / "iter-000002",
        {.iteration = 2,
         .seed = seed,
         .weights = weights,
         .state = state,
         .config_text = stored_config(
             "[model]\ndir = \"\"\nconfig = \"tiny\"\nlatent_height = 4\nlatent_width = 6\n[data]\nembeddings = "
             "\"prompts.safetensors\"\n" +
             lora + run)});
    // The inputs and the adapted model's velocity (token form, as diffusers' FluxTransformer2DModel takes them).
    torch::manual_seed(5);
    const std::int64_t rows = 2, cols = 3;
    const flux_inputs in{.img = torch::randn({2, rows * cols, 16}),
                         .img_ids = flux_image_ids(rows, cols),
                         .txt = torch::randn({2, 5, 32}),
                         .txt_ids = flux_text_ids(5),
                         .timesteps = torch::tensor({0.3f, 0.8f}),
                         .pooled = torch::randn({2, 16}),
                         .guidance = torch::tensor({3.5f, 1.0f})};
    torch::NoGradGuard no_grad;
    const torch::Tensor velocity = model.forward(in);
    save_safetensors(root / "flux" / "io.safetensors", {{"img", in.img},
                                                        {"img_ids", in.img_ids.to(torch::kFloat32)},
                                                        {"txt", in.txt},
                                                        {"txt_ids", in.txt_ids.to(torch::kFloat32)},
                                                        {"timesteps", in.timesteps},
                                                        {"pooled", in.pooled},
                                                        {"guidance", in.guidance},
                                                        {"velocity", velocity}});
    save_safetensors(root / "flux" / "base.safetensors", base_copy);
    CHECK(velocity.abs().max().item<double>() > 0);

    // Full fine-tuning: every weight trained, no adapters.
    write_checkpoint(
        root / "flux_full" / "iter-000001",
        {.iteration = 1,
         .seed = seed,
         .weights = base_copy,
         .state = {},
         .config_text = stored_config(
             "[model]\ndir = \"\"\nconfig = \"tiny\"\nlatent_height = 4\nlatent_width = 6\n[data]\nembeddings = "
             "\"prompts.safetensors\"\n[lora]\nenabled = false\n")});
    // A LoRA checkpoint without EMA.
    write_checkpoint(
        root / "flux_no_ema" / "iter-000001",
        {.iteration = 1,
         .seed = seed,
         .weights = weights,
         .state = {},
         .config_text = stored_config(
             "[model]\ndir = \"\"\nconfig = \"tiny\"\nlatent_height = 4\nlatent_width = 6\n[data]\nembeddings = "
             "\"prompts.safetensors\"\n" +
             lora)});
  }
  {  // Wan tiny as a run names it ("wan-tiny": out_dim = in_dim, so that it can sample).
    torch::manual_seed(seed);
    wan_transformer model(named_wan_config("wan-tiny"));
    write_trained_run(
        model, root / "wan", 12,
        "[model]\ndir = \"\"\nconfig = \"wan-tiny\"\nlatent_height = 4\nlatent_width = 6\nlatent_frames = "
        "2\n[data]\nembeddings = \"prompts.safetensors\"\n" +
            lora + run);
    torch::manual_seed(6);
    const torch::Tensor latents = torch::randn({2, 4, 2, 4, 6}), timestep = torch::tensor({300.0f, 800.0f}),
                        text = torch::randn({2, 5, 24});
    torch::NoGradGuard no_grad;
    const torch::Tensor velocity = model.forward(latents, timestep, text);
    save_safetensors(root / "wan" / "io.safetensors",
                     {{"latents", latents}, {"timestep", timestep}, {"text", text}, {"velocity", velocity}});
  }
  {  // SD3 tiny as a run names it ("sd3-tiny": 3 channels, prompts 32 wide), random base from run.seed.
    torch::manual_seed(seed);
    sd3_transformer model(named_sd3_config("sd3-tiny"));
    write_trained_run(model, root / "sd3", 13,
                      "[model]\ndir = \"\"\nconfig = \"sd3-tiny\"\nlatent_height = 4\nlatent_width = 6\n[data]\n"
                      "embeddings = \"prompts.safetensors\"\n" +
                          lora + run);
    // The inputs as diffusers' SD3Transformer2DModel takes them: latents [B, C, H, W], timestep 1000 sigma.
    torch::manual_seed(7);
    const torch::Tensor latents = torch::randn({2, 3, 4, 6}), timestep = torch::tensor({300.0f, 800.0f}),
                        context = torch::randn({2, 5, 32}), pooled = torch::randn({2, 32});
    torch::NoGradGuard no_grad;
    const torch::Tensor velocity = model.forward(latents, timestep, context, pooled);
    save_safetensors(root / "sd3" / "io.safetensors", {{"latents", latents},
                                                       {"timestep", timestep},
                                                       {"context", context},
                                                       {"pooled", pooled},
                                                       {"velocity", velocity}});
    CHECK(velocity.abs().max().item<double>() > 0);
  }
  {  // Wan2.2 tiny as a run names it ("wan22-tiny"), LoRA on both experts. One io file per expert, named as the
     // export names the expert's file: its timesteps on that expert's side of the boundary 875 (875 itself is high).
    torch::manual_seed(seed);
    wan22_transformer model(named_wan22_config("wan22-tiny"));
    write_trained_run(model, root / "wan22", 14,
                      "[model]\ndir = \"\"\nconfig = \"wan22-tiny\"\nlatent_height = 4\nlatent_width = 6\n"
                      "latent_frames = 2\n[data]\nembeddings = \"prompts.safetensors\"\n" +
                          lora + run);
    torch::manual_seed(8);
    const torch::Tensor latents = torch::randn({2, 3, 2, 4, 6}), text = torch::randn({2, 5, 32});
    torch::NoGradGuard no_grad;
    for (const auto& [expert, timestep] : {std::pair{"high_noise_model", torch::tensor({875.0f, 950.0f})},
                                           std::pair{"low_noise_model", torch::tensor({300.0f, 874.0f})}}) {
      const torch::Tensor velocity = model.forward(latents, timestep, text);
      save_safetensors(root / "wan22" / ("io." + std::string(expert) + ".safetensors"),
                       {{"latents", latents}, {"timestep", timestep}, {"text", text}, {"velocity", velocity}});
    }
  }
}
