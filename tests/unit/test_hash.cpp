// XXH64 (core/hash.hpp): known values of the reference implementation (computed with python's xxhash package,
// an independent implementation) and the streaming interface in pieces of every size (whole-file digests:
// test_input_file).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "branchgrpo/core/hash.hpp"

using branchgrpo::hex_digest;
using branchgrpo::xxh64;
using branchgrpo::xxh64_digest;

namespace {
// 0, 1, ..., n - 1 (mod 256) as bytes.
std::string counting(std::size_t n) {
  std::string bytes(n, '\0');
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(i % 256);
  return bytes;
}
}  // namespace

TEST_CASE("xxh64 gives the reference implementation's values", "[hash][reliability]") {
  // The doc comment's examples.
  CHECK(xxh64_digest("") == 0xef46db3751d8e999ull);
  CHECK(xxh64_digest("a") == 0xd24ec4f1a98c6e5bull);
  CHECK(xxh64_digest("abc") == 0x44bc2cf5ad770999ull);
  CHECK(xxh64_digest("abc", 1) == 0xbea9ca8199328908ull);
  CHECK(xxh64_digest("", 1) == 0xd5afba1336a3be4bull);
  // Longer inputs take the four-lane path (>= 32 bytes) and every tail length (8-, 4- and 1-byte steps).
  CHECK(xxh64_digest("Nobody inspects the spammish repetition") == 0xfbcea83c8a378bf1ull);  // 39 bytes
  CHECK(xxh64_digest(counting(100)) == 0x6ac1e58032166597ull);
  CHECK(xxh64_digest(counting(100), 0x9E3779B185EBCA87ull) == 0x00278bda0ee3f586ull);
  CHECK(xxh64_digest(counting(1024)) == 0x6f3914f18fe4df57ull);
}

TEST_CASE("xxh64 streams: any split of the input gives the one-call value", "[hash][reliability]") {
  const std::string bytes = counting(1024);
  const std::uint64_t whole = xxh64_digest(bytes);
  for (const std::size_t piece : {1, 3, 7, 8, 31, 32, 33, 64, 100, 1000}) {
    xxh64 h;
    for (std::size_t at = 0; at < bytes.size(); at += piece) h.update(std::string_view(bytes).substr(at, piece));
    CHECK(h.digest() == whole);
  }
  xxh64 h;
  h.update("ab");
  CHECK(h.digest() == xxh64_digest("ab"));  // digest() does not consume the state
  h.update("c");
  CHECK(h.digest() == 0x44bc2cf5ad770999ull);
  // A single flipped bit changes the value.
  std::string flipped = bytes;
  flipped[500] = static_cast<char>(flipped[500] ^ 0x01);
  CHECK(xxh64_digest(flipped) != whole);
}

TEST_CASE("hex_digest", "[hash][reliability]") {
  CHECK(hex_digest(0x44bc2cf5ad770999ull) == "44bc2cf5ad770999");
  CHECK(hex_digest(0x00278bda0ee3f586ull) == "00278bda0ee3f586");
}
