// Safetensors <-> torch::Tensor (adapters/torch/branchgrpo/torch/safetensors.hpp): round trips of every dtype
// the format shares with LibTorch, bf16 loaded into float32, F8_E4M3 decoded, sharded loads, and errors.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace {

using namespace branchgrpo;
namespace fs = std::filesystem;

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("branchgrpo_test_safetensors_torch_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("torch round trip of every shared dtype, scalars, empty and non-contiguous tensors") {
  scratch_dir dir("round_trip");
  torch::manual_seed(7);
  const std::map<std::string, torch::Tensor> tensors = {
      {"f64", torch::randn({2, 3}, torch::kFloat64)},
      {"f32", torch::randn({4, 5})},
      {"f16", torch::randn({3}).to(torch::kFloat16)},
      {"bf16", torch::randn({2, 2, 2}).to(torch::kBFloat16)},
      {"i64", torch::arange(-3, 3, torch::kInt64)},
      {"i32", torch::arange(6, torch::kInt32).reshape({2, 3})},
      {"i16", torch::tensor({-300, 7}, torch::kInt16)},
      {"i8", torch::tensor({-128, 127}, torch::kInt8)},
      {"u8", torch::tensor({0, 255}, torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::empty({0, 3})},
      {"transposed", torch::arange(6, torch::kFloat32).reshape({2, 3}).t()},
  };
  const fs::path path = dir.path / "all.safetensors";
  save_safetensors(path, tensors, {{"format", "pt"}});
  const std::map<std::string, torch::Tensor> loaded = load_safetensors(path);
  REQUIRE(loaded.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    const torch::Tensor& back = loaded.at(name);
    CHECK(back.scalar_type() == tensor.scalar_type());
    CHECK(back.sizes() == tensor.sizes());
    CHECK(back.is_contiguous());
    CHECK(torch::equal(back, tensor));
  }
  CHECK(safetensors_checkpoint(path).metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  // The transposed tensor is written row-major in its logical order: [[0, 3], [1, 4], [2, 5]].
  CHECK(safetensors_to_float(safetensors_file(path).at("transposed")) == std::vector<float>{0, 3, 1, 4, 2, 5});
}

TEST_CASE("save_safetensors: the doc comment's example file") {
  scratch_dir dir("doc_example");
  save_safetensors(dir.path / "w.safetensors", {{"w", torch::ones({2, 2})}});
  CHECK(fs::file_size(dir.path / "w.safetensors") == 88);  // 8 + 64 + 16
  std::ifstream in(dir.path / "w.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(static_cast<int>(bytes[0]) == 64);
  CHECK(bytes.substr(8, 64) == std::string(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})") + "       ");
}

TEST_CASE("bf16 weights load into float32 exactly; the dtype option leaves integer tensors alone") {
  scratch_dir dir("bf16");
  // 1, -3.140625 and 2^-10 are exact in bfloat16 (at most 8 significant bits).
  const torch::Tensor values = torch::tensor({1.0f, -3.140625f, 0.0009765625f});
  save_safetensors(dir.path / "w.safetensors",
                   {{"w", values.to(torch::kBFloat16)}, {"index", torch::tensor({4, 5}, torch::kInt64)}});
  const auto loaded = load_safetensors(dir.path / "w.safetensors", {.dtype = torch::kFloat32});
  CHECK(loaded.at("w").scalar_type() == torch::kFloat32);
  CHECK(torch::equal(loaded.at("w"), values));
  CHECK(loaded.at("index").scalar_type() == torch::kInt64);
  const auto as_half = load_safetensors(dir.path / "w.safetensors", {.dtype = torch::kFloat16});
  CHECK(as_half.at("w").scalar_type() == torch::kFloat16);
  CHECK(torch::equal(as_half.at("w").to(torch::kFloat32), values));
  CHECK_THROWS_WITH(load_safetensors(dir.path / "w.safetensors", {.dtype = torch::kInt32}),
                    Catch::Contains("the load dtype must be a floating-point type, got Int"));
}

TEST_CASE("F8_E4M3 and odd BOOL bytes load through the exact host conversion") {
  scratch_dir dir("f8");
  const std::vector<std::uint8_t> f8 = {0x38, 0x7E, 0xC0, 0x01};  // 1, 448, -2, 2^-9
  const std::vector<std::uint8_t> flags = {0, 1, 2};              // any non-zero byte is true
  write_safetensors(
      dir.path / "f8.safetensors",
      std::vector<safetensors_entry>{
          {.name = "e", .dtype = safetensors_dtype::f8_e4m3, .shape = {2, 2}, .bytes = std::as_bytes(std::span(f8))},
          {.name = "b", .dtype = safetensors_dtype::boolean, .shape = {3}, .bytes = std::as_bytes(std::span(flags))}});
  const auto loaded = load_safetensors(dir.path / "f8.safetensors");
  CHECK(loaded.at("e").scalar_type() == torch::kFloat32);
  CHECK(torch::equal(loaded.at("e"), torch::tensor({1.0f, 448.0f, -2.0f, 0.001953125f}).reshape({2, 2})));
  CHECK(torch::equal(loaded.at("b"), torch::tensor({false, true, true})));
  const auto as_bf16 = load_safetensors(dir.path / "f8.safetensors", {.dtype = torch::kBFloat16});
  CHECK(as_bf16.at("e").scalar_type() == torch::kBFloat16);
  CHECK(as_bf16.at("e")[0][1].item<float>() == 448.0f);
}

TEST_CASE("sharded checkpoints load as one map") {
  scratch_dir dir("sharded");
  save_safetensors(dir.path / "m-1.safetensors", {{"a", torch::ones({2})}});
  save_safetensors(dir.path / "m-2.safetensors", {{"b", torch::zeros({3}, torch::kBFloat16)}});
  std::ofstream(dir.path / "m.safetensors.index.json")
      << R"({"metadata": {"total_size": 14}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})";
  const auto loaded = load_safetensors(dir.path / "m.safetensors.index.json", {.dtype = torch::kFloat32});
  REQUIRE(loaded.size() == 2);
  CHECK(torch::equal(loaded.at("a"), torch::ones({2})));
  CHECK(torch::equal(loaded.at("b"), torch::zeros({3})));
}

TEST_CASE("errors name the file and the tensor") {
  scratch_dir dir("errors");
  const fs::path path = dir.path / "bad.safetensors";
  CHECK_THROWS_WITH(save_safetensors(path, {{"z", torch::zeros({2}, torch::kComplexFloat)}}),
                    path.string() + ": tensor 'z': dtype ComplexFloat has no safetensors equivalent");
  CHECK_THROWS_WITH(save_safetensors(path, {{"u", torch::Tensor()}}), path.string() + ": tensor 'u': undefined tensor");
  CHECK_FALSE(fs::exists(path));
  std::ofstream(path, std::ios::binary) << std::string("\x08\0\0\0\0\0\0\0{\"a\":1} ", 16);
  CHECK_THROWS_WITH(load_safetensors(path), path.string() + ": tensor 'a': entry is an integer, not an object");
}
