// Model weights as LibTorch loads them (adapters/torch/branchgrpo/torch/safetensors.hpp; docs/reliability.md,
// "Model files"): dtypes outside model_weight_dtypes refused before anything is copied, NaN and infinite elements
// refused as they are copied, each in one line naming the file (the shard of a sharded checkpoint) and the tensor;
// the autoencoder loaders apply both.
#include <torch/torch.h>

#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/wan/autoencoder.hpp"
#include "error_text.hpp"
#include "scratch_dir.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace branchgrpo;
using branchgrpo::testing::error_of;
namespace fs = std::filesystem;

const safetensors_load_options model_weights{.allowed_dtypes = model_weight_dtypes, .finite = true};

}  // namespace

TEST_CASE("model files: a weight of a dtype no model uses is refused, naming the file, tensor and dtype",
          "[reliability]") {
  const testing::scratch_dir dir("model_files", "dtypes");
  const fs::path path = dir.path / "model.safetensors";
  const std::string refused = ": model weights must be F32, BF16, F16 or F8_E4M3";
  for (const auto& [dtype, name] : std::vector<std::pair<torch::Dtype, std::string>>{{torch::kInt32, "I32"},
                                                                                     {torch::kInt64, "I64"},
                                                                                     {torch::kUInt8, "U8"},
                                                                                     {torch::kBool, "BOOL"},
                                                                                     {torch::kFloat64, "F64"}}) {
    save_safetensors(path, {{"a.weight", torch::ones({2, 2})}, {"b.weight", torch::ones({3}).to(dtype)}});
    CHECK(error_of([&] { load_safetensors(path, model_weights); }) ==
          path.string() + ": tensor 'b.weight' is " + name + refused);
    CHECK(load_safetensors(path).at("b.weight").scalar_type() == dtype);  // without the option: any dtype
  }
  // Every allowed dtype loads, converted to the requested one.
  save_safetensors(path, {{"f32", torch::full({2}, 1.5)},
                          {"bf16", torch::full({2}, 1.5).to(torch::kBFloat16)},
                          {"f16", torch::full({2}, 1.5).to(torch::kFloat16)}});
  const auto loaded =
      load_safetensors(path, {.dtype = torch::kFloat32, .allowed_dtypes = model_weight_dtypes, .finite = true});
  for (const auto& [name, tensor] : loaded) CHECK(torch::equal(tensor, torch::full({2}, 1.5)));
  // to_torch names the file it is given.
  const safetensors_file file(path);
  CHECK(error_of([&] {
          to_torch(file.at("f16"), {.allowed_dtypes = std::span(model_weight_dtypes).first(2)}, "m.safetensors");
        }) == "m.safetensors: tensor 'f16' is F16: model weights must be F32 or BF16");
}

TEST_CASE("model files: a NaN or infinite weight is refused as it is copied, naming the file, tensor and element",
          "[reliability]") {
  const testing::scratch_dir dir("model_files", "finite");
  const fs::path path = dir.path / "model.safetensors";
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    torch::Tensor w = torch::arange(12, torch::kFloat32).reshape({3, 4});
    w[1][2] = nan;
    w[2][3] = inf;  // after the NaN: the first is reported
    save_safetensors(path, {{"a.weight", torch::ones({5})}, {"w", w.to(dtype)}});
    CAPTURE(c10::toString(dtype));
    CHECK(error_of([&] { load_safetensors(path, model_weights); }) ==
          path.string() + ": tensor 'w' holds a non-finite value (nan) at element 6");
    w[1][2] = -inf;
    save_safetensors(path, {{"w", w.to(dtype)}});
    CHECK(error_of([&] { load_safetensors(path, model_weights); }) ==
          path.string() + ": tensor 'w' holds a non-finite value (-inf) at element 6");
    // Without the option the values load as they are.
    CHECK(std::isinf(load_safetensors(path).at("w")[1][2].item<float>()));
  }
  // F8_E4M3 (no infinities): byte 0x7F is NaN. Written by hand: LibTorch 1.13 has no float8 dtype.
  const std::string header = R"({"e":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(header.size());
  file += header + std::string("\x38\x7E\x7F", 3);
  std::ofstream(path, std::ios::binary) << file;
  CHECK(error_of([&] { load_safetensors(path, model_weights); }) ==
        path.string() + ": tensor 'e' holds a non-finite value (nan) at element 2");
  // A finite file loads exactly as without the check.
  const torch::Tensor finite = torch::randn({300, 70});  // 84 KB: more than one 64 KiB block
  save_safetensors(path, {{"w", finite}});
  CHECK(torch::equal(load_safetensors(path, model_weights).at("w"), finite));
}

TEST_CASE("model files: a sharded checkpoint's refusals name the shard", "[reliability]") {
  const testing::scratch_dir dir("model_files", "sharded");
  torch::Tensor bad = torch::zeros({4});
  bad[3] = std::numeric_limits<double>::quiet_NaN();
  save_safetensors(dir.path / "m-1.safetensors", {{"a", torch::ones({2})}});
  save_safetensors(dir.path / "m-2.safetensors", {{"b", bad}, {"c", torch::ones({2}, torch::kInt32)}});
  std::ofstream(dir.path / "m.safetensors.index.json")
      << R"({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-2.safetensors"}})";
  const fs::path index = dir.path / "m.safetensors.index.json";
  // The dtype of every tensor is checked before any is copied: 'c' is named although 'b' comes first.
  CHECK(error_of([&] { load_safetensors(index, model_weights); }) ==
        (dir.path / "m-2.safetensors").string() +
            ": tensor 'c' is I32: model weights must be F32, BF16, F16 or F8_E4M3");
  save_safetensors(dir.path / "m-2.safetensors", {{"b", bad}, {"c", torch::ones({2})}});
  CHECK(error_of([&] { load_safetensors(index, model_weights); }) ==
        (dir.path / "m-2.safetensors").string() + ": tensor 'b' holds a non-finite value (nan) at element 3");
}

TEST_CASE("model files: the autoencoder loaders refuse integer and NaN weights, naming the file", "[reliability]") {
  const testing::scratch_dir dir("model_files", "autoencoders");
  {
    flux_autoencoder model(flux_autoencoder_config::tiny());
    std::map<std::string, torch::Tensor> state = flux_autoencoder_state(model);
    const fs::path path = dir.path / "ae.safetensors";
    state["decoder.conv_in.bias"] = state["decoder.conv_in.bias"].to(torch::kInt32);
    save_safetensors(path, state);
    CHECK(error_of([&] { load_flux_autoencoder_weights(model, path); }) ==
          path.string() + ": tensor 'decoder.conv_in.bias' is I32: model weights must be F32, BF16, F16 or F8_E4M3");
    state["decoder.conv_in.bias"] = torch::zeros({state["decoder.conv_in.bias"].size(0)});
    state["decoder.conv_in.bias"][1] = std::numeric_limits<double>::infinity();
    save_safetensors(path, state);
    CHECK(error_of([&] { load_flux_autoencoder_weights(model, path); }) ==
          path.string() + ": tensor 'decoder.conv_in.bias' holds a non-finite value (inf) at element 1");
  }
  {
    wan_vae_decoder model(wan_vae_config::tiny());
    std::map<std::string, torch::Tensor> state = wan_vae_decoder_state(model);
    const fs::path path = dir.path / "Wan2.1_VAE.safetensors";
    const std::string name = state.begin()->first;
    state[name] = state[name].to(torch::kInt64);
    save_safetensors(path, state);
    CHECK(error_of([&] { load_wan_vae_decoder_weights(model, path); }) ==
          path.string() + ": tensor '" + name + "' is I64: model weights must be F32, BF16, F16 or F8_E4M3");
  }
}
