// `branchgrpo export-lora CHECKPOINT --format diffusers|kohya|comfyui [--ema] [--dtype bf16|fp16|fp32] [--merge]
// --output FILE.safetensors`: a training checkpoint's LoRA in the key layout diffusers, kohya-style trainers or
// ComfyUI load (torch/lora_export.hpp), or with --merge the whole transformer W + (alpha / rank) B A in our layout.
// docs/cli.md "export-lora" has the formats and what was checked against diffusers.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "branchgrpo/app/model_families.hpp"
#include "branchgrpo/app/training_run.hpp"
#include "branchgrpo/config/config_text.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/torch/checkpoint.hpp"
#include "branchgrpo/torch/lora_export.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/runs/signals.hpp"

namespace branchgrpo::cli {
namespace {

struct export_lora_options {
  std::string checkpoint;
  std::string format;  // "" only with --merge
  bool ema = false;
  std::string dtype;  // "": as the checkpoint stores the tensors
  bool merge = false;
  std::string config;  // --merge: the run's TOML that locates the base model; "": the checkpoint's config.toml
  std::string output;
};

// "bf16" -> kBFloat16; "" -> nullopt (keep the stored dtype); anything else names the value.
std::optional<torch::Dtype> export_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kFloat16;
  if (name == "fp32") return torch::kFloat32;
  fail("--dtype ", echo_text(name), ": expected bf16, fp16 or fp32");
}

std::string dtype_text(torch::Dtype dtype) {
  return dtype == torch::kBFloat16  ? "bf16"
         : dtype == torch::kFloat16 ? "fp16"
         : dtype == torch::kFloat32 ? "fp32"
                                    : "other";
}

// The checkpoint's trainable tensors, or with --ema their EMA shadows ("ema.<name>" in the state), by name.
std::map<std::string, torch::Tensor> exported_weights(const checkpoint_contents& contents, bool ema,
                                                      const std::string& checkpoint) {
  if (!ema) return contents.weights;
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, tensor] : contents.state)
    if (name.starts_with("ema.")) out.emplace(name.substr(4), tensor);
  require(!out.empty(), "--ema: ", path_text(checkpoint),
          " has no EMA weights (no ema.* tensors: the run had optimizer.ema_decay = 0)");
  return out;
}

// Refuses base weights other than those the run trained on: the checkpoint's config stored each input's size and
// XXH64 ("# input model.dir/model.safetensors = ..."); a moved model is found through --config.
void check_base_inputs(const run_config& config, const std::string& stored_text, const std::string& checkpoint) {
  std::map<std::string, std::string> stored;
  for (auto& [key, value] : config_entries(stored_text)) stored.emplace(std::move(key), std::move(value));
  for (const auto& [key, path] : config_inputs(config)) {
    if (key != "model.dir/model.safetensors" && key != "model.weights") continue;
    const auto it = stored.find("input " + key);
    if (it == stored.end()) continue;  // a config stored without checksums: nothing to compare
    const std::string now = config_text_detail::toml_string(config_text_detail::input_identity(path));
    require(now == it->second, "--merge: the base model ", path_text(path.string()), " is ", now, ", the run of ",
            path_text(checkpoint), " trained on ", it->second, " (pass --config with the run's TOML to locate it)");
  }
}

void export_lora(const export_lora_options& options) {
  const std::optional<torch::Dtype> dtype = export_dtype(options.dtype);
  std::optional<lora_export_format> format;
  if (!options.format.empty()) format = parse_lora_export_format(options.format);
  require(options.merge || format.has_value(),
          "--format is required (diffusers, kohya or comfyui) "
          "unless --merge writes the whole transformer");
  require(!(options.merge && format.has_value()),
          "--merge writes the whole transformer in its own "
          "layout (bfl names for FLUX, official for Wan): drop --format ",
          options.format);

  const checkpoint_contents contents = read_checkpoint(options.checkpoint);
  const std::map<std::string, torch::Tensor> weights = exported_weights(contents, options.ema, options.checkpoint);
  const std::map<std::string, lora_adapter> adapters = lora_adapters_of(weights);
  std::map<std::string, std::string> metadata = {{"branchgrpo.source_checkpoint", options.checkpoint},
                                                 {"branchgrpo.iteration", std::to_string(contents.iteration)},
                                                 {"branchgrpo.weights", options.ema ? "ema" : "trained"}};

  if (adapters.empty()) {
    // Full fine-tuning: the checkpoint already holds every weight of the transformer, which --merge writes as is.
    require(options.merge, path_text(options.checkpoint),
            " is a full fine-tuning checkpoint (no lora_A / lora_B tensors): there is no LoRA to export; "
            "--merge writes its whole transformer");
    std::map<std::string, torch::Tensor> out;
    for (const auto& [name, tensor] : weights) out[name] = tensor.to(dtype.value_or(tensor.scalar_type())).contiguous();
    metadata.emplace("format", "branchgrpo-merged");
    save_safetensors(options.output, out, metadata);
    std::cout << "wrote " << options.output << ": " << out.size() << " tensors of the fine-tuned transformer\n";
    return;
  }

  const model_spec* family = lora_family_of(adapters);
  if (family == nullptr) {
    std::string families;  // "FLUX (bfl) nor Wan (official)": each family of model_spec_table in its native layout
    for (const model_spec& spec : model_spec_table)
      families +=
          (families.empty() ? "" : " nor ") + std::string(spec.label) + " (" + std::string(spec.layouts[0]) + ")";
    fail(path_text(options.checkpoint), ": the LoRA layers are neither ", families, " module names");
  }
  if (format) check_lora_export_format(*family, *format);  // before reading the config: a usage error first
  require(!contents.config_text.empty(), path_text(options.checkpoint),
          " stores no config.toml: its LoRA alpha is unknown");
  const std::filesystem::path stored_source = std::filesystem::path(options.checkpoint) / "config.toml";
  const run_config stored = parse_run_config(contents.config_text, stored_source.string(), ".");
  const std::int64_t rank = adapters.begin()->second.down.size(0);
  const double alpha = stored.lora.alpha;
  metadata.insert({{"branchgrpo.family", std::string(family->label)},
                   {"branchgrpo.rank", std::to_string(rank)},
                   {"branchgrpo.alpha", branchgrpo::detail::run_number_text(alpha)}});
  const torch::Dtype stored_dtype = adapters.begin()->second.down.scalar_type();
  metadata.emplace("branchgrpo.dtype", dtype_text(dtype.value_or(stored_dtype)));

  if (options.merge) {
    // The base model's paths are relative to the directory of the config that named them: --config's, else the
    // working directory's (the stored text keeps them as written; its checksums catch a wrong guess).
    const run_config located = options.config.empty() ? stored : load_run_config(options.config);
    check_base_inputs(located, contents.config_text, options.checkpoint);
    const auto merged = merge_lora_tensors(run_base_weights(located), adapters, alpha, dtype);
    metadata.emplace("format", "branchgrpo-merged");
    save_safetensors(options.output, merged, metadata);
    std::cout << "wrote " << options.output << ": the " << family->label << " transformer with " << adapters.size()
              << " LoRA layers merged (rank " << rank << ", alpha " << branchgrpo::detail::run_number_text(alpha)
              << ")\n";
    return;
  }
  metadata.emplace("format", "branchgrpo-lora-" + std::string(lora_export_format_name(*format)));
  for (const lora_export_file& file : lora_export_files(adapters, *family, options.output)) {
    const auto tensors = export_lora_tensors(file.adapters, *file.family, *format, alpha, dtype);
    std::map<std::string, std::string> file_metadata = metadata;
    if (!file.module.empty()) file_metadata.emplace("branchgrpo.module", file.module);
    save_safetensors(file.path, tensors, file_metadata);
    std::cout << "wrote " << file.path << ": " << file.adapters.size() << " LoRA layers of the " << family->label
              << " transformer" << (file.module.empty() ? "" : "'s " + file.module) << " as "
              << lora_export_format_name(*format) << " (" << tensors.size() << " tensors, rank " << rank << ", alpha "
              << branchgrpo::detail::run_number_text(alpha) << ")\n";
  }
}

// Every usage error of the command starts with its name: "export-lora: --format kohya: Wan models export as ...".
void run_export_lora(const export_lora_options& options) {
  try {
    export_lora(options);
  } catch (const invalid_input& error) {
    throw invalid_input(std::string("export-lora: ") + error.what());
  }
}

}  // namespace

void add_export_lora_command(CLI::App& app) {
  auto options = std::make_shared<export_lora_options>();
  CLI::App* command = app.add_subcommand("export-lora", "Write a checkpoint's LoRA for diffusers, kohya or ComfyUI");
  command->add_option("checkpoint", options->checkpoint, "A checkpoint directory (run.output_dir/checkpoints/iter-N)")
      ->required()
      ->type_name("DIR");
  command->add_option("--format", options->format, "diffusers, kohya (FLUX only) or comfyui")->type_name("FORMAT");
  command->add_flag("--ema", options->ema, "Export the EMA weights (ema.* of a run with optimizer.ema_decay > 0)");
  command->add_option("--dtype", options->dtype, "bf16, fp16 or fp32 (default: the checkpoint's dtype)")
      ->type_name("DTYPE");
  command->add_flag("--merge", options->merge,
                    "Write the whole transformer with the LoRA merged (W + alpha / rank B A), in our layout");
  command
      ->add_option("--config", options->config,
                   "--merge: the run's TOML locating the base model (default: the checkpoint's config.toml, "
                   "paths relative to the working directory)")
      ->type_name("FILE");
  command->add_option("--output", options->output, "The .safetensors file to write")->required()->type_name("FILE");
  command->callback([options] {
    const stop_signals stop;  // SIGINT / SIGTERM: one line and exit 128 + signal at the next layer
    run_export_lora(*options);
  });
}

}  // namespace branchgrpo::cli
