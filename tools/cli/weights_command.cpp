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
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/flux/layout.hpp"
#include "branchgrpo/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/output_file.hpp"

namespace branchgrpo::cli {
namespace {

struct weights_options {
  std::string file;
  std::string layout;  // empty: detected from the names
  std::string config;  // empty: the config with the fewest problems
  bool json = false;
};

const std::vector<std::pair<std::string, flux_config>>& known_configs() {
  static const std::vector<std::pair<std::string, flux_config>> configs = {
      {"dev", flux_config::dev()}, {"schnell", flux_config::schnell()}, {"tiny", flux_config::tiny()}};
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

// What the command found, printed as a table or as JSON.
struct weights_report {
  const safetensors_checkpoint* checkpoint = nullptr;
  std::optional<flux_layout> detected;
  std::optional<flux_layout> layout;
  bool layout_given = false;
  std::string config;  // empty when no layout
  bool config_given = false;
  flux_key_report keys;
  std::size_t expected_count = 0;
};

weights_report analyse(const safetensors_checkpoint& checkpoint, const weights_options& options) {
  weights_report report;
  report.checkpoint = &checkpoint;
  std::vector<std::string_view> names;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const safetensors_tensor& tensor : checkpoint.tensors()) {
    names.push_back(tensor.name);
    shapes.emplace(tensor.name, tensor.shape);
  }
  report.detected = detect_flux_layout(names);
  report.layout_given = !options.layout.empty();
  report.layout = report.layout_given ? std::optional(parse_flux_layout(options.layout)) : report.detected;
  if (!report.layout) return report;

  report.config_given = !options.config.empty();
  std::size_t best = static_cast<std::size_t>(-1);
  for (const auto& [name, config] : known_configs()) {
    if (report.config_given && name != options.config) continue;
    flux_key_report keys = check_flux_tensors(config, *report.layout, shapes);
    if (problem_count(keys) < best) {  // ties keep the earlier config: dev before schnell before tiny
      best = problem_count(keys);
      report.config = name;
      report.keys = std::move(keys);
      report.expected_count = flux_expected_tensors(config, *report.layout).size();
    }
  }
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
  out["detected_layout"] = report.detected ? nlohmann::json(std::string(layout_name(*report.detected))) : nullptr;
  out["layout"] = report.layout ? nlohmann::json(std::string(layout_name(*report.layout))) : nullptr;
  out["config"] = report.layout ? nlohmann::json(report.config) : nullptr;
  out["missing"] = report.keys.missing;
  out["unexpected"] = report.keys.unexpected;
  out["mismatched"] = report.keys.mismatched;
  out["ok"] = report.layout ? nlohmann::json(report.keys.ok()) : nullptr;
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
    row("layout", "none: not a FLUX transformer checkpoint (no bfl or diffusers key names)");
  } else {
    const std::string name(layout_name(*report.layout));
    if (!report.layout_given)
      row("layout", name + " (detected)");
    else if (report.detected && *report.detected != *report.layout)
      row("layout", name + " (as given; the names look like " + std::string(layout_name(*report.detected)) + ")");
    else
      row("layout", name + " (as given)");
    row("config", report.config + (report.config_given ? "" : " (best match of dev, schnell, tiny)"));
    const flux_key_report& keys = report.keys;
    if (keys.ok()) {
      row("check", "ok: all " + std::to_string(report.expected_count) + " tensors of " + report.config + " in " + name +
                       ", every shape matching");
    } else {
      row("check", plural(problem_count(keys), "problem") + ": " + std::to_string(keys.missing.size()) + " missing, " +
                       std::to_string(keys.unexpected.size()) + " unexpected, " +
                       plural(keys.mismatched.size(), "shape mismatch") + (keys.mismatched.size() == 1 ? "" : "es"));
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
  CLI::App* weights = app.add_subcommand(
      "weights", "List the tensors of a safetensors checkpoint and check them against a FLUX layout and config");
  weights->add_option("file", options->file, "A .safetensors file or a sharded checkpoint's *.safetensors.index.json")
      ->required()
      ->type_name("FILE");
  weights->add_option("--layout", options->layout, "FLUX weight layout to check against (default: detected)")
      ->check(CLI::IsMember({"bfl", "diffusers"}))
      ->type_name("bfl|diffusers");
  weights
      ->add_option("--config", options->config,
                   "FLUX config to check against (default: whichever of dev, schnell, tiny matches best)")
      ->check(CLI::IsMember({"dev", "schnell", "tiny"}))
      ->type_name("dev|schnell|tiny");
  weights->add_flag("--json", options->json, "Print one JSON object instead of a table");
  weights->callback([options] { run_weights(*options); });
}

}  // namespace branchgrpo::cli
