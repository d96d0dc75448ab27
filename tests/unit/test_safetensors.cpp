// The torch-free safetensors reader and writer (adapters/safetensors/branchgrpo/safetensors.hpp and the
// safetensors/*.hpp it includes): round trips, one test per kind of malformed file with its message, shard
// indexes, the JSON subset and the message text on their own, the exact float conversions, and the fuzzer's seed
// corpus replayed through the fuzzer's own checks.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/safetensors.hpp"
#include "safetensors_bytes.hpp"
#include "safetensors_fuzz_input.hpp"
#include "scratch_dir.hpp"

namespace {

using namespace branchgrpo;
namespace fs = std::filesystem;

std::vector<std::byte> to_bytes(std::string_view text) {
  std::vector<std::byte> out;
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  return out;
}

// A file from a header text (not padded) and `data_bytes` zero bytes of data (tests/support/safetensors_bytes.hpp).
std::vector<std::byte> make_file(std::string_view header, std::size_t data_bytes = 0) {
  return branchgrpo::testing::safetensors_bytes(header, data_bytes);
}

// The message parse_safetensors rejects `bytes` with ("" when it accepts them).
std::string rejection(const std::vector<std::byte>& bytes, std::string_view source = "model.safetensors") {
  return branchgrpo::testing::safetensors_rejection(bytes, source);
}

std::string index_rejection(std::string_view text) {
  try {
    parse_safetensors_index(text, "model.safetensors.index.json");
  } catch (const invalid_input& error) {
    return error.what();
  }
  return "";
}

using branchgrpo::testing::scratch_dir;  // tests/support/scratch_dir.hpp

void write_text(const fs::path& path, std::string_view text) { std::ofstream(path, std::ios::binary) << text; }

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& values) {
  return std::as_bytes(std::span(values));
}

}  // namespace

TEST_CASE("dtype names and sizes") {
  CHECK(safetensors_dtype_name(safetensors_dtype::bf16) == "BF16");
  CHECK(safetensors_dtype_name(safetensors_dtype::f8_e4m3) == "F8_E4M3");
  CHECK(safetensors_dtype_name(safetensors_dtype::boolean) == "BOOL");
  CHECK(safetensors_dtype_size(safetensors_dtype::f64) == 8);
  CHECK(safetensors_dtype_size(safetensors_dtype::i64) == 8);
  CHECK(safetensors_dtype_size(safetensors_dtype::f32) == 4);
  CHECK(safetensors_dtype_size(safetensors_dtype::bf16) == 2);
  CHECK(safetensors_dtype_size(safetensors_dtype::f8_e4m3) == 1);
  CHECK(safetensors_dtype_size(safetensors_dtype::boolean) == 1);
  for (safetensors_dtype dtype : safetensors_dtypes)
    CHECK(safetensors_dtype_from_name(safetensors_dtype_name(dtype)) == dtype);
  CHECK_FALSE(safetensors_dtype_from_name("f32").has_value());  // names are case-sensitive
  CHECK_FALSE(safetensors_dtype_from_name("F8_E5M2").has_value());
}

TEST_CASE("parse_safetensors: the doc comment's example") {
  // Length 56 = the 54-byte header + 2 spaces; then 8 data bytes (1.0f, 2.0f).
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(header.size() == 54);
  header += "  ";
  std::vector<std::byte> file = make_file(header);
  const std::vector<float> values = {1.0f, 2.0f};
  for (std::byte b : bytes_of(values)) file.push_back(b);
  REQUIRE(file.size() == 8 + 56 + 8);
  CHECK(static_cast<int>(file[0]) == 56);
  const safetensors_contents contents = parse_safetensors(file);
  REQUIRE(contents.tensors.size() == 1);
  CHECK(contents.tensors[0].name == "a");
  CHECK(contents.tensors[0].dtype == safetensors_dtype::f32);
  CHECK(contents.tensors[0].shape == std::vector<std::int64_t>{2});
  CHECK(contents.tensors[0].data.data() == file.data() + 64);
  CHECK(contents.tensors[0].data.size() == 8);
  CHECK(safetensors_to_float(contents.tensors[0]) == values);
  CHECK(contents.metadata.empty());
}

TEST_CASE("serialize_safetensors: the doc comment's example, sorted names and padding") {
  const std::vector<float> b = {0.5f};
  const std::vector<std::uint8_t> a = {7, 9};
  const std::vector<safetensors_entry> entries = {
      {.name = "b", .dtype = safetensors_dtype::f32, .shape = {1}, .bytes = bytes_of(b)},
      {.name = "a", .dtype = safetensors_dtype::u8, .shape = {2}, .bytes = bytes_of(a)}};
  const std::vector<std::byte> file = serialize_safetensors(entries);
  REQUIRE(file.size() == 126);  // 8 + 112 + 2 + 4
  CHECK(static_cast<int>(file[0]) == 112);
  for (int i = 1; i < 8; ++i) CHECK(static_cast<int>(file[i]) == 0);
  const std::string header(reinterpret_cast<const char*>(file.data() + 8), 112);
  CHECK(header == R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})"
                  "      ");
  CHECK(static_cast<int>(file[120]) == 7);
  CHECK(static_cast<int>(file[121]) == 9);
  float read = 0;
  std::memcpy(&read, file.data() + 122, 4);
  CHECK(read == 0.5f);
}

TEST_CASE("round trip of every dtype, scalars, empty tensors and metadata, in memory and on disk") {
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<safetensors_entry> entries;
  for (safetensors_dtype dtype : safetensors_dtypes) {
    const std::size_t size = safetensors_dtype_size(dtype);
    std::vector<std::uint8_t> bytes(2 * 3 * size);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(31 * i + size);
    if (dtype == safetensors_dtype::boolean)
      for (auto& b : bytes) b &= 1;
    storage.push_back(std::move(bytes));
    entries.push_back({.name = "t_" + std::string(safetensors_dtype_name(dtype)),
                       .dtype = dtype,
                       .shape = {2, 3},
                       .bytes = std::as_bytes(std::span(storage.back()))});
  }
  const std::vector<float> scalar = {3.5f};
  entries.push_back({.name = "scalar", .dtype = safetensors_dtype::f32, .shape = {}, .bytes = bytes_of(scalar)});
  entries.push_back({.name = "empty", .dtype = safetensors_dtype::bf16, .shape = {4, 0}, .bytes = {}});
  entries.push_back(
      {.name = "quote\"back\\slash\nnewline é", .dtype = safetensors_dtype::u8, .shape = {0}, .bytes = {}});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "line\n\"two\" \x01 é"}};

  const auto check_contents = [&](std::span<const safetensors_tensor> tensors,
                                  const std::map<std::string, std::string>& read_metadata) {
    CHECK(read_metadata == metadata);
    REQUIRE(tensors.size() == entries.size());
    for (std::size_t i = 1; i < tensors.size(); ++i) CHECK(tensors[i - 1].name < tensors[i].name);
    for (const safetensors_entry& entry : entries) {
      const auto it = std::find_if(tensors.begin(), tensors.end(),
                                   [&](const safetensors_tensor& t) { return t.name == entry.name; });
      REQUIRE(it != tensors.end());
      CHECK(it->dtype == entry.dtype);
      CHECK(it->shape == entry.shape);
      CHECK(std::equal(it->data.begin(), it->data.end(), entry.bytes.begin(), entry.bytes.end()));
    }
  };

  const std::vector<std::byte> file = serialize_safetensors(entries, metadata);
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, file.data(), 8);
  CHECK(header_length % 8 == 0);
  const std::string header(reinterpret_cast<const char*>(file.data() + 8), header_length);
  CHECK(header.starts_with(R"({"__metadata__":{"format":"pt","note":"line\n\"two\" \u0001 é"},"empty":{"dtype":"BF16",)"
                           R"("shape":[4,0],"data_offsets":[0,0]},"quote\"back\\slash\nnewline é":{"dtype":"U8",)"));
  const safetensors_contents contents = parse_safetensors(file);
  check_contents(contents.tensors, contents.metadata);

  scratch_dir dir("safetensors", "round_trip");
  const fs::path path = dir.path / "all.safetensors";
  write_text(path, "an older file, replaced atomically");
  write_safetensors(path, entries, metadata);
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);  // no temporary left
  CHECK(fs::file_size(path) == file.size());
  safetensors_file opened(path);
  check_contents(opened.tensors(), opened.metadata());
  // Moving keeps the mapping, so the spans stay valid.
  safetensors_file moved = std::move(opened);
  check_contents(moved.tensors(), moved.metadata());
  CHECK(moved.at("scalar").numel() == 1);
  CHECK(moved.at("empty").numel() == 0);
  CHECK(moved.find("absent") == nullptr);
  CHECK_THROWS_WITH(moved.at("absent"), Catch::Contains("all.safetensors: no tensor 'absent'"));
  CHECK(safetensors_to_float(moved.at("scalar")) == std::vector<float>{3.5f});

  safetensors_checkpoint checkpoint(path);
  CHECK_FALSE(checkpoint.sharded());
  check_contents(checkpoint.tensors(), checkpoint.metadata());
}

TEST_CASE("write_safetensors rejects invalid entries") {
  const std::vector<float> four = {1, 2, 3, 4};
  const auto message = [](const std::vector<safetensors_entry>& entries) {
    try {
      serialize_safetensors(entries);
    } catch (const invalid_input& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(message({{.name = "w", .dtype = safetensors_dtype::f32, .shape = {2, 3}, .bytes = bytes_of(four)}}) ==
        "<memory>: tensor 'w': 16 bytes given but shape [2, 3] of F32 needs 24");
  CHECK(message({{.name = "w", .shape = {4}, .bytes = bytes_of(four)},
                 {.name = "w", .shape = {4}, .bytes = bytes_of(four)}}) ==
        "<memory>: tensor 'w' is given more than once");
  CHECK(message({{.name = "__metadata__", .shape = {4}, .bytes = bytes_of(four)}}) ==
        "<memory>: a tensor may not be called '__metadata__'");
  CHECK(message({{.name = "w", .shape = {-4}, .bytes = bytes_of(four)}}) ==
        "<memory>: tensor 'w': shape [-4] has a negative extent");
  CHECK(message({{.name = "bad\xff", .shape = {4}, .bytes = bytes_of(four)}}) ==
        "<memory>: tensor 'bad\xff': name is not valid UTF-8");
  scratch_dir dir("safetensors", "writer_errors");
  CHECK_THROWS_AS(
      write_safetensors(dir.path / "missing_dir" / "x.safetensors",
                        std::vector<safetensors_entry>{{.name = "w", .shape = {4}, .bytes = bytes_of(four)}}),
      std::system_error);
}

TEST_CASE("malformed files: header length") {
  CHECK(rejection(to_bytes(std::string_view("\x10\x00\x00\x00\x00", 5))) ==
        "model.safetensors: file is 5 bytes, shorter than the 8-byte header length");
  std::vector<std::byte> huge = make_file("{}");
  huge[0] = std::byte{0x01};  // 100000001 = 0x05F5E101
  huge[1] = std::byte{0xE1};
  huge[2] = std::byte{0xF5};
  huge[3] = std::byte{0x05};
  CHECK(rejection(huge) == "model.safetensors: header length 100000001 exceeds the limit of 100000000 bytes");
  std::vector<std::byte> past = make_file("{}");
  past[0] = std::byte{3};
  CHECK(rejection(past) ==
        "model.safetensors: header length 3 runs past the end of the file (2 bytes follow the length)");
  std::vector<std::byte> max = make_file("{}");
  for (int i = 0; i < 8; ++i) max[i] = std::byte{0xFF};
  CHECK(rejection(max) == "model.safetensors: header length 18446744073709551615 exceeds the limit of 100000000 bytes");
  CHECK(rejection(make_file("")) ==
        "model.safetensors: bad header JSON at byte 0: expected a value, found the end of the header");
}

TEST_CASE("malformed files: JSON") {
  CHECK(rejection(make_file(R"({"a":{"dtype":"F32",}})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 20: expected a string key, found character '}'");
  CHECK(rejection(make_file(R"({"a":{"dtype":"F32"})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 20: expected ',' or '}' in an object, found the end of "
        "the header");
  CHECK(rejection(make_file(R"([])")) == "model.safetensors: header is an array, not a JSON object");
  CHECK(rejection(make_file(R"({} x)")) ==
        "model.safetensors: bad header JSON at byte 3: unexpected character 'x' after the end of the top-level value");
  CHECK(rejection(make_file(R"({"a":true})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 5: 'true' is not allowed: only objects, arrays, "
        "strings and non-negative integers");
  CHECK(rejection(make_file(R"({"a":null})")).find("'null' is not allowed") != std::string::npos);
  CHECK(rejection(make_file(R"({"a":{"shape":[-1]}})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 15: negative number: only non-negative integers are "
        "allowed");
  CHECK(rejection(make_file(R"({"a":{"shape":[1.5]}})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 16: fraction or exponent: only non-negative "
        "integers are allowed");
  CHECK(rejection(make_file(R"({"a":{"shape":[1e3]}})")).find("fraction or exponent") != std::string::npos);
  CHECK(rejection(make_file(R"({"a":{"shape":[01]}})")).find("number with a leading zero") != std::string::npos);
  CHECK(rejection(make_file(R"({"a":{"shape":[18446744073709551616]}})")).find("integer larger than 2^64 - 1") !=
        std::string::npos);
  CHECK(rejection(make_file(R"({"\ud800":1})")) ==
        "model.safetensors: bad header JSON at byte 8: \\u escape is a high surrogate without its low half");
  CHECK(rejection(make_file(R"({"\udc00":1})")).find("lone low surrogate") != std::string::npos);
  CHECK(rejection(make_file(R"({"\x":1})")).find("unknown escape '\\character 'x''") != std::string::npos);
  CHECK(rejection(make_file(R"({"\u12G4":1})")).find("four hex digits") != std::string::npos);
  CHECK(rejection(make_file("{\"a\nb\":1}")).find("unescaped control character") != std::string::npos);
  CHECK(rejection(make_file("{\"\xC3\x28\":1}")).find("invalid UTF-8 in a string") != std::string::npos);
  CHECK(rejection(make_file("{\"\xE0\x80\x80\":1}")).find("invalid UTF-8") != std::string::npos);      // overlong
  CHECK(rejection(make_file("{\"\xED\xA0\x80\":1}")).find("invalid UTF-8") != std::string::npos);      // surrogate
  CHECK(rejection(make_file("{\"\xF4\x90\x80\x80\":1}")).find("invalid UTF-8") != std::string::npos);  // > U+10FFFF
  CHECK(rejection(make_file("{\"abc")).find("unterminated string") != std::string::npos);
  CHECK(rejection(make_file(std::string(100, '[') + std::string(100, ']'))).find("nesting deeper than 64 levels") !=
        std::string::npos);
  // A surrogate pair decodes to one 4-byte UTF-8 code point (U+1F600), named in later messages.
  CHECK(rejection(make_file(R"({"\ud83d\ude00":1})")) ==
        "model.safetensors: tensor '\xF0\x9F\x98\x80': entry is an integer, not an object");
}

TEST_CASE("json.hpp: the subset's values in file order, every escape decoded, the writer's escaping read back") {
  using safetensors_detail::json_parser;
  using safetensors_detail::json_value;
  const auto parse = [](std::string_view text) { return json_parser(text, "t", "key", "index").parse_document(); };
  const json_value root = parse(
      " {\"z\": [0, 18446744073709551615, \"s\", {}, []],\r\n\t\"a\": "
      R"("\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00\u0000"} )");
  REQUIRE(root.type == json_value::kind::object);
  CHECK(root.keys == std::vector<std::string>{"z", "a"});  // file order, not sorted
  REQUIRE(root.items.size() == 2);
  const json_value& z = root.items[0];
  REQUIRE(z.type == json_value::kind::array);
  REQUIRE(z.items.size() == 5);
  CHECK(z.items[0].integer == 0);
  CHECK(z.items[1].integer == std::numeric_limits<std::uint64_t>::max());
  CHECK(z.items[1].kind_name() == "an integer");
  CHECK(z.items[2].string == "s");
  CHECK(z.items[3].kind_name() == "an object");
  CHECK(z.items[4].kind_name() == "an array");
  CHECK(root.items[1].string == std::string("\"\\/\b\f\n\r\t\xC3\xA9\xF0\x9F\x98\x80\0", 15));
  // Exactly 64 levels of nesting are fine; the 65th is refused at its bracket.
  CHECK(parse(std::string(64, '[') + std::string(64, ']')).type == json_value::kind::array);
  CHECK_THROWS_WITH(parse(std::string(65, '[') + std::string(65, ']')),
                    "t: bad index JSON at byte 64: nesting deeper than 64 levels");
  // Every control character, quote and backslash written by the writer reads back unchanged.
  std::string all;
  for (int c = 1; c < 0x20; ++c) all += static_cast<char>(c);
  all += "\"\\/ plain \xC3\xA9";
  std::string written;
  safetensors_detail::append_json_string(written, all);
  CHECK(written.find('\n') == std::string::npos);
  CHECK(parse(written).string == all);
}

TEST_CASE("text.hpp: names quoted for one-line messages, shapes, strict UTF-8") {
  using safetensors_detail::printable;
  using safetensors_detail::valid_utf8;
  CHECK(safetensors_detail::quote_name("a'b\\c\x7F\x01") == "'a\\'b\\\\c\\x7f\\x01'");
  CHECK(printable("\xC3\xA9") == "\xC3\xA9");  // UTF-8 stays as it is
  CHECK(printable(std::string(121, 'x')) == std::string(120, 'x') + "...");
  CHECK(printable(std::string(120, 'x')) == std::string(120, 'x'));
  CHECK(safetensors_detail::shape_text(std::vector<std::int64_t>{}) == "[]");
  CHECK(safetensors_detail::shape_text(std::vector<std::int64_t>{3072, 64}) == "[3072, 64]");
  CHECK(valid_utf8(""));
  CHECK(valid_utf8("\xC2\x80"));                // U+0080, the smallest 2-byte form
  CHECK(valid_utf8("\xED\x9F\xBF"));            // U+D7FF, just below the surrogates
  CHECK(valid_utf8("\xEF\xBF\xBF"));            // U+FFFF
  CHECK(valid_utf8("\xF4\x8F\xBF\xBF"));        // U+10FFFF, the largest code point
  CHECK_FALSE(valid_utf8("\xC0\x80"));          // overlong NUL
  CHECK_FALSE(valid_utf8("\xF0\x8F\xBF\xBF"));  // overlong U+FFFF
  CHECK_FALSE(valid_utf8("\xED\xBF\xBF"));      // a low surrogate
  CHECK_FALSE(valid_utf8("\xE2\x82"));          // cut short
  CHECK_FALSE(valid_utf8("\x80"));              // a lone continuation byte
  CHECK_FALSE(valid_utf8("\xF5\x80\x80\x80"));  // no such lead byte
  std::string encoded;
  for (std::uint32_t code_point : {0x24u, 0xA2u, 0x20ACu, 0x10348u})
    safetensors_detail::append_utf8(encoded, code_point);
  CHECK(encoded == "$\xC2\xA2\xE2\x82\xAC\xF0\x90\x8D\x88");
}

TEST_CASE("malformed files: duplicate names and keys") {
  const std::string tensor = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  CHECK(rejection(make_file(R"({"a":)" + tensor + R"(,"a":)" + tensor + "}", 1)) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 53: duplicate key 'a'");
  CHECK(rejection(make_file(R"({"a":{"dtype":"U8","dtype":"U8"}})")) ==
        "model.safetensors: tensor 'a': bad header JSON at byte 19: duplicate key 'dtype'");
}

TEST_CASE("malformed files: tensor entries") {
  const auto file = [](std::string_view entry, std::size_t data = 0) {
    return make_file(R"({"img_in.weight":)" + std::string(entry) + "}", data);
  };
  const std::string prefix = "model.safetensors: tensor 'img_in.weight': ";
  CHECK(rejection(file(R"({"dtype":"F12","shape":[1],"data_offsets":[0,4]})", 4)) ==
        prefix + "unknown dtype 'F12' (known: F64, F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL)");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,12]})", 12)) ==
        prefix + "data_offsets [0, 12] hold 12 bytes but shape [2, 2] of F32 needs 16");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", 8)) ==
        prefix + "data_offsets [0, 16] end past the data buffer of 8 bytes");
  CHECK(rejection(file(R"({"dtype":"U8","shape":[0],"data_offsets":[9,9]})", 8)) ==
        prefix + "data_offsets [9, 9] end past the data buffer of 8 bytes");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", 8)) ==
        prefix + "data_offsets [8, 4] end before they begin");
  CHECK(rejection(file(R"({"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]})")) ==
        prefix + "shape [4294967296, 4294967296] of F64 needs more than 2^64 bytes");
  CHECK(rejection(file(R"({"dtype":"F64","shape":[9223372036854775808],"data_offsets":[0,0]})")) ==
        prefix + "shape entry 0 = 9223372036854775808 exceeds 2^63 - 1");
  // A zero extent makes the product 0 however large the others are.
  CHECK(rejection(file(R"({"dtype":"F64","shape":[4294967296,4294967296,0],"data_offsets":[0,0]})")).empty());
  CHECK(rejection(file(R"({"shape":[1],"data_offsets":[0,4]})", 4)) == prefix + "missing 'dtype'");
  CHECK(rejection(file(R"({"dtype":"F32","data_offsets":[0,4]})", 4)) == prefix + "missing 'shape'");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[1]})", 4)) == prefix + "missing 'data_offsets'");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]})", 4)) ==
        prefix + "unexpected key 'stride' (expected dtype, shape and data_offsets)");
  CHECK(rejection(file(R"({"dtype":32,"shape":[1],"data_offsets":[0,4]})", 4)) ==
        prefix + "dtype is an integer, not a string");
  CHECK(rejection(file(R"({"dtype":"F32","shape":1,"data_offsets":[0,4]})", 4)) ==
        prefix + "shape is an integer, not an array");
  CHECK(rejection(file(R"({"dtype":"F32","shape":["1"],"data_offsets":[0,4]})", 4)) ==
        prefix + "shape entry 0 is a string, not an integer");
  CHECK(rejection(file(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4,8]})", 4)) ==
        prefix + "data_offsets must be an array of two integers [begin, end]");
  CHECK(rejection(file(R"([1])")) == prefix + "entry is an array, not an object");
}

TEST_CASE("malformed files: ranges must tile the data buffer") {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK(rejection(make_file("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)) ==
        "model.safetensors: tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
  CHECK(rejection(make_file("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)) ==
        "model.safetensors: tensor 'b': data_offsets [0, 8] overlap tensor 'a' at [0, 8]");
  CHECK(rejection(make_file("{" + a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16)) ==
        "model.safetensors: tensor 'b': data_offsets [12, 16] leave a gap of 4 bytes after tensor 'a'");
  CHECK(rejection(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)) ==
        "model.safetensors: tensor 'a': data_offsets [4, 8] leave a gap of 4 bytes after the start of the data buffer");
  CHECK(rejection(make_file("{" + a + "}", 10)) ==
        "model.safetensors: tensor 'a': the data buffer holds 10 bytes but the tensors end at 8 (2 trailing bytes)");
  CHECK(rejection(make_file("{}", 3)) == "model.safetensors: the header lists no tensors but 3 data bytes follow it");
  // Order in the header does not matter, only the offsets; an empty tensor may sit between two others.
  CHECK(rejection(make_file(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                            R"("z":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},)" +
                                a + "}",
                            12))
            .empty());
}

TEST_CASE("malformed files: metadata") {
  CHECK(rejection(make_file(R"({"__metadata__":{"k":1}})")) ==
        "model.safetensors: __metadata__ value of 'k' is an integer, not a string");
  CHECK(rejection(make_file(R"({"__metadata__":{"k":{"nested":"x"}}})")) ==
        "model.safetensors: __metadata__ value of 'k' is an object, not a string");
  CHECK(rejection(make_file(R"({"__metadata__":["x"]})")) ==
        "model.safetensors: __metadata__ is an array, not an object");
  CHECK(rejection(make_file(R"({"__metadata__":{"k":tru}})")) ==
        "model.safetensors: __metadata__: bad header JSON at byte 21: expected a value, found character 't'");
  const safetensors_contents contents = parse_safetensors(make_file(R"({"__metadata__":{"k":"v","e":""}})"));
  CHECK(contents.metadata == std::map<std::string, std::string>{{"e", ""}, {"k", "v"}});
}

TEST_CASE("messages stay on one line and quote hostile names") {
  const std::string message = rejection(make_file(R"({"a\nb'c":{"dtype":"X","shape":[],"data_offsets":[0,0]}})"));
  CHECK(message ==
        "model.safetensors: tensor 'a\\x0ab\\'c': unknown dtype 'X' (known: F64, F32, F16, BF16, F8_E4M3, "
        "I64, I32, I16, I8, U8, BOOL)");
  const std::string long_name(500, 'n');
  const std::string long_message =
      rejection(make_file(R"({")" + long_name + R"(":{"dtype":"X","shape":[],"data_offsets":[0,0]}})"));
  CHECK(long_message.find(std::string(120, 'n') + "...'") != std::string::npos);
  CHECK(long_message.size() < 300);
}

TEST_CASE("shard index parsing") {
  const safetensors_index index = parse_safetensors_index(
      R"({"metadata": {"total_size": 24, "format": "pt"}, "weight_map": {"a": "m-1.safetensors", "b": "sub/m-2.safetensors"}})");
  CHECK(index.metadata == std::map<std::string, std::string>{{"format", "pt"}, {"total_size", "24"}});
  CHECK(index.weight_map == std::map<std::string, std::string>{{"a", "m-1.safetensors"}, {"b", "sub/m-2.safetensors"}});
  CHECK(index_rejection(R"({"metadata": {}})") == "model.safetensors.index.json: missing 'weight_map'");
  CHECK(index_rejection(R"({"weight_map": []})") ==
        "model.safetensors.index.json: 'weight_map' is an array, not an object");
  CHECK(index_rejection(R"({"weight_map": {"a": 3}})") ==
        "model.safetensors.index.json: tensor 'a': weight_map entry is an integer, not a file name");
  CHECK(index_rejection(R"({"weight_map": {"a": "/etc/passwd"}})") ==
        "model.safetensors.index.json: tensor 'a': shard file name '/etc/passwd' is not relative");
  CHECK(index_rejection(R"({"weight_map": {"a": "x/../../m.safetensors"}})") ==
        "model.safetensors.index.json: tensor 'a': shard file name 'x/../../m.safetensors' leaves the index's folder");
  CHECK(index_rejection(R"({"weight_map": {"a": ""}})") ==
        "model.safetensors.index.json: tensor 'a': shard file name '' is empty or holds a NUL byte");
  CHECK(index_rejection(R"({"weight_map": {"a": "m\u0000.safetensors"}})") ==
        "model.safetensors.index.json: tensor 'a': shard file name 'm\\x00.safetensors' is empty or holds a NUL byte");
  CHECK(index_rejection(R"({"weight_map": {}, "extra": 1})") ==
        "model.safetensors.index.json: unexpected key 'extra' (expected 'metadata' and 'weight_map')");
  CHECK(index_rejection(R"({"metadata": {"k": [1]}, "weight_map": {}})") ==
        "model.safetensors.index.json: metadata value of 'k' is an array, not a string");
  CHECK(index_rejection(R"({"weight_map": {"a": "x", "a": "y"}})") ==
        "model.safetensors.index.json: key 'weight_map': bad index JSON at byte 26: duplicate key 'a'");
  CHECK(index_rejection("\xFF") == "model.safetensors.index.json: index is not valid UTF-8");
}

TEST_CASE("sharded checkpoints: one merged view and errors naming the index and the shard") {
  scratch_dir dir("safetensors", "sharded");
  const std::vector<float> a = {1, 2}, b = {3}, c = {4, 5, 6};
  write_safetensors(dir.path / "m-1.safetensors",
                    std::vector<safetensors_entry>{{.name = "a", .shape = {2}, .bytes = bytes_of(a)},
                                                   {.name = "c", .shape = {3}, .bytes = bytes_of(c)}},
                    {{"format", "pt"}});
  write_safetensors(dir.path / "m-2.safetensors",
                    std::vector<safetensors_entry>{{.name = "b", .shape = {1}, .bytes = bytes_of(b)}});
  const fs::path index = dir.path / "model.safetensors.index.json";
  write_text(index, R"({"metadata": {"total_size": 24},
                        "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-1.safetensors"}})");
  {
    const safetensors_checkpoint checkpoint(index);
    CHECK(checkpoint.sharded());
    CHECK(checkpoint.files().size() == 2);
    CHECK(checkpoint.metadata() == std::map<std::string, std::string>{{"total_size", "24"}});
    REQUIRE(checkpoint.tensors().size() == 3);
    CHECK(checkpoint.tensors()[0].name == "a");
    CHECK(checkpoint.tensors()[1].name == "b");
    CHECK(checkpoint.tensors()[2].name == "c");
    CHECK(safetensors_to_float(checkpoint.at("b")) == b);
    CHECK(safetensors_to_float(checkpoint.at("c")) == c);
    const safetensors_checkpoint moved = std::move(const_cast<safetensors_checkpoint&>(checkpoint));
    CHECK(safetensors_to_float(moved.at("a")) == a);
  }
  const std::string source = index.string();
  const auto message = [&](std::string_view text) {
    write_text(index, text);
    try {
      safetensors_checkpoint checkpoint(index);
    } catch (const invalid_input& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(message(R"({"weight_map": {"a": "m-1.safetensors", "b": "m-1.safetensors", "c": "m-1.safetensors"}})") ==
        source + ": tensor 'b' is mapped to shard 'm-1.safetensors', which does not hold it");
  CHECK(message(R"({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})") ==
        source + ": shard 'm-1.safetensors' holds tensor 'c', which the weight_map does not list");
  CHECK(message(R"({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-3.safetensors"}})")
            .starts_with(source + ": shard 'm-3.safetensors': " + (dir.path / "m-3.safetensors").string() +
                         ": cannot open the safetensors file: "));
  const std::vector<std::byte> broken = make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4);
  std::ofstream(dir.path / "m-3.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(broken.data()), static_cast<std::streamsize>(broken.size()));
  CHECK(message(R"({"weight_map": {"x": "m-3.safetensors"}})") ==
        source + ": shard 'm-3.safetensors': " + (dir.path / "m-3.safetensors").string() +
            ": tensor 'x': data_offsets [0, 4] hold 4 bytes but shape [2] of F32 needs 8");
  CHECK(message(R"({"weight_map": {"a": 1}})") ==
        source + ": tensor 'a': weight_map entry is an integer, not a file name");
  CHECK(message("{") == source + ": bad index JSON at byte 1: expected a string key, found the end of the index");
}

TEST_CASE("opening files that are not there or are not safetensors") {
  scratch_dir dir("safetensors", "open_errors");
  CHECK_THROWS_WITH(
      safetensors_file(dir.path / "absent.safetensors"),
      (dir.path / "absent.safetensors").string() + ": cannot open the safetensors file: No such file or directory");
  CHECK_THROWS_WITH(safetensors_file(dir.path), dir.path.string() + ": is a directory, not a safetensors file");
  write_text(dir.path / "empty.safetensors", "");
  CHECK_THROWS_WITH(
      safetensors_file(dir.path / "empty.safetensors"),
      (dir.path / "empty.safetensors").string() + ": file is 0 bytes, shorter than the 8-byte header length");
}

TEST_CASE("bf16 to float: the upper 16 bits of a float32") {
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(bf16_to_float(0xC049) == -3.140625f);  // sign, exponent 128, mantissa 0x49 << 16: -(1 + 73/128) * 2
  CHECK(bf16_to_float(0x0000) == 0.0f);
  CHECK(std::signbit(bf16_to_float(0x8000)));
  CHECK(bf16_to_float(0x7F80) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(bf16_to_float(0x7FC0)));
  CHECK(bf16_to_float(0x0001) == std::bit_cast<float>(0x00010000u));  // a float subnormal, kept exactly
}

TEST_CASE("f16 to float: exact, with subnormals, infinities and NaN") {
  CHECK(f16_to_float(0x3C00) == 1.0f);
  CHECK(f16_to_float(0xC000) == -2.0f);
  CHECK(f16_to_float(0x3555) == 0.333251953125f);           // (1 + 0x155/1024) * 2^-2 = 1365/4096
  CHECK(f16_to_float(0x7BFF) == 65504.0f);                  // (2 - 2^-10) * 2^15, the largest half
  CHECK(f16_to_float(0x0400) == std::ldexp(1.0f, -14));     // the smallest normal
  CHECK(f16_to_float(0x0001) == std::ldexp(1.0f, -24));     // the smallest subnormal
  CHECK(f16_to_float(0x03FF) == std::ldexp(1023.0f, -24));  // the largest subnormal
  CHECK(f16_to_float(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(f16_to_float(0x0000) == 0.0f);
  CHECK(std::signbit(f16_to_float(0x8000)));
  CHECK(f16_to_float(0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(f16_to_float(0xFC00) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(f16_to_float(0x7E00)));
  CHECK(std::isnan(f16_to_float(0x7C01)));  // a signalling NaN stays a NaN, not an infinity
  // Every finite half is reproduced by (-1)^s * 2^(e-15) * (1 + m/1024), or 2^-14 * m/1024 for e = 0.
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const std::uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    if (e == 0x1F) continue;
    const float magnitude = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                                   : std::ldexp(1.0f + static_cast<float>(m) / 1024.0f, static_cast<int>(e) - 15);
    REQUIRE(f16_to_float(static_cast<std::uint16_t>(bits)) == ((bits & 0x8000) ? -magnitude : magnitude));
  }
}

TEST_CASE("f8 e4m3fn to float: no infinities, one NaN per sign, max 448") {
  CHECK(f8_e4m3_to_float(0x38) == 1.0f);    // exponent 7 = the bias
  CHECK(f8_e4m3_to_float(0x3C) == 1.5f);    // mantissa 4/8
  CHECK(f8_e4m3_to_float(0xC0) == -2.0f);   // sign, exponent 8
  CHECK(f8_e4m3_to_float(0x7E) == 448.0f);  // 1.75 * 2^8
  CHECK(f8_e4m3_to_float(0xFE) == -448.0f);
  CHECK(f8_e4m3_to_float(0x78) == 256.0f);                // exponent 15 with mantissa < 7 is finite
  CHECK(f8_e4m3_to_float(0x08) == std::ldexp(1.0f, -6));  // the smallest normal
  CHECK(f8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));  // the smallest subnormal: 1/8 * 2^-6
  CHECK(f8_e4m3_to_float(0x07) == std::ldexp(7.0f, -9));
  CHECK(f8_e4m3_to_float(0x00) == 0.0f);
  CHECK(std::signbit(f8_e4m3_to_float(0x80)));
  CHECK(std::isnan(f8_e4m3_to_float(0x7F)));
  CHECK(std::isnan(f8_e4m3_to_float(0xFF)));
  int nans = 0;
  float previous = -1;
  for (int bits = 0; bits < 0x80; ++bits) {  // positive codes increase strictly up to 448
    const float value = f8_e4m3_to_float(static_cast<std::uint8_t>(bits));
    if (std::isnan(value)) {
      ++nans;
      continue;
    }
    CHECK(std::isfinite(value));
    CHECK(value > previous);
    previous = value;
    CHECK(f8_e4m3_to_float(static_cast<std::uint8_t>(bits | 0x80)) == -value);
  }
  CHECK(nans == 1);
  CHECK(previous == 448.0f);
}

TEST_CASE("safetensors_to_float reads every dtype, aligned or not") {
  // The doc example: BF16 bytes {0x80, 0x3F, 0x49, 0xC0} -> {1, -3.140625}.
  const std::vector<std::uint8_t> bf16 = {0x80, 0x3F, 0x49, 0xC0};
  const safetensors_tensor doc{
      .name = "t", .dtype = safetensors_dtype::bf16, .shape = {2}, .data = std::as_bytes(std::span(bf16))};
  CHECK(safetensors_to_float(doc) == std::vector<float>{1.0f, -3.140625f});
  // Odd offset: F32 data one byte into a buffer.
  std::vector<std::uint8_t> unaligned(1 + 8);
  const float values[2] = {-1.25f, 6.0f};
  std::memcpy(unaligned.data() + 1, values, 8);
  const safetensors_tensor shifted{.name = "u",
                                   .dtype = safetensors_dtype::f32,
                                   .shape = {2},
                                   .data = std::as_bytes(std::span(unaligned)).subspan(1)};
  CHECK(safetensors_to_float(shifted) == std::vector<float>{-1.25f, 6.0f});
  const std::vector<std::uint8_t> f16 = {0x00, 0x3C, 0x00, 0xC0};
  CHECK(safetensors_to_float(
            {.name = "h", .dtype = safetensors_dtype::f16, .shape = {2}, .data = std::as_bytes(std::span(f16))}) ==
        std::vector<float>{1.0f, -2.0f});
  const std::vector<std::uint8_t> f8 = {0x38, 0x7E, 0xC0};
  CHECK(safetensors_to_float(
            {.name = "e", .dtype = safetensors_dtype::f8_e4m3, .shape = {3}, .data = std::as_bytes(std::span(f8))}) ==
        std::vector<float>{1.0f, 448.0f, -2.0f});
  const std::vector<std::int16_t> i16 = {-300, 7};
  CHECK(safetensors_to_float(
            {.name = "i", .dtype = safetensors_dtype::i16, .shape = {2}, .data = std::as_bytes(std::span(i16))}) ==
        std::vector<float>{-300.0f, 7.0f});
  const std::vector<double> f64 = {0.1, -2.5};
  CHECK(safetensors_to_float(
            {.name = "d", .dtype = safetensors_dtype::f64, .shape = {2}, .data = std::as_bytes(std::span(f64))}) ==
        std::vector<float>{0.1f, -2.5f});
  const std::vector<std::uint8_t> flags = {0, 1, 2};
  CHECK(
      safetensors_to_float(
          {.name = "b", .dtype = safetensors_dtype::boolean, .shape = {3}, .data = std::as_bytes(std::span(flags))}) ==
      std::vector<float>{0.0f, 1.0f, 1.0f});
  std::vector<float> wrong(3);
  CHECK_THROWS_WITH(safetensors_to_float(doc, wrong), "tensor 't': 3 floats for 4 bytes of BF16");
}

TEST_CASE("the fuzzer's seed corpus replays without a crash; valid seeds parse, invalid ones are rejected") {
  const fs::path corpus = BRANCHGRPO_FUZZ_CORPUS;
  REQUIRE(fs::is_directory(corpus));
  int seeds = 0;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO("seed " << entry.path().filename().string());
    CHECK(branchgrpo::fuzz::fuzz_safetensors(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()) == 0);
    const std::string name = entry.path().filename().string();
    const std::vector<std::byte> bytes = to_bytes(text);
    if (name.starts_with("valid_")) CHECK(rejection(bytes) == "");
    if (name.starts_with("invalid_")) CHECK(rejection(bytes) != "");
    if (name.starts_with("index_valid")) CHECK(index_rejection(text) == "");
    if (name.starts_with("index_invalid")) CHECK(index_rejection(text) != "");
    ++seeds;
  }
  CHECK(seeds >= 20);
}
