#include "cli/bench_flux.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
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
#include "cli/bench_harness.hpp"
#include "cli/shipped_model.hpp"
#ifdef BRANCHGRPO_BENCH_CUDA_STATS  // a CUDA build of LibTorch (tools/CMakeLists.txt): the caching allocator's stats
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace branchgrpo::cli {
namespace {

// --- Options ----------------------------------------------------------------------------------------------------

torch::Device bench_device(const std::string& text) {
  std::optional<torch::Device> device;
  try {
    device = torch::Device(text);
  } catch (const std::exception&) {  // c10::Error: a multi-line message with a backtrace
    fail("--device '", echo_text(text), "' is not a device (expected cpu, cuda or cuda:N)");
  }
  require(!device->is_cuda() || torch::cuda::is_available(), "--device ", echo_text(text),
          ": CUDA is not available in this build or on this machine");
  require(device->is_cpu() || device->is_cuda(), "--device ", echo_text(text), ": expected cpu, cuda or cuda:N");
  return *device;
}

torch::Dtype bench_dtype(const std::string& text) {
  if (text == "float32") return torch::kFloat32;
  if (text == "bfloat16") return torch::kBFloat16;
  fail("--dtype '", echo_text(text), "' is not float32 or bfloat16");
}

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

// --- The model of one variant -------------------------------------------------------------------------------------

/// Several variants training their own LoRA adapters on one shared transformer (its frozen base weights stored
/// once): activate(v) saves the active variant's adapter values and loads v's. Each variant's AdamW state lives in
/// its own optimizer, keyed by the same (live) tensors.
class lora_slots {
 public:
  lora_slots(std::vector<torch::Tensor> live, std::size_t variants) : live_(std::move(live)) {
    for (std::size_t v = 0; v < variants; ++v) {
      saved_.emplace_back();
      for (const torch::Tensor& t : live_) saved_.back().push_back(t.detach().clone());
    }
  }

  void activate(std::size_t variant) {
    if (variant == active_) return;
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < live_.size(); ++i) {
      saved_[active_][i].copy_(live_[i]);
      live_[i].copy_(saved_[variant][i]);
    }
    active_ = variant;
  }

 private:
  std::vector<torch::Tensor> live_;
  std::vector<std::vector<torch::Tensor>> saved_;
  std::size_t active_ = 0;
};

/// Waits for the device's queued kernels, so that a call's time is its own (CUDA runs asynchronously).
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

/// One variant's Policy<torch_backend>: a FLUX transformer with LoRA, its denoiser and an autograd policy
/// (AdamW lr 1e-3 without weight decay, clipping at 1; the rate does not change the timing). Movable; the policy keeps
/// a reference to the denoiser, which lives behind a shared_ptr.
class flux_bench_model {
 public:
  flux_bench_model(std::shared_ptr<flux_transformer> transformer, std::shared_ptr<flux_denoiser> denoiser,
                   torch_backend backend, std::shared_ptr<lora_slots> slots, std::size_t slot)
      : transformer_(std::move(transformer)),
        denoiser_(std::move(denoiser)),
        slots_(std::move(slots)),
        slot_(slot),
        backend_(backend) {
    activate();  // the policy's parameter list and optimizer must see this variant's values
    policy_ = std::make_unique<autograd_policy<flux_denoiser>>(
        *denoiser_, backend_,
        autograd_policy_options{.optimizer = {.lr = 1e-3, .weight_decay = 0, .max_grad_norm = 1.0}});
  }

  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    activate();
    torch::Tensor v = (*policy_)(x, batch);
    synchronize(backend_.device);
    return v;
  }

  std::vector<double> accumulate(const edge_batch<torch::Tensor>& edges, const loss_gradient_fn& gradient) {
    activate();
    std::vector<double> log_probs = policy_->accumulate(edges, gradient);
    synchronize(backend_.device);  // the backward is still running
    return log_probs;
  }

  void apply_update() {
    activate();
    policy_->apply_update();
    synchronize(backend_.device);
  }

  [[nodiscard]] const torch_backend& backend() const { return backend_; }

 private:
  void activate() {
    if (slots_) slots_->activate(slot_);
  }

  std::shared_ptr<flux_transformer> transformer_;
  std::shared_ptr<flux_denoiser> denoiser_;
  std::shared_ptr<lora_slots> slots_;  // null: this variant owns its transformer
  std::size_t slot_ = 0;
  torch_backend backend_;
  std::unique_ptr<autograd_policy<flux_denoiser>> policy_;
};

static_assert(Policy<flux_bench_model, torch_backend>);

/// -mean(x^2) per leaf latent: the random FLUX transformer has no decoder, and a real reward model's cost is
/// not what this benchmark measures.
struct latent_energy_reward {
  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> /*prompts*/) const {
    const torch::Tensor e =
        (-leaves.detach().to(torch::kCPU, torch::kFloat64).square().flatten(1).mean(1)).contiguous();
    return std::vector<double>(e.data_ptr<double>(), e.data_ptr<double>() + e.numel());
  }
};

/// The peak of the CUDA caching allocator over each training iteration (reset before it); nothing elsewhere.
struct peak_memory_hook {
  torch::Device device;
  void operator()(variant_run& run, bool begin) const {
    if (!device.is_cuda()) return;
#ifdef BRANCHGRPO_BENCH_CUDA_STATS
    synchronize(device);
    const auto index = static_cast<c10::DeviceIndex>(device.has_index() ? device.index() : c10::cuda::current_device());
    if (begin) {
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
      return;
    }
    // allocated_bytes[0]: StatType::AGGREGATE (every pool), in LibTorch 1.13 and 2.x alike.
    const std::int64_t peak = c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[0].peak;
    run.peak_memory = std::max(run.peak_memory.value_or(0), peak);
#else
    (void)run;
    (void)begin;
#endif
  }
};

lora_options bench_lora(const bench_options& options) {
  return {.rank = options.lora_rank,
          .alpha = static_cast<double>(options.lora_rank),
          .attention = true,
          .mlp = true,
          .modulation = false,
          .embedding = false,
          .seed = options.seed};
}

std::int64_t image_tokens(const latent_shape& shape) {
  const std::int64_t h = shape.dims[1], w = shape.dims[2];
  return ((h + h % 2) / 2) * ((w + w % 2) / 2);  // 2 x 2 patches, odd sizes padded
}

std::int64_t parameter_count(flux_transformer& model) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : model.parameters()) n += p.numel();
  return n;
}

}  // namespace

void run_flux_iteration_bench(const bench_options& options) {
  // Host memory is checked here for the toy-sized parts; a model on the CPU is checked below once the latent is known.
  const std::int64_t nodes = validate_bench_options(options, 0);
  const torch::Device device = bench_device(options.device);
  const torch::Dtype dtype = bench_dtype(options.dtype);
  require(options.peak_tflops > 0, "--peak-tflops must be positive, got ", options.peak_tflops);
  const std::size_t variants = bench_variants(options).size();
  // Latents and log-probs in float32 / float64 whatever the weights' dtype (the denoiser casts to the weights').
  const torch_backend backend{.device = device, .dtype = torch::kFloat32};
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
      auto denoiser = std::make_shared<flux_denoiser>(transformer, embeddings);
      return flux_bench_model(std::move(transformer), std::move(denoiser), backend, nullptr, 0);
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
    if (device.is_cpu()) {  // each node's latent with its noise, mean and update copies, float32
      const double latent_bytes = 4.0 * 4 * static_cast<double>(dims[0] * dims[1] * dims[2]);
      require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * latent_bytes,
                   setting_text("--prompts", options.prompts) + " with a " + std::to_string(dims[0]) + " x " +
                       std::to_string(dims[1]) + " x " + std::to_string(dims[2]) + " latent",
                   "the rollout of " + std::to_string(nodes) + "-node trees");
    }
    // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
    torch::manual_seed(options.seed);
    const auto start = bench_clock::now();
    auto transformer = std::make_shared<flux_transformer>(config);
    transformer->to(device, dtype);
    transformer->set_gradient_checkpointing(options.gradient_checkpointing);
    add_lora(*transformer, bench_lora(options));
    const auto on_device = torch::TensorOptions().device(device);
    const prompt_embeddings embeddings{
        .context = torch::randn({options.prompts, options.text_tokens, config.context_in}).to(on_device),
        .pooled = torch::randn({options.prompts, config.vec_in}).to(on_device)};
    auto denoiser = std::make_shared<flux_denoiser>(transformer, embeddings);
    auto slots = std::make_shared<lora_slots>(lora_parameters(*transformer), variants);
    synchronize(device);
    const double setup = seconds_since(start);
    const double flops = flux_forward_flops(config, image_tokens(shape), options.text_tokens);
    about << "flux: random " << options.flux_config << " weights ("
          << static_cast<double>(parameter_count(*transformer)) / 1e9 << " B parameters with LoRA rank "
          << options.lora_rank << "), latent " << dims[0] << " x " << dims[1] << " x " << dims[2] << " ("
          << image_tokens(shape) << " image + " << options.text_tokens << " text tokens), " << options.device << ' '
          << options.dtype << (options.gradient_checkpointing ? ", gradient checkpointing" : "")
          << "; reward -mean(x^2); " << flops / 1e12 << " TFLOP per forward row; set-up " << setup << " s\n";
    const auto make_model = [&](std::size_t v) { return flux_bench_model(transformer, denoiser, backend, slots, v); };
    runs = run_harness<torch_backend>(options, make_model, latent_energy_reward{}, shape, options.prompts, hook);
    for (variant_run& run : runs) run.forward_flops = flops;
  }
  if (!options.json) std::cout << about.str();
  report_runs(runs, options);
}

}  // namespace branchgrpo::cli
