#pragma once
// The model families every torch-free reader knows, as one table of model_specs (spec.hpp): the run config's
// model.config names, `branchgrpo weights`' --family / --layout / --config, export-lora's formats and the family a
// checkpoint's names belong to (family.hpp) all come from it. Adding a family: its <family>/spec.hpp and one entry
// here, then its LibTorch entry in tools/app/branchgrpo/app/model_families.hpp (docs/extending.md, "A model
// family").
//
//   model_spec_table                  {flux_spec, wan_spec, sd3_spec, wan22_spec}
//   model_spec_names()                {"flux", "wan", "sd3", "wan22"}
//   find_model_spec("wan")            the family named so, or nullptr
//   spec_of_config("wan-t2v-14b")     the family whose model.config names it (wan_spec), or nullptr
//   model_config_names                "", dev, schnell, tiny, wan-t2v-1.3b, wan-t2v-14b, wan-tiny, sd3.5-medium,
//                                     sd3.5-large, sd3-tiny, wan2.2-t2v-a14b, wan22-tiny (model.config's values;
//                                     "" when model.dir is given)
#include <array>
#include <cstddef>
#include <string_view>

#include "branchgrpo/model_specs/flux/spec.hpp"
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/model_specs/spec.hpp"
#include "branchgrpo/model_specs/wan/spec.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"

namespace branchgrpo {

inline constexpr std::array model_spec_table = {flux_spec, wan_spec, sd3_spec, wan22_spec};

/// The families' names in table order: {"flux", "wan", "sd3", "wan22"}.
inline constexpr auto model_spec_names() {
  std::array<std::string_view, model_spec_table.size()> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = model_spec_table[i].name;
  return out;
}

/// The family named `name` ("flux", "wan", "sd3", "wan22"), or nullptr.
inline const model_spec* find_model_spec(std::string_view name) {
  for (const model_spec& spec : model_spec_table)
    if (spec.name == name) return &spec;
  return nullptr;
}

/// The family one of whose named configs model.config `config` is, or nullptr ("" and unknown names).
/// Example: spec_of_config("tiny") == &model_spec_table[0] (FLUX); spec_of_config("wan-tiny")->name == "wan".
inline const model_spec* spec_of_config(std::string_view config) {
  for (const model_spec& spec : model_spec_table)
    if (spec.find(config) != nullptr) return &spec;
  return nullptr;
}

/// The named config model.config `config` is, or nullptr.
inline const named_model_config* find_named_config(std::string_view config) {
  const model_spec* spec = spec_of_config(config);
  return spec == nullptr ? nullptr : spec->find(config);
}

/// Every value model.config takes: "" (a model directory), then each family's configs in table order.
inline constexpr auto model_config_names = [] {
  constexpr std::size_t count = [] {
    std::size_t n = 1;
    for (const model_spec& spec : model_spec_table) n += spec.configs.size();
    return n;
  }();
  std::array<std::string_view, count> names{};
  std::size_t i = 1;
  for (const model_spec& spec : model_spec_table)
    for (const named_model_config& config : spec.configs) names[i++] = config.name;
  return names;
}();

}  // namespace branchgrpo
