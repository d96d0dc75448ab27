#pragma once
// What the LibTorch iteration benches (flux.cpp, wan.cpp, sd3.cpp) share, so that a model family adds only its
// transformer, its FLOP count and its report line:
//
//   bench_device(--device), bench_dtype(--dtype)   the flags as LibTorch values, one line naming a bad one
//   start_torch_bench(options)                     both benches' checked options: nodes, device, dtype, backend
//   lora_slots                                     several variants' LoRA values on one shared transformer
//   lora_bench_model<Denoiser>                     one variant's Policy<torch_backend>, synchronized per call
//   bench_lora(options)                            the adapters every bench trains (attention and MLP)
//   make_shared_bench_model<T>(options, ...)       a random-weights bench's one transformer, denoiser and slots
//   run_shared_bench(options, started, shared, ...) its variants through the harness, FLOPs attached
//   latent_energy_reward                           -mean(x^2) of the leaf latents (no decoder, no reward model)
//   peak_memory_hook                               the CUDA caching allocator's peak over each iteration
//   parameter_count(module)                        the module's parameters with its adapters
//   require_rollout_fits(...)                      a CPU model's rollout latents against the memory budget
//
// Built only with LibTorch (tools/CMakeLists.txt); BRANCHGRPO_BENCH_CUDA_STATS is defined for a CUDA build of
// LibTorch, whose caching allocator reports the peak device memory.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "cli/bench/harness.hpp"
#include "cli/options/memory_budget.hpp"
#ifdef BRANCHGRPO_BENCH_CUDA_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace branchgrpo::cli {

/// --device as a LibTorch device.
/// Example: "cpu" -> CPU; "cuda:1" without CUDA -> invalid_input "--device cuda:1: CUDA is not available ...";
///   "tpu" -> "--device 'tpu' is not a device (expected cpu, cuda or cuda:N)".
inline torch::Device bench_device(const std::string& text) {
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

/// --dtype of the weights. Example: "bfloat16" -> kBFloat16; "half" -> "--dtype 'half' is not float32 or bfloat16".
inline torch::Dtype bench_dtype(const std::string& text) {
  if (text == "float32") return torch::kFloat32;
  if (text == "bfloat16") return torch::kBFloat16;
  fail("--dtype '", echo_text(text), "' is not float32 or bfloat16");
}

/// What both LibTorch benches take from their options before building a model.
struct torch_bench_setup {
  std::int64_t nodes;     ///< nodes per tree of the widest variant (validate_bench_options)
  torch::Device device;   ///< --device
  torch::Dtype dtype;     ///< --dtype of the weights
  std::size_t variants;   ///< the variants run side by side
  torch_backend backend;  ///< latents in float32 (log-probs float64) whatever the weights' dtype
};

/// The options checked in the order every bench reports them: the harness's, --device, --dtype, --peak-tflops.
inline torch_bench_setup start_torch_bench(const bench_options& options) {
  const std::int64_t nodes = validate_bench_options(options, 0);
  const torch::Device device = bench_device(options.device);
  const torch::Dtype dtype = bench_dtype(options.dtype);
  require(options.peak_tflops > 0, "--peak-tflops must be positive, got ", options.peak_tflops);
  return {.nodes = nodes,
          .device = device,
          .dtype = dtype,
          .variants = bench_variants(options).size(),
          .backend = {.device = device, .dtype = torch::kFloat32}};
}

/// Waits for the device's queued kernels, so that a call's time is its own (CUDA runs asynchronously).
inline void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

/// Several variants training their own LoRA adapters on one shared transformer (its frozen base weights stored
/// once): activate(v) saves the active variant's adapter values and loads v's. Each variant's AdamW state lives in
/// its own optimizer, keyed by the same (live) tensors.
/// Example: slots(lora_parameters(model), 2); train variant 0; activate(1) -> the adapters hold variant 1's
///   initial values again; activate(0) -> variant 0's trained values.
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

/// One variant's Policy<torch_backend>: a denoiser over a transformer with LoRA and its own autograd policy (AdamW
/// lr 1e-3 without weight decay, clipping at 1; the rate does not change the timing). With `slots`, the variant's
/// adapter values are made active before every call; without, the variant owns its transformer. Every call waits
/// for the device. Movable; the policy keeps a reference to the denoiser, which lives behind a shared_ptr.
template <class Denoiser>
class lora_bench_model {
 public:
  lora_bench_model(std::shared_ptr<Denoiser> denoiser, torch_backend backend, std::shared_ptr<lora_slots> slots = {},
                   std::size_t slot = 0)
      : denoiser_(std::move(denoiser)), slots_(std::move(slots)), slot_(slot), backend_(backend) {
    activate();  // the policy's optimizer must see this variant's values
    policy_ = std::make_unique<autograd_policy<Denoiser>>(
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

  std::shared_ptr<Denoiser> denoiser_;
  std::shared_ptr<lora_slots> slots_;  // null: this variant owns its transformer
  std::size_t slot_ = 0;
  torch_backend backend_;
  std::unique_ptr<autograd_policy<Denoiser>> policy_;
};

/// The adapters every bench trains: rank --rank with alpha = rank, on attention and MLP, seeded by --seed.
inline lora_options bench_lora(const bench_options& options) {
  return {.rank = options.lora_rank,
          .alpha = static_cast<double>(options.lora_rank),
          .attention = true,
          .mlp = true,
          .modulation = false,
          .embedding = false,
          .seed = options.seed};
}

/// What a random-weights bench (flux, wan) builds once and every variant shares: the transformer of `config`
/// (seeded by --seed, in --dtype on --device, gradient checkpointing as asked, LoRA as bench_lora), its denoiser
/// (`make_denoiser(transformer)`, which draws the random prompts), the variants' LoRA slots, and the set-up time.
template <class Transformer, class Denoiser>
struct shared_bench_model {
  std::shared_ptr<Transformer> transformer;
  std::shared_ptr<Denoiser> denoiser;
  std::shared_ptr<lora_slots> slots;
  double setup_seconds = 0;

  /// Variant `v`'s Policy<torch_backend> over the shared transformer.
  [[nodiscard]] lora_bench_model<Denoiser> variant(const torch_backend& backend, std::size_t v) const {
    return lora_bench_model<Denoiser>(denoiser, backend, slots, v);
  }
};
template <class Transformer, class Config, class MakeDenoiser>
auto make_shared_bench_model(const bench_options& options, const torch_bench_setup& started, const Config& config,
                             MakeDenoiser&& make_denoiser) {
  torch::manual_seed(options.seed);
  const auto start = bench_clock::now();
  auto transformer = std::make_shared<Transformer>(config);
  transformer->to(started.device, started.dtype);
  transformer->set_gradient_checkpointing(options.gradient_checkpointing);
  add_lora(*transformer, bench_lora(options));
  auto denoiser = make_denoiser(transformer);
  auto slots = std::make_shared<lora_slots>(lora_parameters(*transformer), started.variants);
  synchronize(started.device);
  return shared_bench_model<Transformer, typename decltype(denoiser)::element_type>{
      .transformer = std::move(transformer),
      .denoiser = std::move(denoiser),
      .slots = std::move(slots),
      .setup_seconds = seconds_since(start)};
}

/// -mean(x^2) per leaf latent: a random transformer has no decoder, and a real reward model's cost is not what
/// the harness measures. Example: leaves [[1, 1], [0, 2]] -> {-1, -2}.
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

/// A random-weights bench's runs: every variant of `shared` (shared_bench_model) through the harness on `shape`
/// with latent_energy_reward, --prompts random prompts and the peak-memory hook, each run carrying `flops` per
/// forward row (what report_runs prints).
template <class Shared>
std::vector<variant_run> run_shared_bench(const bench_options& options, const torch_bench_setup& started,
                                          const Shared& shared, const latent_shape& shape, double flops) {
  const auto make_model = [&](std::size_t v) { return shared.variant(started.backend, v); };
  std::vector<variant_run> runs = run_harness<torch_backend>(
      options, make_model, latent_energy_reward{}, shape, options.prompts, peak_memory_hook{.device = started.device});
  for (variant_run& run : runs) run.forward_flops = flops;
  return runs;
}

/// Parameters of a module, adapters included.
inline std::int64_t parameter_count(torch::nn::Module& model) {
  std::int64_t n = 0;
  for (const torch::Tensor& p : model.parameters()) n += p.numel();
  return n;
}

/// On the CPU, the rollout's latents against the memory budget before any is built: per node of a tree its latent
/// with its noise, mean and update copies in float32, times --prompts trees. On CUDA nothing (the device's memory
/// is not the host's; the run reports its peak instead).
/// Example: --prompts 2000000000 with a 16 x 4 x 8 x 8 latent -> invalid_input "--prompts = 2000000000 with a
///   16 x 4 x 8 x 8 latent: the rollout of 219-node trees needs about ... (limit: ...)".
inline void require_rollout_fits(const bench_options& options, std::int64_t nodes, const latent_shape& shape,
                                 const torch::Device& device) {
  if (!device.is_cpu()) return;
  std::string dims;
  for (std::size_t a = 0; a < shape.dims.size(); ++a) dims += (a ? " x " : "") + std::to_string(shape.dims[a]);
  const double latent_bytes = 4.0 * 4 * static_cast<double>(shape.elements());
  require_fits(static_cast<double>(options.prompts) * static_cast<double>(nodes) * latent_bytes,
               setting_text("--prompts", options.prompts) + " with a " + dims + " latent",
               "the rollout of " + std::to_string(nodes) + "-node trees");
}

}  // namespace branchgrpo::cli
