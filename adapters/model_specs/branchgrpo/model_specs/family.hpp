#pragma once
// Which transformer family a checkpoint's tensor names are (torch-free): FLUX.1 (bfl or diffusers names) or Wan2.1
// (official or diffusers names), told by the names each family's layouts account for, whatever the block count.
// `branchgrpo weights` picks the family it checks with it, and the run loaders name a checkpoint of the other
// family as such ("holds Wan weights") instead of listing the tensors the config misses.
//
//   name_pattern("blocks.12.ffn.0.weight")  "blocks.#.ffn.#.weight": one block's names stand for every block's
//   family_score(names, family)             how many of the names are names of the family
//   weights_family(names)                   the family most of the names belong to, if any
#include <algorithm>
#include <cstddef>
#include <optional>
#include <ranges>
#include <set>
#include <string>
#include <string_view>

#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"

namespace branchgrpo {

/// The transformer families the weights readers know.
enum class model_family { flux, wan };

/// "FLUX" or "Wan", as messages name the families.
inline std::string_view family_label(model_family family) { return family == model_family::flux ? "FLUX" : "Wan"; }

/// A tensor name with every all-digit component replaced by '#', so one block's names stand for every block's.
/// Example: "blocks.12.ffn.0.weight" -> "blocks.#.ffn.#.weight"; "img_in.weight" -> "img_in.weight".
inline std::string name_pattern(std::string_view name) {
  std::string out;
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t end = std::min(name.find('.', start), name.size());
    const std::string_view part = name.substr(start, end - start);
    const bool digits = !part.empty() && std::ranges::all_of(part, [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? std::string_view("#") : part;
    if (end == name.size()) break;
    out += '.';
    start = end + 1;
  }
  return out;
}

/// The patterns of every name a family's configs have, in either layout (the configs differ in sizes and optional
/// tensors, e.g. FLUX dev's guidance_in, not in how a block's tensors are named).
inline const std::set<std::string>& family_patterns(model_family family) {
  static const std::set<std::string> flux = [] {
    std::set<std::string> out;
    for (const flux_config& config : {flux_config::dev(), flux_config::schnell(), flux_config::tiny()})
      for (const flux_layout layout : {flux_layout::bfl, flux_layout::diffusers})
        for (const flux_tensor_spec& spec : flux_expected_tensors(config, layout)) out.insert(name_pattern(spec.name));
    return out;
  }();
  static const std::set<std::string> wan = [] {
    std::set<std::string> out;
    for (const wan_layout layout : {wan_layout::official, wan_layout::diffusers})
      for (const wan_tensor_spec& spec : wan_expected_tensors(wan_config::tiny(), layout))
        out.insert(name_pattern(spec.name));
    return out;
  }();
  return family == model_family::flux ? flux : wan;
}

/// How many of `names` are names of `family` (in either layout, any block count). Some names are both families'
/// (diffusers' proj_out.weight).
/// Example: the names of wan_config::tiny() in the official layout -> every one for wan, none for flux.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::size_t family_score(
    const Names& names, model_family family) {
  const std::set<std::string>& patterns = family_patterns(family);
  return static_cast<std::size_t>(std::ranges::count_if(
      names, [&](const auto& name) { return patterns.contains(name_pattern(std::string_view(name))); }));
}

/// The family more of `names` belong to; nullopt when neither family has more (no known name, or a tie).
/// Example: FLUX.1-dev's bfl names -> flux; a Wan2.1 checkpoint's diffusers names -> wan; {"encoder.conv_in.weight"}
///   -> nullopt.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::optional<model_family>
weights_family(const Names& names) {
  const std::size_t flux = family_score(names, model_family::flux), wan = family_score(names, model_family::wan);
  if (flux == wan) return std::nullopt;
  return flux > wan ? model_family::flux : model_family::wan;
}

}  // namespace branchgrpo
