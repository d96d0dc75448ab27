#pragma once
// The pieces every family's LoRA key mapping shares (torch-free; model_spec::lora_parts, <family>/lora_keys.hpp):
// where (a part of) one of our linear layers goes in diffusers' layout, and the block-name split both layouts use.
#include <cstdint>
#include <string>
#include <string_view>

namespace branchgrpo {

/// One diffusers module fed by (a part of) one bfl linear layer: the rows [row_offset, row_offset + rows) of the
/// bfl layer's output (of B), or, with swap_halves, all rows with the two halves exchanged.
struct lora_key_part {
  std::string name;  ///< diffusers module path, e.g. "transformer_blocks.0.attn.to_q"
  std::int64_t row_offset = 0;
  std::int64_t rows = 0;
  bool swap_halves = false;
};

namespace detail {

// One module's path in our layout (bfl for FLUX, official for Wan) and in diffusers'.
struct lora_module_rename {
  std::string_view ours, diffusers;
};

// "double_blocks.7.img_attn.qkv" with prefix "double_blocks." -> {"7", "img_attn.qkv"}; false when it is not one.
inline bool split_block_name(std::string_view layer, std::string_view prefix, std::string& index, std::string& rest) {
  if (!layer.starts_with(prefix)) return false;
  const std::string_view tail = layer.substr(prefix.size());
  const auto dot = tail.find('.');
  if (dot == 0 || dot == std::string_view::npos ||
      tail.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos)
    return false;
  index = std::string(tail.substr(0, dot));
  rest = std::string(tail.substr(dot + 1));
  return true;
}

}  // namespace detail

}  // namespace branchgrpo
