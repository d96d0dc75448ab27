#include "cli/bench/sd3.hpp"

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/sd3/spec.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/sd3/denoiser.hpp"
#include "branchgrpo/torch/sd3/transformer.hpp"
#include "cli/bench/harness.hpp"
#include "cli/bench/torch_bench.hpp"

namespace branchgrpo::cli {
namespace {

/// One variant: the shared SD3 denoiser with this variant's adapters active and its own autograd policy.
using sd3_bench_model = lora_bench_model<sd3_denoiser>;
static_assert(Policy<sd3_bench_model, torch_backend>);

/// --latent C,H,W, else sd3-tiny's 16 x 16 cells or --height x --width / 8 for sd3; C must be the config's
/// in_channels and H, W multiples of the patch.
/// Example: sd3 at 1024 x 1024 -> {16, 128, 128}; --latent 4,8,8 for sd3 -> invalid_input "--latent must be C,H,W
///   with C = 16 ...".
std::vector<std::int64_t> bench_latent(const bench_options& options, const sd3_config& config) {
  std::vector<std::int64_t> d = options.latent;
  if (d.empty()) {
    if (options.model == "sd3-tiny") return {config.in_channels, 16, 16};
    require(options.height >= 16 && options.height % 16 == 0 && options.width >= 16 && options.width % 16 == 0,
            "--height and --width must be positive multiples of 16 for --model sd3, got ", options.height, " x ",
            options.width);
    return {config.in_channels, options.height / 8, options.width / 8};
  }
  std::string given;
  for (std::size_t i = 0; i < d.size(); ++i) given += (i ? "," : "") + std::to_string(d[i]);
  require(d.size() == 3 && d[0] == config.in_channels && d[1] >= config.patch && d[1] % config.patch == 0 &&
              d[2] >= config.patch && d[2] % config.patch == 0,
          "--latent must be C,H,W with C = ", config.in_channels, " and H, W multiples of ", config.patch,
          " for --model ", options.model, ", got ", given);
  return d;
}

}  // namespace

void run_sd3_iteration_bench(const bench_options& options) {
  const torch_bench_setup started = start_torch_bench(options);
  const torch::Device& device = started.device;
  const sd3_config config = named_sd3_config(options.model == "sd3" ? "sd3.5-medium" : "sd3-tiny");
  const std::vector<std::int64_t> dims = bench_latent(options, config);
  const latent_shape shape{dims};
  require_rollout_fits(options, started.nodes, shape, device);

  // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
  const auto shared = make_shared_bench_model<sd3_transformer>(options, started, config, [&](const auto& transformer) {
    const auto on_device = torch::TensorOptions().device(device);
    const prompt_embeddings embeddings{
        .context = torch::randn({options.prompts, options.text_tokens, config.context_in}).to(on_device),
        .pooled = torch::randn({options.prompts, config.pooled_in}).to(on_device)};
    return std::make_shared<sd3_denoiser>(transformer, prompt_table(embeddings));
  });
  const std::int64_t image_tokens = (dims[1] / config.patch) * (dims[2] / config.patch);
  const double flops = sd3_forward_flops(config, image_tokens, options.text_tokens);
  if (!options.json)
    std::cout << options.model << ": random " << (options.model == "sd3" ? "SD3.5-Medium-size" : "sd3-tiny")
              << " weights (" << static_cast<double>(parameter_count(*shared.transformer)) / 1e9
              << " B parameters with LoRA rank " << options.lora_rank << "), latent " << dims[0] << " x " << dims[1]
              << " x " << dims[2] << " (" << image_tokens << " image + " << options.text_tokens << " text tokens), "
              << options.device << ' ' << options.dtype
              << (options.gradient_checkpointing ? ", gradient checkpointing" : "") << "; reward -mean(x^2); "
              << flops / 1e12 << " TFLOP per forward row; set-up " << shared.setup_seconds << " s\n";
  report_runs(run_shared_bench(options, started, shared, shape, flops), options);
}

}  // namespace branchgrpo::cli
