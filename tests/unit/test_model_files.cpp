// Model files as the torch-free reader sees them (docs/reliability.md, "Model files"): the header's bounds on
// tensors and JSON values, refused as they are reached and naming the file, kept to by the writer too; the NaN /
// infinity search and the copy that runs it on the way. The last case writes the bad model directories and files
// that tests/reliability/model_files.cmake hands to the tool (its fixture).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors.hpp"
#include "safetensors_bytes.hpp"

namespace {

using namespace branchgrpo;
namespace fs = std::filesystem;

using testing::safetensors_bytes;
using testing::safetensors_rejection;

// `count` empty F32 tensors "t0", "t1", ... as header members, without the braces.
std::string empty_tensors(std::size_t count) {
  std::string out;
  for (std::size_t i = 0; i < count; ++i)
    out += (i == 0 ? "\"t" : ",\"t") + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  return out;
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& values) {
  return std::as_bytes(std::span(values));
}

safetensors_tensor tensor_of(safetensors_dtype dtype, std::span<const std::byte> bytes) {
  return {.name = "w",
          .dtype = dtype,
          .shape = {static_cast<std::int64_t>(bytes.size() / safetensors_dtype_size(dtype))},
          .data = bytes};
}

}  // namespace

TEST_CASE("model files: a header listing more than 2^17 tensors is refused at the limit, naming the file",
          "[reliability]") {
  // 1.65 million empty tensors (the issue's 100 MB header) parsed to 2 GB in 9 s; now reading stops at tensor
  // 2^17 + 1: the text after it is not even JSON, and that is not what the message says.
  CHECK(safetensors_max_tensors == 131072);
  const std::string over = "{" + empty_tensors(safetensors_max_tensors + 1) + ", this is not JSON";
  CHECK(safetensors_rejection(safetensors_bytes(over), "huge.safetensors") ==
        "huge.safetensors: header lists more than 131072 tensors, the most a file may hold");
  // __metadata__ is not a tensor: 2^17 tensors and metadata are accepted.
  const std::string at_limit = R"({"__metadata__":{"format":"pt"},)" + empty_tensors(safetensors_max_tensors) + "}";
  const safetensors_contents contents = parse_safetensors(safetensors_bytes(at_limit));
  CHECK(contents.tensors.size() == safetensors_max_tensors);
  CHECK(contents.metadata.at("format") == "pt");
}

TEST_CASE("model files: a header of more than 2^21 JSON values is refused as they are read", "[reliability]") {
  // A shape of 3 million zeros is 6 MB of text but 3 million parsed values (~300 MB): refused at value 2^21 + 1.
  std::string shape;
  for (std::size_t i = 0; i < 3'000'000; ++i) shape += i == 0 ? "0" : ",0";
  const std::string message =
      safetensors_rejection(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[)" + shape + "]}}"), "model.safetensors");
  CHECK(message.starts_with("model.safetensors: tensor 'w': bad header JSON at byte "));
  CHECK(message.ends_with(": more than 2097152 JSON values, the most a header may hold"));
  // A shard index's weight_map is bounded like a file's tensors.
  std::string weight_map;
  for (std::size_t i = 0; i <= safetensors_max_tensors; ++i)
    weight_map += (i == 0 ? "\"t" : ",\"t") + std::to_string(i) + "\":\"a.safetensors\"";
  CHECK_THROWS_WITH(parse_safetensors_index(R"({"weight_map":{)" + weight_map + "}}", "m.index.json"),
                    "m.index.json: 'weight_map' lists 131073 tensors, more than the 131072 a checkpoint may hold");
}

TEST_CASE("model files: the writer keeps to the reader's bounds", "[reliability]") {
  std::vector<safetensors_entry> entries(safetensors_max_tensors + 1);
  for (std::size_t i = 0; i < entries.size(); ++i)
    entries[i] = {.name = "t" + std::to_string(i), .shape = {0}, .bytes = {}};
  CHECK_THROWS_WITH(serialize_safetensors(entries), "<memory>: 131073 tensors exceed the limit of 131072");
  // One tensor of rank 2^21: 2^21 + 6 values.
  const std::vector<safetensors_entry> deep = {
      {.name = "w", .shape = std::vector<std::int64_t>(safetensors_max_header_values, 0), .bytes = {}}};
  CHECK_THROWS_WITH(serialize_safetensors(deep),
                    "<memory>: the header would hold 2097159 JSON values, more than the limit of 2097152");
  entries.pop_back();  // 2^17 tensors: written, and read back
  const std::vector<std::byte> file = serialize_safetensors(entries);
  CHECK(parse_safetensors(file).tensors.size() == safetensors_max_tensors);
}

TEST_CASE("model files: the first NaN or infinity of every floating-point dtype, none in integers", "[reliability]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> f32 = {1, 2, -inf, nan};
  auto found = safetensors_find_non_finite(safetensors_dtype::f32, bytes_of(f32));
  REQUIRE(found);
  CHECK(found->index == 2);
  CHECK(found->value == -inf);
  const std::vector<float> finite32 = {0, -0.0f, std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::denorm_min()};
  CHECK_FALSE(safetensors_find_non_finite(safetensors_dtype::f32, bytes_of(finite32)));
  const std::vector<double> f64 = {1e300, -1e-300, std::numeric_limits<double>::quiet_NaN()};
  found = safetensors_find_non_finite(safetensors_dtype::f64,
                                      bytes_of(f64));  // 1e300 is finite as stored, though not as a float
  REQUIRE(found);
  CHECK(found->index == 2);
  CHECK(std::isnan(found->value));
  // BF16: 0x7F7F is the largest finite value, 0xFF80 -inf, 0x7FC1 a NaN.
  const std::vector<std::uint16_t> bf16 = {0x3F80, 0x7F7F, 0xFF80, 0x7FC1};
  found = safetensors_find_non_finite(safetensors_dtype::bf16, bytes_of(bf16));
  REQUIRE(found);
  CHECK(found->index == 2);
  CHECK(found->value == -inf);
  CHECK(safetensors_find_non_finite(safetensors_dtype::bf16, bytes_of(std::vector<std::uint16_t>{0x7FC1}))->index == 0);
  // F16: 0x7BFF = 65504 is finite, 0x7C00 +inf, 0x7E00 NaN.
  found =
      safetensors_find_non_finite(safetensors_dtype::f16, bytes_of(std::vector<std::uint16_t>{0x7BFF, 0xFBFF, 0x7C00}));
  REQUIRE(found);
  CHECK(found->index == 2);
  CHECK(found->value == inf);
  CHECK(std::isnan(
      safetensors_find_non_finite(safetensors_dtype::f16, bytes_of(std::vector<std::uint16_t>{0x7E00}))->value));
  // F8_E4M3 has no infinities: 0x7E = 448 and 0xFE = -448 are finite, 0x7F and 0xFF NaN.
  CHECK_FALSE(safetensors_find_non_finite(safetensors_dtype::f8_e4m3,
                                          bytes_of(std::vector<std::uint8_t>{0x7E, 0xFE, 0x78, 0x00})));
  found = safetensors_find_non_finite(safetensors_dtype::f8_e4m3, bytes_of(std::vector<std::uint8_t>{0x7E, 0xFF}));
  REQUIRE(found);
  CHECK(found->index == 1);
  CHECK(std::isnan(found->value));
  // The same bits as integers are numbers.
  const std::vector<std::uint32_t> patterns = {0x7F800000u, 0x7FC00000u, 0xFFFFFFFFu};
  for (const safetensors_dtype dtype : {safetensors_dtype::i64, safetensors_dtype::i32, safetensors_dtype::i16,
                                        safetensors_dtype::i8, safetensors_dtype::u8, safetensors_dtype::boolean})
    CHECK_FALSE(safetensors_find_non_finite(dtype, bytes_of(patterns)));
}

TEST_CASE("model files: the checking copy copies every byte and finds a NaN in a later block", "[reliability]") {
  // 100000 floats (400 KB, 7 blocks of 64 KiB) one byte into a buffer: the data need not be aligned.
  std::vector<float> values(100'000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 7.0f;
  std::vector<std::byte> stored(1 + values.size() * sizeof(float));
  std::memcpy(stored.data() + 1, values.data(), values.size() * sizeof(float));
  const std::span<const std::byte> data = std::span<const std::byte>(stored).subspan(1);
  std::vector<std::byte> out(data.size());
  CHECK_FALSE(safetensors_copy_checking_finite(tensor_of(safetensors_dtype::f32, data), out));
  CHECK(std::memcmp(out.data(), data.data(), data.size()) == 0);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(stored.data() + 1 + 70'000 * sizeof(float), &nan, sizeof nan);
  std::memcpy(stored.data() + 1 + 90'000 * sizeof(float), &nan, sizeof nan);  // a later one is not reported
  const auto found = safetensors_copy_checking_finite(tensor_of(safetensors_dtype::f32, data), out);
  REQUIRE(found);
  CHECK(found->index == 70'000);
  CHECK(std::isnan(found->value));
  CHECK(std::memcmp(out.data(), data.data(), 70'000 * sizeof(float)) == 0);

  std::vector<std::byte> small(4);
  CHECK_THROWS_WITH(safetensors_copy_checking_finite(tensor_of(safetensors_dtype::f32, data), small),
                    "tensor 'w': 400000 bytes to copy into 4");
}

TEST_CASE("writes the bad model files of the model-file CLI tests", "[fixture]") {
  // BRANCHGRPO_MODEL_FILES_DIR/
  //   huge_count.safetensors       2^17 + 1 empty tensors
  //   i32/, nan/, both/            models/shapes-tiny with img_in.weight stored as I32 (the same bytes), with
  //                                element 5 of img_in.weight NaN, with a branchgrpo.wan_config entry added
  //   nul_prompt.safetensors       models/shapes-tiny's prompts with prompt 2 "a red\0circle" (a NUL byte)
  //   repeated_prompts.safetensors models/shapes-tiny's prompts with prompt 7 "a green circle", as prompt 3
  const fs::path dir = BRANCHGRPO_MODEL_FILES_DIR;
  const fs::path shipped = fs::path(BRANCHGRPO_MODELS_DIR) / "shapes-tiny";
  fs::create_directories(dir);
  {
    // The writer keeps to the limit, so the file is written by hand.
    const std::string header = "{" + empty_tensors(safetensors_max_tensors + 1) + "}";
    const std::vector<std::byte> bytes = safetensors_bytes(header);
    std::FILE* file = std::fopen((dir / "huge_count.safetensors").c_str(), "wb");
    REQUIRE(file != nullptr);
    CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size());
    CHECK(std::fclose(file) == 0);
  }
  CHECK_THROWS_WITH(
      safetensors_file(dir / "huge_count.safetensors"),
      (dir / "huge_count.safetensors").string() + ": header lists more than 131072 tensors, the most a file may hold");

  const safetensors_file model(shipped / "model.safetensors");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> poisoned(model.at("img_in.weight").data.begin(), model.at("img_in.weight").data.end());
  std::memcpy(poisoned.data() + 5 * sizeof(float), &nan, sizeof nan);
  for (const std::string variant : {"i32", "nan", "both"}) {
    std::vector<safetensors_entry> entries;
    for (const safetensors_tensor& t : model.tensors()) {
      safetensors_entry e{.name = t.name, .dtype = t.dtype, .shape = t.shape, .bytes = t.data};
      if (t.name == "img_in.weight" && variant == "i32") e.dtype = safetensors_dtype::i32;
      if (t.name == "img_in.weight" && variant == "nan") e.bytes = poisoned;
      entries.push_back(e);
    }
    std::map<std::string, std::string> metadata = model.metadata();
    if (variant == "both") metadata["branchgrpo.wan_config"] = "in_dim=3";
    fs::create_directories(dir / variant);
    write_safetensors(dir / variant / "model.safetensors", entries, metadata);
    fs::copy_file(shipped / "prompts.safetensors", dir / variant / "prompts.safetensors",
                  fs::copy_options::overwrite_existing);
    CHECK(safetensors_file(dir / variant / "model.safetensors").tensors().size() == model.tensors().size());
  }

  // The shipped prompt file with one prompt string changed (the features as they are).
  const safetensors_file prompts(shipped / "prompts.safetensors");
  const auto with_prompt = [&](const fs::path& path, std::size_t row, const std::string& text) {
    std::vector<safetensors_entry> entries;
    for (const safetensors_tensor& t : prompts.tensors())
      entries.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape, .bytes = t.data});
    std::map<std::string, std::string> metadata = prompts.metadata();
    std::vector<std::string> lines(1);
    for (const char c : metadata.at("prompts")) {
      if (c == '\n')
        lines.emplace_back();
      else
        lines.back().push_back(c);
    }
    REQUIRE(lines.size() == 12);
    lines.at(row) = text;
    std::string joined;
    for (std::size_t n = 0; n < lines.size(); ++n) joined += (n ? "\n" : "") + lines[n];
    metadata["prompts"] = joined;
    write_safetensors(path, entries, metadata);
    CHECK(safetensors_file(path).metadata().at("prompts") == joined);  // the NUL survives the JSON (\u0000)
  };
  with_prompt(dir / "nul_prompt.safetensors", 2, std::string("a red\0circle", 12));
  with_prompt(dir / "repeated_prompts.safetensors", 7, "a green circle");
}
