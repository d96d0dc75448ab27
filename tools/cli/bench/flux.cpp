#include "cli/bench/flux.hpp"

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "cli/bench/harness.hpp"
#include "cli/bench/torch_bench.hpp"
#include "cli/runs/shipped_model.hpp"

namespace branchgrpo::cli {
namespace {

// --- Options ----------------------------------------------------------------------------------------------------

// The shipped model: --model-dir, else ./models/shapes-tiny, else the source tree's (as `branchgrpo demo`).
std::filesystem::path shapes_dir(const bench_options& options) { return shipped_model_dir(options.model_dir); }

flux_config named_flux_config(const std::string& name) {
  if (name == "dev") return flux_config::dev();
  if (name == "schnell") return flux_config::schnell();
  if (name == "tiny") return flux_config::tiny();
  fail("--flux-config '", name, "' is not dev, schnell or tiny");
}

// --- Analytic FLOPs -----------------------------------------------------------------------------------------------

/// Multiply-adds x 2 of one forward of one row: the linear layers (per token, or per row for the modulations
/// and the embedders) and the attention products q k^T and weights v; norms, RoPE and activations are not counted.
/// Example: flux_config::tiny(), 64 image + 8 text tokens -> 2 double and 2 single blocks of 72 tokens.
double flux_forward_flops(const flux_config& c, std::int64_t image_tokens, std::int64_t text_tokens) {
  const auto h = static_cast<double>(c.hidden), m = static_cast<double>(c.mlp_hidden());
  const auto n = static_cast<double>(image_tokens), l = static_cast<double>(text_tokens), s = n + l;
  const auto in = static_cast<double>(c.in_channels);
  double f = 2 * n * in * h + 2 * l * static_cast<double>(c.context_in) * h;  // img_in, txt_in
  f += (c.guidance_embed ? 2 : 1) * 2 * (256 * h + h * h);                    // time_in (+ guidance_in)
  f += 2 * (static_cast<double>(c.vec_in) * h + h * h);                       // vector_in
  const double attention = 2 * 2 * s * s * h;                                 // q k^T and p v, all heads
  const double per_double = 2 * (2 * h * 6 * h)                               // img_mod, txt_mod (per row)
                            + 2 * s * h * 3 * h + 2 * s * h * h               // qkv, proj (both streams)
                            + 2 * s * 2 * h * m + attention;                  // MLPs
  const double per_single = 2 * h * 3 * h                                     // modulation
                            + 2 * s * h * (3 * h + m) + 2 * s * (h + m) * h   // linear1, linear2
                            + attention;
  f += static_cast<double>(c.depth_double) * per_double + static_cast<double>(c.depth_single) * per_single;
  f += 2 * h * 2 * h + 2 * n * h * in;  // final layer: modulation, projection
  return f;
}

/// One variant: the FLUX denoiser with its LoRA and autograd policy (torch_bench.hpp).
using flux_bench_model = lora_bench_model<flux_denoiser>;
static_assert(Policy<flux_bench_model, torch_backend>);

std::int64_t image_tokens(const latent_shape& shape) {
  const std::int64_t h = shape.dims[1], w = shape.dims[2];
  return ((h + h % 2) / 2) * ((w + w % 2) / 2);  // 2 x 2 patches, odd sizes padded
}

}  // namespace

void run_flux_iteration_bench(const bench_options& options) {
  // Host memory is checked here for the toy-sized parts; a model on the CPU is checked below once the latent is known.
  const torch_bench_setup started = start_torch_bench(options);
  const std::int64_t nodes = started.nodes;
  const torch::Device& device = started.device;
  const torch::Dtype dtype = started.dtype;
  const torch_backend& backend = started.backend;
  const peak_memory_hook hook{.device = device};
  std::vector<variant_run> runs;
  std::ostringstream about;

  if (options.model == "flux-tiny") {
    const shapes_model loaded = load_shapes_model(shapes_dir(options));
    const latent_shape shape{{loaded.config.latent_channels(), shapes_image_size, shapes_image_size}};
    const prompt_embeddings embeddings{.context = loaded.embeddings.context.to(device),
                                       .pooled = loaded.embeddings.pooled.to(device)};
    // Each variant: its own transformer with the shipped weights, LoRA, denoiser and policy.
    const auto make_model = [&](std::size_t) {
      auto transformer = std::make_shared<flux_transformer>(loaded.config);
      load_flux_weights(*transformer, loaded.weights);
      transformer->to(device, dtype);
      transformer->set_gradient_checkpointing(options.gradient_checkpointing);
      add_lora(*transformer, bench_lora(options));
      return flux_bench_model(std::make_shared<flux_denoiser>(std::move(transformer), embeddings), backend);
    };
    const weighted_sum reward(
        {{.name = "alignment", .weight = 1.0, .score = shape_alignment{.prompts = loaded.prompts}},
         {.name = "jpeg_compressibility", .weight = 0.1, .score = jpeg_compressibility{}}});
    const auto text = loaded.embeddings.context.size(1);
    const double flops = flux_forward_flops(loaded.config, image_tokens(shape), text);
    about << "flux-tiny: the shipped shapes model (" << shapes_dir(options).string() << "), latent 3 x 16 x 16 ("
          << image_tokens(shape) << " image + " << text << " text tokens), LoRA rank " << options.lora_rank << ", "
          << options.device << ' ' << options.dtype << "; reward alignment + 0.1 x jpeg_compressibility; "
          << flops / 1e9 << " GFLOP per forward row\n";
    runs = run_harness<torch_backend>(options, make_model, reward, shape,
                                      static_cast<std::int64_t>(loaded.prompts.size()), hook);
    for (variant_run& run : runs) run.forward_flops = flops;
  } else {
    const flux_config config = named_flux_config(options.flux_config);
    std::vector<std::int64_t> dims = options.latent;
    if (dims.empty()) {
      require(options.height >= 8 && options.height % 8 == 0 && options.width >= 8 && options.width % 8 == 0,
              "--height and --width must be positive multiples of 8, got ", options.height, " x ", options.width);
      dims = {config.latent_channels(), options.height / 8, options.width / 8};
    }
    require(dims.size() == 3 && dims[0] == config.latent_channels() && dims[1] >= 1 && dims[2] >= 1,
            "--latent must be C,H,W with C = ", config.latent_channels(), " (the config's latent channels), got ",
            dims.size() == 3 ? std::to_string(dims[0]) + "," + std::to_string(dims[1]) + "," + std::to_string(dims[2])
                             : std::to_string(dims.size()) + " values");
    const latent_shape shape{dims};
    require_rollout_fits(options, nodes, shape, device);
    // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
    const auto shared =
        make_shared_bench_model<flux_transformer>(options, started, config, [&](const auto& transformer) {
          const auto on_device = torch::TensorOptions().device(device);
          const prompt_embeddings embeddings{
              .context = torch::randn({options.prompts, options.text_tokens, config.context_in}).to(on_device),
              .pooled = torch::randn({options.prompts, config.vec_in}).to(on_device)};
          return std::make_shared<flux_denoiser>(transformer, embeddings);
        });
    const double setup = shared.setup_seconds;
    const double flops = flux_forward_flops(config, image_tokens(shape), options.text_tokens);
    about << "flux: random " << options.flux_config << " weights ("
          << static_cast<double>(parameter_count(*shared.transformer)) / 1e9 << " B parameters with LoRA rank "
          << options.lora_rank << "), latent " << dims[0] << " x " << dims[1] << " x " << dims[2] << " ("
          << image_tokens(shape) << " image + " << options.text_tokens << " text tokens), " << options.device << ' '
          << options.dtype << (options.gradient_checkpointing ? ", gradient checkpointing" : "")
          << "; reward -mean(x^2); " << flops / 1e12 << " TFLOP per forward row; set-up " << setup << " s\n";
    runs = run_shared_bench(options, started, shared, shape, flops);
  }
  if (!options.json) std::cout << about.str();
  report_runs(runs, options);
}

}  // namespace branchgrpo::cli
