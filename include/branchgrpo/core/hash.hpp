#pragma once
// XXH64: a fast 64-bit non-cryptographic hash (Yann Collet's xxHash, 64-bit variant), written here from the
// published algorithm description (xxhash.com, "xxHash fast digest algorithm", version 0.1.1). It detects
// accidental corruption (a flipped byte, a torn file) of checkpoints and identifies input files; it is no defence
// against a deliberate forgery.
//
//   xxh64_digest(bytes, seed)       one call over a whole buffer
//   xxh64 h(seed); h.update(a); h.update(b); h.digest()     the same value over a + b, in pieces of any size
//   hex_digest(value)               16 lower-case hex digits
// (A file's digest, read through the one input-file path: file_digest in <branchgrpo/files/input_file.hpp>.)
//
// Known values (the reference implementation agrees; tests/unit/test_hash.cpp checks each):
//   xxh64_digest("", 0)    == 0xef46db3751d8e999
//   xxh64_digest("a", 0)   == 0xd24ec4f1a98c6e5b
//   xxh64_digest("abc", 0) == 0x44bc2cf5ad770999
//   xxh64_digest("abc", 1) == 0xbea9ca8199328908
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace branchgrpo {

namespace detail {
inline constexpr std::uint64_t xxh_prime1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t xxh_prime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t xxh_prime3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t xxh_prime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t xxh_prime5 = 0x27D4EB2F165667C5ull;

constexpr std::uint64_t xxh_rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads, whatever the machine's byte order (the hash is defined on little-endian lanes).
inline std::uint64_t xxh_read64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t xxh_read32(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

constexpr std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * xxh_prime2;
  acc = xxh_rotl(acc, 31);
  return acc * xxh_prime1;
}
constexpr std::uint64_t xxh_merge(std::uint64_t acc, std::uint64_t v) {
  acc ^= xxh_round(0, v);
  return acc * xxh_prime1 + xxh_prime4;
}
}  // namespace detail

/// Streaming XXH64: update() with the bytes in any number of pieces, digest() at any time (it does not consume the
/// state). Example: xxh64 h; h.update("ab"); h.update("c"); h.digest() == 0x44bc2cf5ad770999 == xxh64_digest("abc").
/// @post digest() equals xxh64_digest of the concatenation of every update's bytes, with the same seed.
class xxh64 {
 public:
  explicit xxh64(std::uint64_t seed = 0)
      : seed_(seed),
        v_{seed + detail::xxh_prime1 + detail::xxh_prime2, seed + detail::xxh_prime2, seed, seed - detail::xxh_prime1} {
  }

  /// Adds `size` bytes at `data`.
  void update(const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += size;
    if (buffered_ > 0) {  // complete the pending stripe first
      const std::size_t take = std::min(size, buffer_.size() - buffered_);
      std::memcpy(buffer_.data() + buffered_, p, take);
      buffered_ += take;
      p += take;
      size -= take;
      if (buffered_ < buffer_.size()) return;
      stripe(buffer_.data());
      buffered_ = 0;
    }
    for (; size >= 32; p += 32, size -= 32) stripe(p);
    std::memcpy(buffer_.data(), p, size);
    buffered_ = size;
  }
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }

  /// The hash of everything added so far.
  [[nodiscard]] std::uint64_t digest() const {
    using namespace detail;
    std::uint64_t acc = 0;
    if (total_ >= 32) {
      acc = xxh_rotl(v_[0], 1) + xxh_rotl(v_[1], 7) + xxh_rotl(v_[2], 12) + xxh_rotl(v_[3], 18);
      for (const std::uint64_t v : v_) acc = xxh_merge(acc, v);
    } else {
      acc = seed_ + xxh_prime5;
    }
    acc += total_;
    const unsigned char* p = buffer_.data();
    std::size_t left = buffered_;
    for (; left >= 8; p += 8, left -= 8)
      acc = xxh_rotl(acc ^ xxh_round(0, xxh_read64(p)), 27) * xxh_prime1 + xxh_prime4;
    if (left >= 4) {
      acc = xxh_rotl(acc ^ (xxh_read32(p) * xxh_prime1), 23) * xxh_prime2 + xxh_prime3;
      p += 4;
      left -= 4;
    }
    for (; left > 0; ++p, --left) acc = xxh_rotl(acc ^ (*p * xxh_prime5), 11) * xxh_prime1;
    acc ^= acc >> 33;
    acc *= xxh_prime2;
    acc ^= acc >> 29;
    acc *= xxh_prime3;
    acc ^= acc >> 32;
    return acc;
  }

 private:
  void stripe(const unsigned char* p) {
    for (int lane = 0; lane < 4; ++lane) v_[lane] = detail::xxh_round(v_[lane], detail::xxh_read64(p + 8 * lane));
  }

  std::uint64_t seed_;
  std::array<std::uint64_t, 4> v_;
  std::array<unsigned char, 32> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_ = 0;
};

/// XXH64 of `bytes` with `seed`. Example: xxh64_digest("abc") == 0x44bc2cf5ad770999.
inline std::uint64_t xxh64_digest(std::string_view bytes, std::uint64_t seed = 0) {
  xxh64 h(seed);
  h.update(bytes);
  return h.digest();
}

/// A 64-bit value as 16 lower-case hex digits. Example: hex_digest(0x44bc2cf5ad770999) == "44bc2cf5ad770999".
inline std::string hex_digest(std::uint64_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[static_cast<std::size_t>(i)] = digits[value & 0xF];
  return text;
}

}  // namespace branchgrpo
