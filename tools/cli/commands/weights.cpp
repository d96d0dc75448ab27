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
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/output/output_file.hpp"

namespace branchgrpo::cli {
namespace {

// The transformer families the command knows (model_specs/family.hpp); their layouts and configs are named by text in
// the report.
std::string_view family_name(model_family family) { return family == model_family::flux ? "flux" : "wan"; }

std::string_view family_title(model_family family) {
  return family == model_family::flux ? "FLUX.1 transformer" : "Wan2.1 text-to-video transformer";
}

struct weights_options {
  std::string file;
  std::string family;  // empty: from --layout / --config, else detected from the names
  std::string layout;  // empty: detected from the names
  std::string config;  // empty: the config with the fewest problems
  bool json = false;
};

const std::vector<std::pair<std::string, flux_config>>& known_configs() {
  static const std::vector<std::pair<std::string, flux_config>> configs = {
      {"dev", flux_config::dev()}, {"schnell", flux_config::schnell()}, {"tiny", flux_config::tiny()}};
  return configs;
}

const std::vector<std::pair<std::string, wan_config>>& known_wan_configs() {
  static const std::vector<std::pair<std::string, wan_config>> configs = {
      {"t2v-1.3b", wan_config::t2v_1_3b()}, {"t2v-14b", wan_config::t2v_14b()}, {"tiny", wan_config::tiny()}};
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

// --- Which family: the names each family's layouts account for (model_specs/family.hpp) -----------------------

/// The family a --layout or --config value belongs to; nullopt for the shared "diffusers" and "tiny" (and "").
std::optional<model_family> family_of_layout(std::string_view layout) {
  if (layout == "bfl") return model_family::flux;
  if (layout == "official") return model_family::wan;
  return std::nullopt;
}
std::optional<model_family> family_of_config(std::string_view config) {
  if (config == "dev" || config == "schnell") return model_family::flux;
  if (config.starts_with("t2v-")) return model_family::wan;
  return std::nullopt;
}

/// The family to check: --family, else the one --layout or --config names, else the names' (Wan when more of
/// them are Wan names than FLUX names and they have a Wan layout; else FLUX, whose detection may find none).
/// Example: --layout official --config dev -> invalid_input "--layout official is a Wan layout but --config dev
///   is a FLUX config"; no options and the names of wan_config::tiny() -> wan.
model_family choose_family(const weights_options& options, const std::vector<std::string_view>& names) {
  const std::optional<model_family> given = options.family.empty()    ? std::nullopt
                                            : options.family == "wan" ? std::optional(model_family::wan)
                                                                      : std::optional(model_family::flux);
  const std::optional<model_family> by_layout = family_of_layout(options.layout);
  const std::optional<model_family> by_config = family_of_config(options.config);
  if (given) {
    require(!by_layout || by_layout == given, "--layout ", options.layout, " is not a layout of --family ",
            options.family, " (", *given == model_family::flux ? "bfl or diffusers" : "official or diffusers", ")");
    require(!by_config || by_config == given, "--config ", options.config, " is not a config of --family ",
            options.family, " (", *given == model_family::flux ? "dev, schnell or tiny" : "t2v-1.3b, t2v-14b or tiny",
            ")");
    return *given;
  }
  require(!by_layout || !by_config || by_layout == by_config, "--layout ", options.layout, " is a ",
          by_layout == model_family::wan ? "Wan" : "FLUX", " layout but --config ", options.config, " is a ",
          by_config == model_family::wan ? "Wan" : "FLUX", " config");
  if (by_layout) return *by_layout;
  if (by_config) return *by_config;
  if (family_score(names, model_family::wan) > family_score(names, model_family::flux) &&
      detect_wan_layout(names).has_value())
    return model_family::wan;
  return model_family::flux;
}

// --- The report -----------------------------------------------------------------------------------------------

// What the command found, printed as a table or as JSON.
struct weights_report {
  const safetensors_checkpoint* checkpoint = nullptr;
  model_family family = model_family::flux;
  bool family_named = false;            // by --family, --layout or --config, not detected
  std::optional<std::string> detected;  // the layout the names look like, within the family
  std::optional<std::string> layout;    // the layout checked; none: nothing checked
  bool layout_given = false;
  std::string config;  // empty when no layout; "inferred" for Wan sizes read from the shapes
  bool config_given = false;
  std::string candidates;         // "dev, schnell, tiny": the configs a best match was chosen from
  std::optional<wan_config> wan;  // the Wan config checked (its sizes are printed)
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

weights_report analyse(const safetensors_checkpoint& checkpoint, const weights_options& options) {
  weights_report report;
  report.checkpoint = &checkpoint;
  std::vector<std::string_view> names;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const safetensors_tensor& tensor : checkpoint.tensors()) {
    names.push_back(tensor.name);
    shapes.emplace(tensor.name, tensor.shape);
  }
  report.family = choose_family(options, names);
  report.family_named = !options.family.empty() || family_of_layout(options.layout) || family_of_config(options.config);
  report.layout_given = !options.layout.empty();
  report.config_given = !options.config.empty();

  if (report.family == model_family::flux) {
    const std::optional<flux_layout> detected = detect_flux_layout(names);
    if (detected) report.detected = std::string(layout_name(*detected));
    const std::optional<flux_layout> layout =
        report.layout_given ? std::optional(parse_flux_layout(options.layout)) : detected;
    if (!layout) return report;
    report.layout = std::string(layout_name(*layout));
    best_config(
        report, known_configs(), options.config,
        [&](const flux_config& config) { return check_flux_tensors(config, *layout, shapes); },
        [&](const flux_config& config) { return flux_expected_tensors(config, *layout); });
    return report;
  }

  // detect_wan_layout alone would call FLUX bfl names official (single_blocks.N.modulation.lin): some names must be
  // Wan's own.
  const std::optional<wan_layout> detected =
      family_score(names, model_family::wan) > 0 ? detect_wan_layout(names) : std::nullopt;
  if (detected) report.detected = std::string(layout_name(*detected));
  const std::optional<wan_layout> layout =
      report.layout_given ? std::optional(parse_wan_layout(options.layout)) : detected;
  if (!layout) return report;
  report.layout = std::string(layout_name(*layout));
  const auto check = [&](const wan_config& config) { return check_wan_tensors(config, *layout, shapes); };
  const auto expected = [&](const wan_config& config) { return wan_expected_tensors(config, *layout); };
  report.wan = best_config(report, known_wan_configs(), options.config, check, expected);
  // No released size matches: the sizes the shapes imply, when they are complete enough and check better.
  if (!report.config_given && !report.keys.ok())
    if (const std::optional<wan_config> inferred = infer_wan_config(shapes, *layout)) {
      flux_key_report keys = check(*inferred);
      if (problem_count(keys) < problem_count(report.keys)) {
        report.config = "inferred";
        report.keys = std::move(keys);
        report.expected_count = expected(*inferred).size();
        report.wan = inferred;
      }
    }
  return report;
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
  out["family"] = checked ? nlohmann::json(std::string(family_name(report.family))) : nullptr;
  out["detected_layout"] = report.detected ? nlohmann::json(*report.detected) : nullptr;
  out["layout"] = checked ? nlohmann::json(*report.layout) : nullptr;
  out["config"] = checked ? nlohmann::json(report.config) : nullptr;
  out["sizes"] = checked && report.wan ? wan_sizes_json(*report.wan) : nullptr;
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

  const bool flux = report.family == model_family::flux;
  if (!report.layout) {
    if (report.family_named)
      row("layout", flux ? "none: not a FLUX transformer checkpoint (no bfl or diffusers key names)"
                         : "none: not a Wan transformer checkpoint (no official or diffusers key names)");
    else
      row("layout",
          "none: not a FLUX transformer checkpoint (no bfl or diffusers key names), nor a Wan one (no official or "
          "diffusers key names)");
  } else {
    const std::string& name = *report.layout;
    row("family", std::string(family_name(report.family)) + " (" + std::string(family_title(report.family)) + ")");
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
    if (report.wan) row("sizes", wan_sizes_text(*report.wan));
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
  CLI::App* weights = app.add_subcommand("weights",
                                         "List the tensors of a safetensors checkpoint and check them against a FLUX "
                                         "or Wan transformer layout and config");
  weights->add_option("file", options->file, "A .safetensors file or a sharded checkpoint's *.safetensors.index.json")
      ->required()
      ->type_name("FILE");
  weights
      ->add_option("--family", options->family,
                   "Transformer family to check against (default: named by --layout / --config, else detected)")
      ->check(CLI::IsMember({"flux", "wan"}))
      ->type_name("flux|wan");
  weights
      ->add_option("--layout", options->layout,
                   "Weight layout to check against: FLUX bfl or diffusers, Wan official or diffusers "
                   "(default: detected)")
      ->check(CLI::IsMember({"bfl", "official", "diffusers"}))
      ->type_name("bfl|official|diffusers");
  weights
      ->add_option("--config", options->config,
                   "Config to check against: FLUX dev, schnell, tiny; Wan t2v-1.3b, t2v-14b, tiny (default: whichever "
                   "of the family's matches best; for Wan else the sizes the shapes imply)")
      ->check(CLI::IsMember({"dev", "schnell", "t2v-1.3b", "t2v-14b", "tiny"}))
      ->type_name("NAME");
  weights->add_flag("--json", options->json, "Print one JSON object instead of a table");
  weights->callback([options] { run_weights(*options); });
}

}  // namespace branchgrpo::cli
