#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/family.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/model_specs/flux/spec.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/model_specs/sd3/layout.hpp"
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/model_specs/spec.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/model_specs/wan/spec.hpp"
#include "branchgrpo/model_specs/wan22/spec.hpp"
#include "branchgrpo/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {
namespace {

// The transformer families the command knows are model_spec_table's (model_specs/registry.hpp): their names,
// titles, layouts and `--config` names (named_model_config::weights_name) come from there; only the checks
// themselves are each family's own (family_checks below).

struct weights_options {
  std::string file;
  std::string family;  // empty: from --layout / --config, else detected from the names
  std::string layout;  // empty: detected from the names
  std::string config;  // empty: the config with the fewest problems
  bool json = false;
};

// The configs `--config` names, as flux_spec lists them: dev, schnell, tiny.
const std::vector<std::pair<std::string, flux_config>>& known_flux_configs() {
  static const std::vector<std::pair<std::string, flux_config>> configs = [] {
    std::vector<std::pair<std::string, flux_config>> out;
    for (const named_model_config& c : flux_spec.configs)
      out.emplace_back(std::string(c.weights_name), named_flux_config(c.name));
    return out;
  }();
  return configs;
}

// The configs `--config` names, as wan_spec lists them: t2v-1.3b, t2v-14b, tiny. The test shape is
// wan_config::tiny() itself (3 output channels from 4, as the reference check's fixtures are written), not
// model.config's wan-tiny (out_dim = in_dim for sampling).
const std::vector<std::pair<std::string, wan_config>>& known_wan_configs() {
  static const std::vector<std::pair<std::string, wan_config>> configs = [] {
    std::vector<std::pair<std::string, wan_config>> out;
    for (const named_model_config& c : wan_spec.configs)
      out.emplace_back(std::string(c.weights_name), c.released ? named_wan_config(c.name) : wan_config::tiny());
    return out;
  }();
  return configs;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return out + "]";
}

std::size_t problem_count(const flux_key_report& report) {
  return report.missing.size() + report.unexpected.size() + report.mismatched.size();
}

std::string plural(std::size_t count, const std::string& word) {
  return std::to_string(count) + " " + word + (count == 1 ? "" : "s");
}

// --- The command's names, from the families' specs -------------------------------------------------------------

/// Every `name` of each family, without repeats, in the order given (a name several families share, e.g. the layout
/// "diffusers" or the config "tiny", once). Example: {"bfl", "diffusers", "official", "diffusers"} -> {"bfl",
/// "diffusers", "official"}.
std::vector<std::string> unique_names(const std::vector<std::string_view>& names) {
  std::vector<std::string> out;
  for (const std::string_view name : names)
    if (std::ranges::find(out, name) == out.end()) out.emplace_back(name);
  return out;
}

/// --family's values: flux, wan.
std::vector<std::string> family_names() {
  std::vector<std::string_view> names;
  for (const model_spec& spec : model_spec_table) names.push_back(spec.name);
  return unique_names(names);
}

/// --layout's values: each family's native layout, then the others: bfl, official, diffusers.
std::vector<std::string> layout_names() {
  std::vector<std::string_view> names;
  for (const model_spec& spec : model_spec_table) names.push_back(spec.layouts.front());
  for (const model_spec& spec : model_spec_table) names.insert(names.end(), spec.layouts.begin(), spec.layouts.end());
  return unique_names(names);
}

/// --config's values: the released configs, then the test shapes: dev, schnell, t2v-1.3b, t2v-14b, tiny.
std::vector<std::string> config_names() {
  std::vector<std::string_view> names;
  for (const bool released : {true, false})
    for (const model_spec& spec : model_spec_table)
      for (const named_model_config& config : spec.configs)
        if (config.released == released) names.push_back(config.weights_name);
  return unique_names(names);
}

/// "a|b|c", as a --help type name.
std::string joined(const std::vector<std::string>& names, std::string_view separator) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : std::string(separator)) + name;
  return out;
}

// --- Which family: the names each family's layouts account for (model_specs/family.hpp) -----------------------

/// The one family whose layouts include `layout`; nullptr for one several families share ("diffusers"), or "".
const model_spec* family_of_layout(std::string_view layout) {
  const model_spec* found = nullptr;
  for (const model_spec& spec : model_spec_table)
    if (std::ranges::find(spec.layouts, layout) != spec.layouts.end()) {
      if (found != nullptr) return nullptr;
      found = &spec;
    }
  return found;
}

/// The one family one of whose configs `--config` names; nullptr for a name several families share ("tiny"), or "".
const model_spec* family_of_config(std::string_view config) {
  const model_spec* found = nullptr;
  for (const model_spec& spec : model_spec_table)
    if (std::ranges::find(spec.configs, config, &named_model_config::weights_name) != spec.configs.end()) {
      if (found != nullptr) return nullptr;
      found = &spec;
    }
  return found;
}

/// The layout `names` look like in `spec`'s family (family_checks' detect); nullopt when none.
std::optional<std::string> detect_layout(const model_spec& spec, const std::vector<std::string_view>& names);

/// The family to check: --family, else the one --layout or --config names, else the names' (the family most of
/// them belong to when its layout is detected in them; else the first of model_spec_table, FLUX, whose detection
/// may find none).
/// Example: --layout official --config dev -> invalid_input "--layout official is a Wan or Wan2.2 layout but --config
/// dev
///   is a FLUX config"; no options and the names of wan_config::tiny() -> wan.
const model_spec& choose_family(const weights_options& options, const std::vector<std::string_view>& names) {
  const model_spec* given = options.family.empty() ? nullptr : find_model_spec(options.family);
  require(options.family.empty() || given != nullptr, "--family ", options.family, " is not a family (",
          name_list(family_names()), ")");
  const model_spec* by_layout = family_of_layout(options.layout);
  const model_spec* by_config = family_of_config(options.config);
  if (given != nullptr) {
    require(by_layout == nullptr || by_layout == given, "--layout ", options.layout, " is not a layout of --family ",
            options.family, " (", name_list(given->layouts), ")");
    require(by_config == nullptr || by_config == given, "--config ", options.config, " is not a config of --family ",
            options.family, " (", config_list(*given, config_order::as_listed, true), ")");
    return *given;
  }
  if (by_config != nullptr && !options.layout.empty() &&
      std::ranges::find(by_config->layouts, options.layout) == by_config->layouts.end()) {
    std::vector<std::string_view> owners;  // the families with that layout ("official": Wan and Wan2.2)
    for (const model_spec& spec : model_spec_table)
      if (std::ranges::find(spec.layouts, options.layout) != spec.layouts.end()) owners.push_back(spec.label);
    if (!owners.empty())
      fail("--layout ", options.layout, " is a ", name_list(owners), " layout but --config ", options.config, " is a ",
           by_config->label, " config");
  }
  if (by_layout != nullptr) return *by_layout;
  if (by_config != nullptr) return *by_config;
  if (const model_spec* most = weights_family(names); most != nullptr && detect_layout(*most, names).has_value())
    return *most;
  return model_spec_table.front();
}

// --- The report -----------------------------------------------------------------------------------------------

// What the command found, printed as a table or as JSON.
struct weights_report {
  const safetensors_checkpoint* checkpoint = nullptr;
  const model_spec* family = nullptr;   // the family checked (model_spec_table's)
  bool family_named = false;            // by --family, --layout or --config, not detected
  std::optional<std::string> detected;  // the layout the names look like, within the family
  std::optional<std::string> layout;    // the layout checked; none: nothing checked
  bool layout_given = false;
  std::string config;  // empty when no layout; "inferred" for Wan sizes read from the shapes
  bool config_given = false;
  std::string candidates;  // "dev, schnell, tiny": the configs a best match was chosen from
  nlohmann::json sizes;    // the sizes of the config checked where the family prints them (Wan), else null
  std::string sizes_text;  // the same as a table row's text; "" when none
  flux_key_report keys;
  std::size_t expected_count = 0;
};

// Checks against every candidate config (or the one given) and keeps the one with the fewest problems in the
// report; ties keep the earlier. check(config) compares the checkpoint with the config's tensors, expected(config)
// lists them. Returns the config kept.
template <class Config, class Check, class Expected>
Config best_config(weights_report& report, const std::vector<std::pair<std::string, Config>>& configs,
                   const std::string& given, Check check, Expected expected) {
  std::size_t best = static_cast<std::size_t>(-1);
  Config chosen = configs.front().second;
  for (const auto& [name, config] : configs) {
    if (!given.empty() && name != given) continue;
    report.candidates += (report.candidates.empty() ? "" : ", ") + name;
    flux_key_report keys = check(config);
    if (problem_count(keys) < best) {
      best = problem_count(keys);
      report.config = name;
      report.keys = std::move(keys);
      report.expected_count = expected(config).size();
      chosen = config;
    }
  }
  return chosen;
}

/// The sizes of a Wan config that its tensors' shapes show (heads and text_len do not).
nlohmann::json wan_sizes_json(const wan_config& c) {
  return {{"in_dim", c.in_dim}, {"out_dim", c.out_dim},   {"dim", c.dim},           {"ffn_dim", c.ffn_dim},
          {"layers", c.layers}, {"freq_dim", c.freq_dim}, {"text_dim", c.text_dim}, {"patch", c.patch}};
}

std::string wan_sizes_text(const wan_config& c) {
  return "dim " + std::to_string(c.dim) + ", ffn " + std::to_string(c.ffn_dim) + ", " + plural(c.layers, "block") +
         ", latent channels " + std::to_string(c.in_dim) + " in / " + std::to_string(c.out_dim) + " out, text " +
         std::to_string(c.text_dim) + ", time " + std::to_string(c.freq_dim) + ", patch " + std::to_string(c.patch[0]) +
         " x " + std::to_string(c.patch[1]) + " x " + std::to_string(c.patch[2]);
}

using tensor_shapes = std::map<std::string, std::vector<std::int64_t>>;

// --- Each family's own check (reached through family_checks) ----------------------------------------------------

std::optional<std::string> detect_flux(const std::vector<std::string_view>& names) {
  const std::optional<flux_layout> detected = detect_flux_layout(names);
  return detected ? std::optional(std::string(layout_name(*detected))) : std::nullopt;
}

void check_flux(weights_report& report, const std::string& layout_text, const std::string& config,
                const tensor_shapes& shapes) {
  const flux_layout layout = parse_flux_layout(layout_text);
  report.layout = std::string(layout_name(layout));
  best_config(
      report, known_flux_configs(), config, [&](const flux_config& c) { return check_flux_tensors(c, layout, shapes); },
      [&](const flux_config& c) { return flux_expected_tensors(c, layout); });
}

// detect_wan_layout alone would call FLUX bfl names official (single_blocks.N.modulation.lin): some names must be
// Wan's own.
std::optional<std::string> detect_wan(const std::vector<std::string_view>& names) {
  const std::optional<wan_layout> detected =
      family_score(names, wan_spec) > 0 ? detect_wan_layout(names) : std::nullopt;
  return detected ? std::optional(std::string(layout_name(*detected))) : std::nullopt;
}

void check_wan(weights_report& report, const std::string& layout_text, const std::string& config,
               const tensor_shapes& shapes) {
  const wan_layout layout = parse_wan_layout(layout_text);
  report.layout = std::string(layout_name(layout));
  const auto check = [&](const wan_config& c) { return check_wan_tensors(c, layout, shapes); };
  const auto expected = [&](const wan_config& c) { return wan_expected_tensors(c, layout); };
  wan_config checked = best_config(report, known_wan_configs(), config, check, expected);
  // No released size matches: the sizes the shapes imply, when they are complete enough and check better.
  if (!report.config_given && !report.keys.ok())
    if (const std::optional<wan_config> inferred = infer_wan_config(shapes, layout)) {
      flux_key_report keys = check(*inferred);
      if (problem_count(keys) < problem_count(report.keys)) {
        report.config = "inferred";
        report.keys = std::move(keys);
        report.expected_count = expected(*inferred).size();
        checked = *inferred;
      }
    }
  report.sizes = wan_sizes_json(checked);
  report.sizes_text = wan_sizes_text(checked);
}

// SD3: the released single file holds the transformer under model.diffusion_model. beside its VAE and text
// encoders (sd3_transformer_part keeps only the transformer's names, the prefix removed).
std::optional<std::string> detect_sd3(const std::vector<std::string_view>& names) {
  std::map<std::string, int> named;
  for (const std::string_view name : names) named.emplace(std::string(name), 0);
  std::vector<std::string> inner;
  for (const auto& [name, unused] : sd3_transformer_part(named)) inner.push_back(name);
  const std::optional<sd3_layout> detected = detect_sd3_layout(inner);
  return detected ? std::optional(std::string(layout_name(*detected))) : std::nullopt;
}

void check_sd3(weights_report& report, const std::string& layout_text, const std::string& config,
               const tensor_shapes& shapes) {
  const sd3_layout layout = parse_sd3_layout(layout_text);
  report.layout = std::string(layout_name(layout));
  const tensor_shapes inner = sd3_transformer_part(shapes);
  std::vector<std::pair<std::string, sd3_config>> configs;
  for (const named_model_config& c : sd3_spec.configs)
    configs.emplace_back(std::string(c.weights_name), named_sd3_config(c.name));
  best_config(
      report, configs, config, [&](const sd3_config& c) { return check_sd3_tensors(c, layout, inner); },
      [&](const sd3_config& c) { return sd3_expected_tensors(c, layout); });
}

// Wan2.2: each expert's tensors are Wan's under the expert's module (high_noise_model / low_noise_model, or
// diffusers' transformer / transformer_2), checked as Wan's (check_wan_tensors) with the prefix put back.
std::optional<std::string> detect_wan22(const std::vector<std::string_view>& names) {
  if (family_score(names, wan22_spec) == 0) return std::nullopt;
  std::size_t official = 0, diffusers = 0;
  for (const std::string_view name : names) {
    official += name.starts_with("high_noise_model.") || name.starts_with("low_noise_model.");
    diffusers += name.starts_with("transformer.") || name.starts_with("transformer_2.");
  }
  if (official == diffusers) return std::nullopt;
  return std::string(official > diffusers ? "official" : "diffusers");
}

void check_wan22(weights_report& report, const std::string& layout_text, const std::string& config,
                 const tensor_shapes& shapes) {
  const wan_layout layout = parse_wan_layout(layout_text);
  report.layout = std::string(layout_name(layout));
  const auto& prefixes = layout == wan_layout::official ? wan22_official_prefixes : wan22_diffusers_prefixes;
  const auto expert_of = [&](const std::string& name) -> std::optional<std::string> {
    for (const std::string_view p : prefixes)
      if (name.starts_with(std::string(p) + ".")) return std::string(p) + ".";
    return std::nullopt;
  };
  const auto check = [&](const wan22_config& c) {
    flux_key_report out;
    for (const std::string_view p : prefixes) {
      const std::string pre = std::string(p) + ".";
      tensor_shapes expert;
      for (const auto& [name, shape] : shapes)
        if (expert_of(name) == pre) expert[name.substr(pre.size())] = shape;
      const flux_key_report keys = check_wan_tensors(c.expert, layout, expert);
      for (const auto& m : keys.missing) out.missing.push_back(pre + m);
      for (const auto& m : keys.unexpected) out.unexpected.push_back(pre + m);
      for (const auto& m : keys.mismatched) out.mismatched.push_back(pre + m);
    }
    for (const auto& [name, shape] : shapes)
      if (!expert_of(name)) out.unexpected.push_back(name);
    return out;
  };
  const auto expected = [&](const wan22_config& c) {
    std::vector<wan_tensor_spec> out;
    for (const std::string_view p : prefixes)
      for (const wan_tensor_spec& t : wan_expected_tensors(c.expert, layout))
        out.push_back({std::string(p) + "." + t.name, t.shape});
    return out;
  };
  std::vector<std::pair<std::string, wan22_config>> configs;
  for (const named_model_config& c : wan22_spec.configs)
    configs.emplace_back(std::string(c.weights_name), named_wan22_config(c.name));
  const wan22_config checked = best_config(report, configs, config, check, expected);
  report.sizes = wan_sizes_json(checked.expert);
  report.sizes_text = "2 experts of " + wan_sizes_text(checked.expert);
}

/// How the command checks one family of model_spec_table: the layout its names look like (nullopt: none), and the
/// check of the shapes against its configs (or `config`, a --config value) in one of its layouts, which sets
/// report.layout, .config, .candidates, .keys, .expected_count and the sizes it prints.
struct family_check {
  const model_spec* spec;
  std::optional<std::string> (*detect)(const std::vector<std::string_view>& names);
  void (*check)(weights_report& report, const std::string& layout, const std::string& config,
                const tensor_shapes& shapes);
};

constexpr std::array family_checks = {
    family_check{&flux_spec, detect_flux, check_flux}, family_check{&wan_spec, detect_wan, check_wan},
    family_check{&sd3_spec, detect_sd3, check_sd3}, family_check{&wan22_spec, detect_wan22, check_wan22}};

// Every family of the table has its check, and only those (a family is added in model_specs/registry.hpp and here).
static_assert(family_checks.size() == model_spec_table.size() && [] {
  for (const model_spec& spec : model_spec_table)
    if (std::ranges::count(family_checks, spec.name, [](const family_check& f) { return f.spec->name; }) != 1)
      return false;
  return true;
}());

/// `spec`'s entry of family_checks (spec is one of model_spec_table).
const family_check& check_of(const model_spec& spec) {
  return *std::ranges::find(family_checks, spec.name, [](const family_check& f) { return f.spec->name; });
}

std::optional<std::string> detect_layout(const model_spec& spec, const std::vector<std::string_view>& names) {
  return check_of(spec).detect(names);
}

weights_report analyse(const safetensors_checkpoint& checkpoint, const weights_options& options) {
  weights_report report;
  report.checkpoint = &checkpoint;
  std::vector<std::string_view> names;
  tensor_shapes shapes;
  for (const safetensors_tensor& tensor : checkpoint.tensors()) {
    names.push_back(tensor.name);
    shapes.emplace(tensor.name, tensor.shape);
  }
  report.family = &choose_family(options, names);
  report.family_named = !options.family.empty() || family_of_layout(options.layout) != nullptr ||
                        family_of_config(options.config) != nullptr;
  report.layout_given = !options.layout.empty();
  report.config_given = !options.config.empty();

  const family_check& family = check_of(*report.family);
  report.detected = family.detect(names);
  const std::optional<std::string> layout = report.layout_given ? std::optional(options.layout) : report.detected;
  if (!layout) return report;
  family.check(report, *layout, options.config, shapes);
  return report;
}

std::map<std::string, std::size_t> dtype_counts(const safetensors_checkpoint& checkpoint) {
  std::map<std::string, std::size_t> counts;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    ++counts[std::string(safetensors_dtype_name(tensor.dtype))];
  return counts;
}

std::uint64_t total_bytes(const safetensors_checkpoint& checkpoint) {
  std::uint64_t bytes = 0;
  for (const safetensors_tensor& tensor : checkpoint.tensors()) bytes += tensor.data.size();
  return bytes;
}

// The whole output in one write, checked at once: the system's reason for a failure (errno) is known only right
// after the failing write, not at the final check (main.cpp) when the output was larger than stdout's buffer.
void print_checked(std::string_view text) {
  std::cout << text << std::flush;
  if (!std::cout) throw write_error("standard output", "cannot write", errno);
}

void print_json(const weights_report& report) {
  const safetensors_checkpoint& checkpoint = *report.checkpoint;
  nlohmann::json out;
  out["file"] = checkpoint.path().string();
  out["sharded"] = checkpoint.sharded();
  out["shards"] = nlohmann::json::array();
  if (checkpoint.sharded())
    for (const safetensors_file& shard : checkpoint.files()) out["shards"].push_back(shard.path().filename().string());
  out["metadata"] = checkpoint.metadata();
  out["bytes"] = total_bytes(checkpoint);
  out["dtypes"] = dtype_counts(checkpoint);
  out["tensors"] = nlohmann::json::array();
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    out["tensors"].push_back(
        {{"name", tensor.name}, {"dtype", std::string(safetensors_dtype_name(tensor.dtype))}, {"shape", tensor.shape}});
  const bool checked = report.layout.has_value();
  out["family"] = checked ? nlohmann::json(std::string(report.family->name)) : nullptr;
  out["detected_layout"] = report.detected ? nlohmann::json(*report.detected) : nullptr;
  out["layout"] = checked ? nlohmann::json(*report.layout) : nullptr;
  out["config"] = checked ? nlohmann::json(report.config) : nullptr;
  out["sizes"] = checked ? report.sizes : nullptr;
  out["missing"] = report.keys.missing;
  out["unexpected"] = report.keys.unexpected;
  out["mismatched"] = report.keys.mismatched;
  out["ok"] = checked ? nlohmann::json(report.keys.ok()) : nullptr;
  print_checked(out.dump() + '\n');
}

void print_table(const weights_report& report) {
  const safetensors_checkpoint& checkpoint = *report.checkpoint;
  std::ostringstream out;  // a sharded checkpoint lists thousands of tensors: one checked write at the end
  const auto row = [&](const std::string& key, const std::string& value) {
    out << std::left << std::setw(10) << key << value << '\n';
  };
  row("file", checkpoint.path().string() +
                  (checkpoint.sharded() ? " (index of " + plural(checkpoint.files().size(), "shard") + ")" : ""));
  std::string dtypes;
  for (const auto& [dtype, count] : dtype_counts(checkpoint))
    dtypes += (dtypes.empty() ? "" : ", ") + dtype + " " + std::to_string(count);
  row("tensors", std::to_string(checkpoint.tensors().size()) + (dtypes.empty() ? "" : " (" + dtypes + ")") + ", " +
                     std::to_string(total_bytes(checkpoint)) + " bytes");
  for (const auto& [key, value] : checkpoint.metadata())
    row("metadata", key + " = " + safetensors_detail::printable(value));

  if (!report.layout) {
    // The family named, else every family: "not a FLUX transformer checkpoint (no bfl or diffusers key names), nor
    // a Wan one (no official or diffusers key names)".
    const auto not_of = [](const model_spec& spec, std::string_view what) {
      return std::string(spec.label) + std::string(what) + " (no " + name_list(spec.layouts) + " key names)";
    };
    std::string text = "none: not a " + not_of(report.family_named ? *report.family : model_spec_table.front(),
                                               " transformer checkpoint");
    if (!report.family_named)
      for (std::size_t i = 1; i < model_spec_table.size(); ++i)
        text += ", nor a " + not_of(model_spec_table[i], " one");
    row("layout", text);
  } else {
    const std::string& name = *report.layout;
    row("family", std::string(report.family->name) + " (" + std::string(report.family->title) + ")");
    if (!report.layout_given)
      row("layout", name + " (detected)");
    else if (report.detected && *report.detected != name)
      row("layout", name + " (as given; the names look like " + *report.detected + ")");
    else
      row("layout", name + " (as given)");
    const std::string config = report.config == "inferred" ? "the inferred sizes" : report.config;
    if (report.config == "inferred")
      row("config", "inferred from the shapes (none of " + report.candidates + " matches better)");
    else
      row("config", report.config + (report.config_given ? "" : " (best match of " + report.candidates + ")"));
    if (!report.sizes_text.empty()) row("sizes", report.sizes_text);
    const flux_key_report& keys = report.keys;
    if (keys.ok()) {
      row("check", "ok: all " + std::to_string(report.expected_count) + " tensors of " + config + " in " + name +
                       ", every shape matching");
    } else {
      row("check", plural(problem_count(keys), "problem") + ": " + std::to_string(keys.missing.size()) + " missing, " +
                       std::to_string(keys.unexpected.size()) + " unexpected, " +
                       std::to_string(keys.mismatched.size()) + " shape mismatch" +
                       (keys.mismatched.size() == 1 ? "" : "es"));
      for (const std::string& key : keys.missing) out << "  missing     " << key << '\n';
      for (const std::string& key : keys.unexpected)
        out << "  unexpected  " << safetensors_detail::printable(key) << '\n';
      for (const std::string& text : keys.mismatched) out << "  mismatch    " << text << '\n';
    }
  }

  std::size_t width = 4;
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    width = std::max(width, safetensors_detail::printable(tensor.name).size());
  out << '\n'
      << std::left << std::setw(static_cast<int>(width) + 2) << "name" << std::setw(9) << "dtype"
      << "shape\n";
  for (const safetensors_tensor& tensor : checkpoint.tensors())
    out << std::left << std::setw(static_cast<int>(width) + 2) << safetensors_detail::printable(tensor.name)
        << std::setw(9) << safetensors_dtype_name(tensor.dtype) << shape_text(tensor.shape) << '\n';
  print_checked(out.str());
}

void run_weights(const weights_options& options) {
  const safetensors_checkpoint checkpoint(options.file);  // throws the reader's one-line message
  const weights_report report = analyse(checkpoint, options);
  if (options.json)
    print_json(report);
  else
    print_table(report);
}

}  // namespace

void add_weights_command(CLI::App& app) {
  auto options = std::make_shared<weights_options>();
  std::vector<std::string_view> labels;
  std::string layouts;  // "FLUX bfl or diffusers, Wan official or diffusers"
  std::string configs;  // "FLUX dev, schnell, tiny; Wan t2v-1.3b, t2v-14b, tiny"
  for (const model_spec& spec : model_spec_table) {
    labels.push_back(spec.label);
    layouts += (layouts.empty() ? "" : ", ") + std::string(spec.label) + " " + name_list(spec.layouts);
    std::string names;
    for (const named_model_config& config : spec.configs)
      names += (names.empty() ? "" : ", ") + std::string(config.weights_name);
    configs += (configs.empty() ? "" : "; ") + std::string(spec.label) + " " + names;
  }
  const std::string about = "List the tensors of a safetensors checkpoint and check them against a " +
                            name_list(labels) + " transformer layout and config";
  CLI::App* weights = app.add_subcommand("weights", about);
  weights->add_option("file", options->file, "A .safetensors file or a sharded checkpoint's *.safetensors.index.json")
      ->required()
      ->type_name("FILE");
  weights
      ->add_option("--family", options->family,
                   "Transformer family to check against (default: named by --layout / --config, else detected)")
      ->check(CLI::IsMember(family_names()))
      ->type_name(joined(family_names(), "|"));
  weights
      ->add_option("--layout", options->layout, "Weight layout to check against: " + layouts + " (default: detected)")
      ->check(CLI::IsMember(layout_names()))
      ->type_name(joined(layout_names(), "|"));
  weights
      ->add_option("--config", options->config,
                   "Config to check against: " + configs +
                       " (default: whichever of the family's matches best; for Wan else the sizes the shapes imply)")
      ->check(CLI::IsMember(config_names()))
      ->type_name("NAME");
  weights->add_flag("--json", options->json, "Print one JSON object instead of a table");
  weights->callback([options] { run_weights(*options); });
}

}  // namespace branchgrpo::cli
