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
#include "branchgrpo/model_specs/wan22/config.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/wan/denoiser.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"
#include "branchgrpo/torch/wan22/denoiser.hpp"
#include "branchgrpo/torch/wan22/transformer.hpp"
#include "cli/bench/harness.hpp"
#include "cli/bench/torch_bench.hpp"
#include "cli/bench/wan22.hpp"

namespace branchgrpo::cli {
namespace {

/// One variant: the shared denoiser with this variant's adapters active and its own autograd policy
/// (torch_bench.hpp).
using wan_bench_model = lora_bench_model<wan_denoiser>;
using wan22_bench_model = lora_bench_model<wan22_denoiser>;
static_assert(Policy<wan_bench_model, torch_backend> && Policy<wan22_bench_model, torch_backend>);

std::string latent_text(const std::array<std::int64_t, 4>& d) {
  return std::to_string(d[0]) + " x " + std::to_string(d[1]) + " x " + std::to_string(d[2]) + " x " +
         std::to_string(d[3]);
}

/// --latent C,F,H,W, else the model's default (`full`: wan_latent, else wan_tiny_latent); C must be the config's
/// latent channels.
/// Example: {} for wan -> {16, 5, 30, 52}; {4, 8, 8} -> invalid_input "--latent must be C,F,H,W with C = 16 ...".
std::array<std::int64_t, 4> bench_latent(const bench_options& options, const wan_config& config, bool full) {
  if (options.latent.empty()) return full ? wan_latent : wan_tiny_latent;
  const std::vector<std::int64_t>& d = options.latent;
  std::string given;
  for (std::size_t i = 0; i < d.size(); ++i) given += (i ? "," : "") + std::to_string(d[i]);
  require(d.size() == 4 && d[0] == config.in_dim, "--latent must be C,F,H,W with C = ", config.in_dim,
          " (the config's latent channels) for --model ", options.model, ", got ", given);
  return {d[0], d[1], d[2], d[3]};
}

/// The Wan bench of either family: `Transformer` built from `config` (whose experts have the shape `expert`), its
/// `Denoiser` over random text features, `label` naming the weights in the report.
template <class Transformer, class Denoiser, class Config>
void run_wan_family_bench(const bench_options& options, const Config& config, const wan_config& expert, bool full,
                          const std::string& label) {
  const torch_bench_setup started = start_torch_bench(options);
  const torch::Device& device = started.device;
  const std::array<std::int64_t, 4> dims = bench_latent(options, expert, full);
  const latent_shape shape{{dims.begin(), dims.end()}};
  require_rollout_fits(options, started.nodes, shape, device);

  // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
  // Every prompt padded to text_len by the model: random features of that length, the cost of any prompt.
  const auto shared = make_shared_bench_model<Transformer>(options, started, config, [&](const auto& transformer) {
    const torch::Tensor text = torch::randn({options.prompts, expert.text_len, expert.text_dim}).to(device);
    return std::make_shared<Denoiser>(transformer, text);
  });
  const std::int64_t tokens = wan_tokens(expert, dims);
  const double flops = wan_forward_flops(expert, tokens);  // one expert per call
  if (!options.json)
    std::cout << options.model << ": random " << label << " weights ("
              << static_cast<double>(parameter_count(*shared.transformer)) / 1e9 << " B parameters with LoRA rank "
              << options.lora_rank << "), latent " << latent_text(dims) << " (" << tokens << " video + "
              << expert.text_len << " text tokens), " << options.device << ' ' << options.dtype
              << (options.gradient_checkpointing ? ", gradient checkpointing" : "") << "; reward -mean(x^2); "
              << flops / 1e12 << " TFLOP per forward row; set-up " << shared.setup_seconds << " s\n";
  report_runs(run_shared_bench(options, started, shared, shape, flops), options);
}

}  // namespace

void run_wan_iteration_bench(const bench_options& options) {
  const bool full = options.model == "wan";
  const wan_config config = full ? wan_config::t2v_1_3b() : wan_bench_tiny_config();
  run_wan_family_bench<wan_transformer, wan_denoiser>(options, config, config, full,
                                                      full ? "Wan2.1-T2V-1.3B-size" : "wan_bench_tiny_config()");
}

void run_wan22_iteration_bench(const bench_options& options) {
  const bool full = options.model == "wan22";
  const wan22_config config{.expert = full ? wan_config::t2v_1_3b() : wan_bench_tiny_config()};
  run_wan_family_bench<wan22_transformer, wan22_denoiser>(
      options, config, config.expert, full,
      full ? "two Wan2.1-T2V-1.3B-size experts" : "two wan_bench_tiny_config() experts");
}

}  // namespace branchgrpo::cli
