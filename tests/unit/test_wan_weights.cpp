// What `branchgrpo weights` needs to know Wan2.1 checkpoints without LibTorch (model_specs/wan/layout.hpp):
// infer_wan_config's worked examples and refusals; and the Wan checkpoints the weights CLI tests read
// (tests/CMakeLists.txt), written here into BRANCHGRPO_WAN_WEIGHTS_DIR as zero-filled BF16 tensors:
//   wan_official.safetensors, wan_diffusers.safetensors   every tensor of wan_config::tiny() in the layout
//   wan_damaged.safetensors     official, head.head.bias missing, head.modulation [2, 40], extra.weight added
//   wan_inferred.safetensors    official tensors of a size no preset has (dim 48, FFN 64, 3 blocks, 16 channels)
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/safetensors.hpp"

namespace {

using namespace branchgrpo;
namespace fs = std::filesystem;
using shape_map = std::map<std::string, std::vector<std::int64_t>>;

shape_map shapes_of(const wan_config& config, wan_layout layout) {
  shape_map out;
  for (const wan_tensor_spec& spec : wan_expected_tensors(config, layout)) out.emplace(spec.name, spec.shape);
  return out;
}

// The bench's size class of "no preset": 16 latent channels in and out, dim 48 (not a multiple of 128), 3 blocks.
wan_config odd_config() {
  return {.in_dim = 16,
          .out_dim = 16,
          .dim = 48,
          .ffn_dim = 64,
          .heads = 1,
          .layers = 3,
          .freq_dim = 32,
          .text_dim = 32,
          .text_len = 8};
}

TEST_CASE("infer_wan_config reads the sizes from the shapes (the doc's examples)") {
  CHECK(infer_wan_config(shapes_of(wan_config::t2v_14b(), wan_layout::official), wan_layout::official) ==
        wan_config::t2v_14b());
  CHECK(infer_wan_config(shapes_of(wan_config::t2v_1_3b(), wan_layout::diffusers), wan_layout::diffusers) ==
        wan_config::t2v_1_3b());
  // heads is not in the weights: dim 40 is no multiple of 128, so 1 head; text_len keeps the default.
  wan_config tiny = wan_config::tiny();
  tiny.heads = 1;
  tiny.text_len = wan_config{}.text_len;
  CHECK(infer_wan_config(shapes_of(wan_config::tiny(), wan_layout::diffusers), wan_layout::diffusers) == tiny);
  shape_map no_patch = shapes_of(wan_config::tiny(), wan_layout::official);
  no_patch.erase("patch_embedding.weight");
  CHECK_FALSE(infer_wan_config(no_patch, wan_layout::official).has_value());
}

TEST_CASE("infer_wan_config: the sizes of a config of no preset check clean against it") {
  const std::optional<wan_config> inferred =
      infer_wan_config(shapes_of(odd_config(), wan_layout::official), wan_layout::official);
  REQUIRE(inferred.has_value());
  CHECK(inferred->dim == 48);
  CHECK(inferred->layers == 3);
  CHECK(inferred->out_dim == 16);
  CHECK(check_wan_tensors(*inferred, wan_layout::official, shapes_of(odd_config(), wan_layout::official)).ok());
}

TEST_CASE("infer_wan_config refuses what no valid config has") {
  const shape_map good = shapes_of(wan_config::tiny(), wan_layout::official);
  SECTION("the other layout's names") { CHECK_FALSE(infer_wan_config(good, wan_layout::diffusers).has_value()); }
  SECTION("a head whose rows are no multiple of the patch volume") {
    shape_map shapes = good;
    shapes["head.head.weight"] = {13, 40};
    CHECK_FALSE(infer_wan_config(shapes, wan_layout::official).has_value());
  }
  SECTION("a tensor of another rank") {
    shape_map shapes = good;
    shapes["patch_embedding.weight"] = {40, 4, 2, 2};
    CHECK_FALSE(infer_wan_config(shapes, wan_layout::official).has_value());
  }
  SECTION("a patch side beyond the limit (checked before the patch volume is taken)") {
    shape_map shapes = good;
    shapes["patch_embedding.weight"] = {40, 4, 1, 1, std::int64_t{1} << 62};
    CHECK_FALSE(infer_wan_config(shapes, wan_layout::official).has_value());
  }
  SECTION("a block index beyond the depth limit, even one past int64") {
    shape_map shapes = good;
    shapes["blocks.5000.norm3.weight"] = {40};
    CHECK_FALSE(infer_wan_config(shapes, wan_layout::official).has_value());
    shapes.erase("blocks.5000.norm3.weight");
    shapes["blocks.99999999999999999999.norm3.weight"] = {40};  // not a number: ignored, as any stray name
    CHECK(infer_wan_config(shapes, wan_layout::official).has_value());
  }
  SECTION("an odd dim (no even head width)") {
    shape_map shapes = good;
    shapes["patch_embedding.weight"] = {41, 4, 1, 2, 2};
    CHECK_FALSE(infer_wan_config(shapes, wan_layout::official).has_value());
  }
}

// --- The CLI tests' checkpoints --------------------------------------------------------------------------------

const std::vector<std::byte> zeros(1 << 16);  // every tensor's (zero) bytes; the largest, time_projection.1.weight
                                              // of the odd config [288, 48], takes 27648

safetensors_entry entry(const std::string& name, const std::vector<std::int64_t>& shape) {
  std::size_t count = 2;  // BF16
  for (std::int64_t extent : shape) count *= static_cast<std::size_t>(extent);
  REQUIRE(count <= zeros.size());
  return {.name = name, .dtype = safetensors_dtype::bf16, .shape = shape, .bytes = {zeros.data(), count}};
}

std::vector<safetensors_entry> entries(const wan_config& config, wan_layout layout) {
  std::vector<safetensors_entry> out;
  for (const wan_tensor_spec& spec : wan_expected_tensors(config, layout)) out.push_back(entry(spec.name, spec.shape));
  return out;
}

shape_map read_shapes(const fs::path& path) {
  const safetensors_checkpoint checkpoint(path);
  shape_map out;
  for (const safetensors_tensor& tensor : checkpoint.tensors()) out.emplace(tensor.name, tensor.shape);
  return out;
}

TEST_CASE("writes the Wan checkpoints of the weights CLI tests, which read back as written") {
  const fs::path dir = BRANCHGRPO_WAN_WEIGHTS_DIR;
  fs::create_directories(dir);
  const wan_config tiny = wan_config::tiny();
  write_safetensors(dir / "wan_official.safetensors", entries(tiny, wan_layout::official),
                    std::map<std::string, std::string>{{"format", "pt"}});
  write_safetensors(dir / "wan_diffusers.safetensors", entries(tiny, wan_layout::diffusers));
  std::vector<safetensors_entry> damaged;
  for (const safetensors_entry& e : entries(tiny, wan_layout::official)) {
    if (e.name == "head.head.bias") continue;
    damaged.push_back(e.name == "head.modulation" ? entry(e.name, {2, 40}) : e);
  }
  damaged.push_back(entry("extra.weight", {1}));
  write_safetensors(dir / "wan_damaged.safetensors", damaged);
  write_safetensors(dir / "wan_inferred.safetensors", entries(odd_config(), wan_layout::official));

  const shape_map official = read_shapes(dir / "wan_official.safetensors");
  CHECK(official.size() == 69);  // 12 + 2 blocks x 27 + 3
  CHECK(check_wan_tensors(tiny, wan_layout::official, official).ok());
  CHECK(check_wan_tensors(tiny, wan_layout::diffusers, read_shapes(dir / "wan_diffusers.safetensors")).ok());
  const wan_key_report report =
      check_wan_tensors(tiny, wan_layout::official, read_shapes(dir / "wan_damaged.safetensors"));
  CHECK(report.missing == std::vector<std::string>{"head.head.bias"});
  CHECK(report.unexpected == std::vector<std::string>{"extra.weight"});
  CHECK(report.mismatched == std::vector<std::string>{"head.modulation [2, 40] (expected [1, 2, 40])"});
  CHECK(check_wan_tensors(odd_config(), wan_layout::official, read_shapes(dir / "wan_inferred.safetensors")).ok());
}

}  // namespace
