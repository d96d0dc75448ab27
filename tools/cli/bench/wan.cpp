#include "cli/bench/wan.hpp"

#include <array>
#include <cstdint>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/wan/denoiser.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"
#include "cli/bench/harness.hpp"
#include "cli/bench/torch_bench.hpp"

namespace branchgrpo::cli {
namespace {

/// One variant: the shared Wan denoiser with this variant's adapters active and its own autograd policy
/// (torch_bench.hpp).
using wan_bench_model = lora_bench_model<wan_denoiser>;
static_assert(Policy<wan_bench_model, torch_backend>);

std::string latent_text(const std::array<std::int64_t, 4>& d) {
  return std::to_string(d[0]) + " x " + std::to_string(d[1]) + " x " + std::to_string(d[2]) + " x " +
         std::to_string(d[3]);
}

/// --latent C,F,H,W, else the model's default; C must be the config's latent channels.
/// Example: {} for wan -> {16, 5, 30, 52}; {4, 8, 8} -> invalid_input "--latent must be C,F,H,W with C = 16 ...".
std::array<std::int64_t, 4> bench_latent(const bench_options& options, const wan_config& config) {
  if (options.latent.empty()) return options.model == "wan" ? wan_latent : wan_tiny_latent;
  const std::vector<std::int64_t>& d = options.latent;
  std::string given;
  for (std::size_t i = 0; i < d.size(); ++i) given += (i ? "," : "") + std::to_string(d[i]);
  require(d.size() == 4 && d[0] == config.in_dim, "--latent must be C,F,H,W with C = ", config.in_dim,
          " (the config's latent channels) for --model ", options.model, ", got ", given);
  return {d[0], d[1], d[2], d[3]};
}

}  // namespace

void run_wan_iteration_bench(const bench_options& options) {
  const torch_bench_setup started = start_torch_bench(options);
  const std::int64_t nodes = started.nodes;
  const torch::Device& device = started.device;
  const torch_backend& backend = started.backend;
  const wan_config config = options.model == "wan" ? wan_config::t2v_1_3b() : wan_bench_tiny_config();
  const std::array<std::int64_t, 4> dims = bench_latent(options, config);
  const latent_shape shape{{dims.begin(), dims.end()}};
  require_rollout_fits(options, nodes, shape, device);

  // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
  // Every prompt padded to text_len by the model: random features of that length, the cost of any prompt.
  const auto shared = make_shared_bench_model<wan_transformer>(options, started, config, [&](const auto& transformer) {
    const torch::Tensor text = torch::randn({options.prompts, config.text_len, config.text_dim}).to(device);
    return std::make_shared<wan_denoiser>(transformer, text);
  });
  const double setup = shared.setup_seconds;
  const std::int64_t tokens = wan_tokens(config, dims);
  const double flops = wan_forward_flops(config, tokens);
  if (!options.json)
    std::cout << options.model << ": random "
              << (options.model == "wan" ? "Wan2.1-T2V-1.3B-size" : "wan_bench_tiny_config()") << " weights ("
              << static_cast<double>(parameter_count(*shared.transformer)) / 1e9 << " B parameters with LoRA rank "
              << options.lora_rank << "), latent " << latent_text(dims) << " (" << tokens << " video + "
              << config.text_len << " text tokens), " << options.device << ' ' << options.dtype
              << (options.gradient_checkpointing ? ", gradient checkpointing" : "") << "; reward -mean(x^2); "
              << flops / 1e12 << " TFLOP per forward row; set-up " << setup << " s\n";
  const auto make_model = [&](std::size_t v) { return shared.variant(backend, v); };
  std::vector<variant_run> runs = run_harness<torch_backend>(options, make_model, latent_energy_reward{}, shape,
                                                             options.prompts, peak_memory_hook{.device = device});
  for (variant_run& run : runs) run.forward_flops = flops;
  report_runs(runs, options);
}

}  // namespace branchgrpo::cli
