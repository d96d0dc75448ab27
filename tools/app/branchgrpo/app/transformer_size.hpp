#pragma once
// What the memory estimate (run_memory.hpp) needs of a family's transformer, which each family computes from its
// config and the run's latent shape (app/families/<family>.hpp, `size`): the parameter count, the sides of its
// linear layers (LoRA's size per rank), and the widths and token counts of one block's activations.
//
// Example: tensors {[64, 32] linear, [64] bias} -> parameters 2112, linear_sides 96 (a LoRA of rank r adds 96 r).
#include <cstdint>
#include <ranges>

namespace branchgrpo {

struct transformer_size {
  double parameters = 0;    ///< every weight's elements
  double linear_sides = 0;  ///< the sum of rows + columns over the 2-D weights (an upper bound of the adapted ones)
  double layers = 0, hidden = 0, mlp = 0, heads = 0;
  double tokens = 0;        ///< per row
  double keys = 0;          ///< attention keys per token (self- and cross-attention)
  double prompt_width = 0;  ///< the features of one prompt token as the table holds it (pooled included)

  /// parameters and linear_sides of a family's expected tensors (anything with a `shape` range of sizes).
  template <std::ranges::input_range Tensors>
  void count(const Tensors& tensors) {
    for (const auto& t : tensors) {
      double n = 1;
      for (const std::int64_t d : t.shape) n *= static_cast<double>(d);
      parameters += n;
      if (t.shape.size() == 2) linear_sides += static_cast<double>(t.shape[0] + t.shape[1]);
    }
  }
};

}  // namespace branchgrpo
