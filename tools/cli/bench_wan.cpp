#include "cli/bench_wan.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
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
#include "cli/bench_harness.hpp"
#ifdef BRANCHGRPO_BENCH_CUDA_STATS  // a CUDA build of LibTorch (tools/CMakeLists.txt): the caching allocator's stats
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

// The device and dtype options, the shared-transformer LoRA slots, the synchronizing policy wrapper, the reward and
// the peak-memory hook are copies of bench_flux.cpp's (with Wan types), which keeps them in its anonymous namespace;
// a shared torch-side bench header would remove the copies.

namespace branchgrpo::cli {
namespace {

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

/// Waits for the device's queued kernels, so that a call's time is its own (CUDA runs asynchronously).
void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

/// Several variants training their own LoRA adapters on one shared transformer: activate(v) saves the active
/// variant's adapter values and loads v's.
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

/// One variant's Policy<torch_backend>: the shared Wan denoiser with this variant's adapters active and its own
/// autograd policy (AdamW lr 1e-3 without weight decay, clipping at 1). Every call synchronizes the device.
class wan_bench_model {
 public:
  wan_bench_model(std::shared_ptr<wan_denoiser> denoiser, torch_backend backend, std::shared_ptr<lora_slots> slots,
                  std::size_t slot)
      : denoiser_(std::move(denoiser)), slots_(std::move(slots)), slot_(slot), backend_(backend) {
    slots_->activate(slot_);  // the policy's optimizer must see this variant's values
    policy_ = std::make_unique<autograd_policy<wan_denoiser>>(
        *denoiser_, backend_,
        autograd_policy_options{.optimizer = {.lr = 1e-3, .weight_decay = 0, .max_grad_norm = 1.0}});
  }

  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    slots_->activate(slot_);
    torch::Tensor v = (*policy_)(x, batch);
    synchronize(backend_.device);
    return v;
  }

  std::vector<double> accumulate(const edge_batch<torch::Tensor>& edges, const loss_gradient_fn& gradient) {
    slots_->activate(slot_);
    std::vector<double> log_probs = policy_->accumulate(edges, gradient);
    synchronize(backend_.device);  // the backward is still running
    return log_probs;
  }

  void apply_update() {
    slots_->activate(slot_);
    policy_->apply_update();
    synchronize(backend_.device);
  }

  [[nodiscard]] const torch_backend& backend() const { return backend_; }

 private:
  std::shared_ptr<wan_denoiser> denoiser_;
  std::shared_ptr<lora_slots> slots_;
  std::size_t slot_ = 0;
  torch_backend backend_;
  std::unique_ptr<autograd_policy<wan_denoiser>> policy_;
};

static_assert(Policy<wan_bench_model, torch_backend>);

/// -mean(x^2) per leaf latent (no VAE decode or reward model: their cost is not what the harness measures).
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
    const std::int64_t peak = c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[0].peak;
    run.peak_memory = std::max(run.peak_memory.value_or(0), peak);
#else
    (void)run;
    (void)begin;
#endif
  }
};

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

std::int64_t parameter_count(wan_transformer& model) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : model.parameters()) n += p.numel();
  return n;
}

}  // namespace

void run_wan_iteration_bench(const bench_options& options) {
  const std::int64_t nodes = validate_bench_options(options, 0);
  const torch::Device device = bench_device(options.device);
  const torch::Dtype dtype = bench_dtype(options.dtype);
  require(options.peak_tflops > 0, "--peak-tflops must be positive, got ", options.peak_tflops);
  const wan_config config = options.model == "wan" ? wan_config::t2v_1_3b() : wan_bench_tiny_config();
  const std::array<std::int64_t, 4> dims = bench_latent(options, config);
  const latent_shape shape{{dims.begin(), dims.end()}};
  if (device.is_cpu()) {  // each node's latent with its noise, mean and update copies, float32
    const double latent_bytes = 4.0 * 4 * static_cast<double>(shape.elements());
    require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * latent_bytes,
                 setting_text("--prompts", options.prompts) + " with a " + latent_text(dims) + " latent",
                 "the rollout of " + std::to_string(nodes) + "-node trees");
  }
  const std::size_t variants = bench_variants(options).size();
  // Latents float32 and log-probs float64 whatever the weights' dtype (the transformer casts to the weights').
  const torch_backend backend{.device = device, .dtype = torch::kFloat32};

  // One transformer with random weights, shared by every variant; each trains its own adapters (lora_slots).
  torch::manual_seed(options.seed);
  const auto start = bench_clock::now();
  auto transformer = std::make_shared<wan_transformer>(config);
  transformer->to(device, dtype);
  transformer->set_gradient_checkpointing(options.gradient_checkpointing);
  add_lora(*transformer, lora_options{.rank = options.lora_rank,
                                      .alpha = static_cast<double>(options.lora_rank),
                                      .attention = true,
                                      .mlp = true,
                                      .modulation = false,
                                      .embedding = false,
                                      .seed = options.seed});
  // Every prompt padded to text_len by the model: random features of that length, the cost of any prompt.
  const torch::Tensor text = torch::randn({options.prompts, config.text_len, config.text_dim}).to(device);
  auto denoiser = std::make_shared<wan_denoiser>(transformer, text);
  auto slots = std::make_shared<lora_slots>(lora_parameters(*transformer), variants);
  synchronize(device);
  const double setup = seconds_since(start);
  const std::int64_t tokens = wan_tokens(config, dims);
  const double flops = wan_forward_flops(config, tokens);
  if (!options.json)
    std::cout << options.model << ": random "
              << (options.model == "wan" ? "Wan2.1-T2V-1.3B-size" : "wan_bench_tiny_config()") << " weights ("
              << static_cast<double>(parameter_count(*transformer)) / 1e9 << " B parameters with LoRA rank "
              << options.lora_rank << "), latent " << latent_text(dims) << " (" << tokens << " video + "
              << config.text_len << " text tokens), " << options.device << ' ' << options.dtype
              << (options.gradient_checkpointing ? ", gradient checkpointing" : "") << "; reward -mean(x^2); "
              << flops / 1e12 << " TFLOP per forward row; set-up " << setup << " s\n";
  const auto make_model = [&](std::size_t v) { return wan_bench_model(denoiser, backend, slots, v); };
  std::vector<variant_run> runs = run_harness<torch_backend>(options, make_model, latent_energy_reward{}, shape,
                                                             options.prompts, peak_memory_hook{.device = device});
  for (variant_run& run : runs) run.forward_flops = flops;
  report_runs(runs, options);
}

}  // namespace branchgrpo::cli
