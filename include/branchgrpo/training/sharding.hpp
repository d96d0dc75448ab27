#pragma once
// Sharded training (ZeRO): which training state each rank of a data-parallel group keeps only a share of, and
// where its share lies. The collectives and tensors live in the LibTorch adapter (branchgrpo/torch/policy.hpp on
// the c10d communicator); the core holds the names, the checks and the arithmetic, so that every adapter splits the
// same way.
//
//   sharding_mode      none | optimizer (ZeRO-1) | gradients (ZeRO-2) | parameters (ZeRO-3, designed, not built)
//   sharding_options   the mode and the gradient bucket size; a config's optimizer.sharding, optimizer.bucket_mb
//   flat_shard         rank r's contiguous range [lo, hi) of a flat buffer of `total` elements split over `size`
//                      ranks: chunks of ceil(total / size), the last ones shorter (or empty), so no world size has
//                      to divide anything; the collectives pad every chunk to the same length
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// What a rank keeps only its share of.
///   none        everything replicated (plain data parallelism: gradients all-reduced, every rank steps all)
///   optimizer   ZeRO-1: the float32 master weights, AdamW's moments and the EMA of this rank's shard; gradients
///               are still summed in full on every rank (all-reduce), then each rank steps its shard and the
///               updated shards are all-gathered into every rank's working weights
///   gradients   ZeRO-2: as optimizer, and the gradient sum reaches only the shard's owner, reduced bucket by
///               bucket during the backward pass, so no rank holds the whole gradient
///   parameters  ZeRO-3: also the working weights, gathered layer by layer for the forward and backward passes;
///               not built in this version (docs/distributed.md gives its design)
enum class sharding_mode { none, optimizer, gradients, parameters };

/// The config's name of a mode: "none", "optimizer", "gradients", "parameters".
[[nodiscard]] inline std::string_view sharding_name(sharding_mode mode) {
  switch (mode) {
    case sharding_mode::none:
      return "none";
    case sharding_mode::optimizer:
      return "optimizer";
    case sharding_mode::gradients:
      return "gradients";
    case sharding_mode::parameters:
      return "parameters";
  }
  return "?";
}

/// The mode a config names. `key` names the setting in the error.
/// Example: parse_sharding_mode("gradients", "optimizer.sharding") -> sharding_mode::gradients;
///   parse_sharding_mode("zero2", "optimizer.sharding") throws invalid_input
///   "optimizer.sharding = \"zero2\": must be none, optimizer, gradients or parameters".
[[nodiscard]] inline sharding_mode parse_sharding_mode(std::string_view text, std::string_view key) {
  for (const sharding_mode mode :
       {sharding_mode::none, sharding_mode::optimizer, sharding_mode::gradients, sharding_mode::parameters})
    if (text == sharding_name(mode)) return mode;
  fail(key, " = \"", text, "\": must be none, optimizer, gradients or parameters");
}

/// How a data-parallel group shares the training state (docs/distributed.md, "Sharded training").
/// Example: sharding_options{.mode = sharding_mode::gradients, .bucket_megabytes = 25}: ZeRO-2, gradients
///   reduced to their owners 25 MB at a time.
struct sharding_options {
  sharding_mode mode = sharding_mode::none;
  /// Gradients are reduced this many megabytes (10^6 bytes) of float32 at a time: larger buckets mean fewer
  /// collectives, smaller ones less transient memory. In (0, 65536].
  double bucket_megabytes = 25;

  [[nodiscard]] bool sharded() const { return mode != sharding_mode::none; }
  /// Elements of float32 per bucket (at least 1).
  [[nodiscard]] std::int64_t bucket_elements() const {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_megabytes * 1e6 / 4));
  }
  friend bool operator==(const sharding_options&, const sharding_options&) = default;
};

/// Checks what can be checked without a model: the bucket size, and that the mode is built. `prefix` names the
/// section in the errors ("optimizer").
/// Example: validate_sharding({.mode = sharding_mode::parameters}, "optimizer") throws "optimizer.sharding =
///   \"parameters\": not built in this version; docs/distributed.md gives its design".
inline void validate_sharding(const sharding_options& options, std::string_view prefix) {
  require(options.mode != sharding_mode::parameters, prefix, ".sharding = \"parameters\": not built in this version; ",
          "docs/distributed.md gives its design");
  require(std::isfinite(options.bucket_megabytes) && options.bucket_megabytes > 0 && options.bucket_megabytes <= 65536,
          prefix, ".bucket_mb = ", options.bucket_megabytes, ": must be in (0, 65536]");
}

/// Rank `rank`'s contiguous range [lo, hi) of a flat buffer of `total` elements shared by `size` ranks: every rank
/// gets `chunk` = ceil(total / size) elements but the last ones, which get what is left (possibly nothing). The
/// collectives move chunk * size elements, the tail padded with zeros.
/// Example: of(10, 0, 4) -> {chunk 3, [0, 3)}; of(10, 3, 4) -> [9, 10); of(2, 2, 3) -> {chunk 1, [2, 2)} (empty);
///   of(10, 0, 1) -> [0, 10).
/// @pre total >= 0, 0 <= rank < size.
struct flat_shard {
  std::int64_t total = 0, chunk = 0, lo = 0, hi = 0;
  int rank = 0, size = 1;

  [[nodiscard]] static flat_shard of(std::int64_t total, int rank, int size) {
    require(size >= 1 && rank >= 0 && rank < size, "rank ", rank, " is not in a group of ", size);
    require(total >= 0, "a flat buffer of ", total, " elements");
    const std::int64_t chunk = (total + size - 1) / size;
    const std::int64_t lo = std::min(total, chunk * rank);
    return {.total = total, .chunk = chunk, .lo = lo, .hi = std::min(total, lo + chunk), .rank = rank, .size = size};
  }
  [[nodiscard]] std::int64_t count() const { return hi - lo; }
  /// The padded length the collectives move: chunk * size >= total.
  [[nodiscard]] std::int64_t padded() const { return chunk * size; }
  /// Which rank owns flat element `at` (< total).
  [[nodiscard]] int owner(std::int64_t at) const { return chunk == 0 ? 0 : static_cast<int>(at / chunk); }
};

}  // namespace branchgrpo
