#pragma once
// Which transformer family a checkpoint's tensor names are (torch-free): the family of model_spec_table
// (registry.hpp) whose layouts account for most of them, whatever the block count. `branchgrpo weights` picks the
// family it checks with it, and the run loaders name a checkpoint of another family as such ("holds Wan weights")
// instead of listing the tensors the config misses.
//
//   name_pattern("blocks.12.ffn.0.weight")  "blocks.#.ffn.#.weight": one block's names stand for every block's
//   family_score(names, spec)               how many of the names are names of the family
//   weights_family(names)                   the family most of the names belong to, if any
//   leading_family(score)                   the family a score puts ahead of the others, if any
#include <algorithm>
#include <cstddef>
#include <ranges>
#include <set>
#include <string>
#include <string_view>

#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/model_specs/spec.hpp"

namespace branchgrpo {

/// How many of `names` are names of `spec`'s family (in any of its layouts, any block count). Some names are
/// several families' (diffusers' proj_out.weight).
/// Example: the names of wan_config::tiny() in the official layout -> every one for wan_spec, none for flux_spec.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view> std::size_t family_score(
    const Names& names, const model_spec& spec) {
  const std::set<std::string>& patterns = spec.patterns();
  return static_cast<std::size_t>(std::ranges::count_if(
      names, [&](const auto& name) { return patterns.contains(name_pattern(std::string_view(name))); }));
}

/// The family of model_spec_table that `score` rates above every other (score(spec) -> a count); nullptr when none
/// is ahead (every score 0, or a tie at the top). What weights_family and export-lora's family of a checkpoint's
/// adapters both ask.
/// Example: scores {flux: 3, wan: 7} -> &wan's entry; {2, 2} -> nullptr; {0, 0} -> nullptr.
template <class Score>
const model_spec* leading_family(Score&& score) {
  const model_spec* best = nullptr;
  std::size_t best_score = 0;
  bool tie = false;
  for (const model_spec& spec : model_spec_table) {
    const auto value = static_cast<std::size_t>(score(spec));
    if (value > best_score) {
      best = &spec;
      best_score = value;
      tie = false;
    } else if (value == best_score) {
      tie = true;
    }
  }
  return tie || best_score == 0 ? nullptr : best;
}

/// The family of model_spec_table more of `names` belong to than to any other (leading_family of family_score).
/// Example: FLUX.1-dev's bfl names -> &flux_spec's entry; a Wan2.1 checkpoint's diffusers names -> wan's;
///   {"encoder.conv_in.weight"} -> nullptr.
template <std::ranges::input_range Names>
requires std::convertible_to<std::ranges::range_reference_t<Names>, std::string_view>
const model_spec* weights_family(const Names& names) {
  return leading_family([&](const model_spec& spec) { return family_score(names, spec); });
}

}  // namespace branchgrpo
