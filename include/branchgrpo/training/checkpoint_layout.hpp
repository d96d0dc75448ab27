#pragma once
// The layout of a sharded checkpoint (checkpoint.hpp): how the trainable tensors lie end to end in the flat buffer
// that a sharded run splits over its ranks, and which shard file holds which range. Written as layout.txt, e.g.
//
//   total 49                  elements of the flat buffer
//   shards 2                  ranks that wrote it: shard r holds flat_shard::of(total, r, shards)
//   dtype float32             the masters' dtype (every shard tensor's)
//   step 3                    AdamW's step (0: no optimizer state yet)
//   ema 1                     whether the shards hold the EMA
//   tensor w 0 4x8            name, first element in the flat buffer, shape ("-" for a scalar)
//   tensor b 32 17
//
// The tensors tile [0, total) in order: a run whose trainable tensors have these names, shapes and order addresses
// the same elements by the same flat index at any world size, which is what resharding relies on.
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/training/sharding.hpp"

namespace branchgrpo {

inline constexpr std::string_view checkpoint_layout_file = "layout.txt";

/// A sharded checkpoint's flat buffer and its shards.
/// Example: tensors w [4, 8] and b [17] over 2 shards -> total 49, chunk 25: shard 0 holds w and b's first element,
///   shard 1 the other 24 of b (flat_shard::of(49, 1, 2) = [25, 49)).
struct checkpoint_layout {
  struct tensor {
    std::string name;
    std::int64_t offset = 0;
    std::vector<std::int64_t> shape;
    [[nodiscard]] std::int64_t numel() const {
      std::int64_t n = 1;
      for (const std::int64_t d : shape) n *= d;
      return n;
    }
    friend bool operator==(const tensor&, const tensor&) = default;
  };
  std::vector<tensor> tensors;
  std::int64_t total = 0;
  int shards = 1;
  std::string dtype = "float32";
  std::int64_t step = 0;  ///< AdamW's step count (0: the shards hold no moments)
  bool ema = false;

  /// Shard r's range of the flat buffer.
  [[nodiscard]] flat_shard shard(int r) const { return flat_shard::of(total, r, shards); }
  /// "shard-00001-of-00002.safetensors": the file of shard r.
  [[nodiscard]] std::string shard_file(int r) const {
    return "shard-" + zero_padded(r, 5) + "-of-" + zero_padded(shards, 5) + ".safetensors";
  }
  friend bool operator==(const checkpoint_layout&, const checkpoint_layout&) = default;
};

/// The layout.txt text of `layout` (the format above).
inline std::string checkpoint_layout_text(const checkpoint_layout& layout) {
  std::ostringstream out;
  out << "total " << layout.total << "\nshards " << layout.shards << "\ndtype " << layout.dtype << "\nstep "
      << layout.step << "\nema " << (layout.ema ? 1 : 0) << '\n';
  for (const auto& t : layout.tensors) {
    out << "tensor " << t.name << ' ' << t.offset << ' ';
    if (t.shape.empty()) out << '-';
    for (std::size_t d = 0; d < t.shape.size(); ++d) out << (d ? "x" : "") << t.shape[d];
    out << '\n';
  }
  return out.str();
}

/// Parses layout.txt; `source` names the file in the errors. Checks that the tensors tile [0, total) in order and
/// that shards >= 1: "<source>: tensor b starts at 30, the one before it ends at 32".
inline checkpoint_layout parse_checkpoint_layout(const std::string& text, const std::string& source) {
  checkpoint_layout layout;
  std::istringstream lines(text);
  bool has_total = false, has_shards = false;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string key, value;
    words >> key;
    if (key == "tensor") {
      checkpoint_layout::tensor t;
      std::string offset, shape;
      words >> t.name >> offset >> shape;
      require(!t.name.empty() && !shape.empty(), source, ": malformed line '", line, "'");
      t.offset = parse_integer<std::int64_t>(offset, source + ": offset of " + t.name, 0);
      if (shape != "-") {
        std::istringstream dims(shape);
        for (std::string d; std::getline(dims, d, 'x');)
          t.shape.push_back(parse_integer<std::int64_t>(d, source + ": shape of " + t.name, 0));
      }
      layout.tensors.push_back(std::move(t));
      continue;
    }
    words >> value;
    if (key == "total") {
      layout.total = parse_integer<std::int64_t>(value, source + ": total", 0);
      has_total = true;
    } else if (key == "shards") {
      layout.shards = parse_integer<int>(value, source + ": shards", 1);
      has_shards = true;
    } else if (key == "dtype") {
      require(value == "float32" || value == "float64", source, ": dtype '", value, "' is not float32 or float64");
      layout.dtype = value;
    } else if (key == "step") {
      layout.step = parse_integer<std::int64_t>(value, source + ": step", 0);
    } else if (key == "ema") {
      layout.ema = parse_integer<int>(value, source + ": ema", 0, 1) == 1;
    } else {
      fail(source, ": unknown line '", line, "'");
    }
  }
  require(has_total && has_shards, source, ": no ", has_total ? "shards" : "total", " line");
  std::int64_t end = 0;
  for (const auto& t : layout.tensors) {
    require(t.offset == end, source, ": tensor ", t.name, " starts at ", t.offset, ", the one before it ends at ", end);
    end += t.numel();
  }
  require(end == layout.total, source, ": the tensors hold ", end, " elements, total says ", layout.total);
  return layout;
}

}  // namespace branchgrpo
