#pragma once
// The autograd policy: any differentiable LibTorch velocity model (the native FLUX transformer, a wrapped
// torch::jit::Module, a test MLP) as a trainable Policy<torch_backend> for the core trainer
// (training/trainer.hpp).
//
//   rollout   policy(x, batch) = model.velocity(x, batch) under torch::NoGradGuard
//   update    accumulate(edges, grad_fn), per batch of kept edges of one step:
//               v = model.velocity(x)                                   (with autograd)
//               mean = backend.affine(x_coeff, x, velocity_coeff, v)    (the rollout's function)
//               logp_r = backend.row_log_prob_tensor(next, mean, std)   (the rollout's function, float64)
//               w = grad_fn(logp)                                       (the trainer's PPO weights)
//               grad += d/dtheta sum_r w_r logp_r                       (backward; accumulates over batches)
//             apply_update(): grad-norm clipping, AdamW step, zero grads, EMA (on float32 masters of 16-bit
//             trainable tensors, copied into the model after each step: master_weights).
//   reference reference_velocity(x, batch): the frozen base (adapters off, no gradient) for models with
//             set_adapters_enabled (LoRA): the policy is then a ReferencePolicy, and train_iteration applies the
//             loss's KL term (ppo_options::kl_beta) through accumulate, as for every other policy.
//
// The update recomputes log-probs with the same two backend functions the rollout used, so an edge's
// log-prob before the first optimizer step equals the rollout's bit for bit when the model is batch-invariant
// (iteration_stats::first_update_log_prob_gap == 0); the trainer uses the recomputed value as the old
// log-prob of the first update anyway, so that update's ratio is exactly 1 in every case.
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/optim.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// A differentiable velocity model: velocity(x, batch) for x of shape [rows, latent...] returns the velocity
/// of the same shape (any floating dtype; the backend casts); trainable_parameters() are the leaf tensors
/// the optimizer updates (LoRA factors, or every weight for full fine-tuning).
template <class M>
concept TorchVelocityModel = requires(M& m, const torch::Tensor& x, const denoise_batch& b) {
  { m.velocity(x, b) } -> std::same_as<torch::Tensor>;
  { m.trainable_parameters() } -> std::same_as<std::vector<torch::Tensor>>;
};

/// A model whose adapters can be switched off, giving the frozen base (the KL reference).
template <class M>
concept AdapterSwitch = requires(M& m, bool enabled) {
  m.set_adapters_enabled(enabled);
};

/// The autograd policy's hyperparameters. Defaults: optimizer_options' (AdamW lr 1e-5, weight decay 1e-4,
/// DanceGRPO's FLUX recipe; gradient-norm clip 1.0; no EMA). The KL weight is the loss's (ppo_options::kl_beta).
struct autograd_policy_options {
  optimizer_options optimizer = {};  ///< AdamW, gradient clipping and EMA; a config's [optimizer]
  bool bf16_autocast = false;        ///< CUDA only: matmuls and attention in autocast_dtype (no-op on CPU)
  /// Trainable tensors stored in a 16-bit dtype get float32 master copies: AdamW's step, its moments, the
  /// gradient sum over the update's batches and the EMA are float32, and each step rounds the masters into the
  /// model's tensors (DanceGRPO's, MixGRPO's and BranchGRPO's setup: bf16 compute, fp32 weights). Off: everything
  /// in the model's dtype, where an update below half a bf16 ulp of a weight is lost. No effect on float32 and float64
  /// tensors.
  bool master_weights = true;
  torch::Dtype autocast_dtype = torch::kBFloat16;  ///< the 16-bit dtype of bf16_autocast (bfloat16 or float16)

  friend bool operator==(const autograd_policy_options&, const autograd_policy_options&) = default;
};

/// What one apply_update did.
struct policy_update_report {
  std::int64_t rows = 0;  ///< edges accumulated since the previous update (0: no step was taken)
  double grad_norm = 0;   ///< global gradient norm before clipping (PPO + KL)
  int steps = 0;          ///< optimizer steps taken so far
};

/// A TorchVelocityModel as Policy<torch_backend> (and Denoiser<torch_backend>); with AdapterSwitch also
/// ReferencePolicy<torch_backend>.
/// Example: a model whose adapters start as zero (LoRA B = 0) -> before any update, accumulate returns the
///   rollout's log-probs exactly and reference_velocity equals the velocity (KL 0); after apply_update with a
///   non-zero PPO weight, only trainable_parameters() changed, and the KL is positive.
/// @pre `model` outlives the policy; its trainable_parameters() are leaf tensors with requires_grad and stay
///      the same tensors; options valid (the optimizer obeys its rules), else invalid_input.
/// @post apply_update throws invalid_input (and zeroes the gradient, taking no step) when the gradient norm
///       is not finite: a NaN never reaches the weights silently.
template <TorchVelocityModel Model>
class autograd_policy {
 public:
  autograd_policy(Model& model, torch_backend backend, autograd_policy_options options = {})
      : model_(&model), backend_(backend), options_(options), parameters_(model.trainable_parameters()) {
    validate_parameters(options.optimizer, "optimizer");
    require(!parameters_.empty(), "the model has no trainable parameters");
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      require(parameters_[i].defined() && parameters_[i].is_leaf() && parameters_[i].requires_grad(),
              "trainable parameter ", i, " is not a leaf tensor that requires grad");
    masters_ = parameters_;
    if (options.master_weights) {
      torch::NoGradGuard no_grad;
      for (torch::Tensor& master : masters_)
        if (master.scalar_type() == torch::kBFloat16 || master.scalar_type() == torch::kHalf) {
          master = master.detach().to(torch::kFloat32).clone();
          master.set_requires_grad(true);
        }
    }
    optimizer_ = make_adamw(masters_, options.optimizer);
    ema_.decay = options.optimizer.ema_decay;
    if (options.optimizer.ema_decay > 0) ema_.reset(masters_);
  }

  /// The rollout's velocity, without autograd.
  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    torch::NoGradGuard no_grad;
    const autocast_guard autocast(options_.bf16_autocast, backend_.device, options_.autocast_dtype);
    return model_->velocity(x, batch);
  }

  /// The frozen base's velocity (adapters off), without autograd: the reference of the loss's KL term.
  torch::Tensor reference_velocity(const torch::Tensor& x, const denoise_batch& batch) requires AdapterSwitch<Model> {
    torch::NoGradGuard no_grad;
    const autocast_guard autocast(options_.bf16_autocast, backend_.device, options_.autocast_dtype);
    adapters_off off(*model_);
    return model_->velocity(x, batch);
  }

  /// Log-probs of the batch's rows under the current parameters; adds d/dtheta sum_r w_r logp_r (w from
  /// `gradient`) to the parameters' gradients.
  std::vector<double> accumulate(const edge_batch<torch::Tensor>& edges, const loss_gradient_fn& gradient) {
    const std::int64_t rows = backend_.rows(edges.x);
    require(backend_.rows(edges.next) == rows && static_cast<std::int64_t>(edges.std.size()) == rows &&
                static_cast<std::int64_t>(edges.trees.size()) == rows &&
                static_cast<std::int64_t>(edges.prompts.size()) == rows,
            "edge batch at step ", edges.step, " is inconsistent: ", rows, " parents, ", backend_.rows(edges.next),
            " children, ", edges.std.size(), " stds, ", edges.trees.size(), " trees, ", edges.prompts.size(),
            " prompts");
    if (rows == 0) return {};
    const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
    torch::Tensor mean, log_probs;
    {
      const autocast_guard autocast(options_.bf16_autocast, backend_.device, options_.autocast_dtype);
      // affine checks that the velocity has the shape of x.
      const torch::Tensor velocity = model_->velocity(edges.x, batch);
      mean = backend_.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, velocity);
      log_probs = backend_.row_log_prob_tensor(edges.next, mean, edges.std);
    }
    const torch::Tensor host = log_probs.detach().to(torch::kCPU).contiguous();
    std::vector<double> values(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());

    const std::vector<double> weights = gradient(values);
    require(static_cast<std::int64_t>(weights.size()) == rows, "loss gradient returned ", weights.size(),
            " weights for ", rows, " rows");
    for (std::size_t r = 0; r < weights.size(); ++r)
      require(std::isfinite(weights[r]), "loss gradient weight[", r, "] = ", weights[r], " at step ", edges.step);

    const torch::Tensor w =
        torch::tensor(weights, torch::TensorOptions().dtype(torch::kFloat64)).to(log_probs.device());
    (w * log_probs).sum().backward();
    move_gradients_to_masters();
    rows_ += rows;
    return values;
  }

  /// DataParallelPolicy: the accumulated gradient and row count become their sums over the communicator's ranks
  /// (a parameter without a gradient on this rank counts as zeros), so every rank takes the same step. A
  /// communicator that reduces tensors (c10d) reduces them on their device; any other goes through host doubles.
  template <Communicator C>
  void all_reduce_gradients(C& communicator) {
    double rows = static_cast<double>(rows_);
    communicator.all_reduce_sum(std::span<double>(&rows, 1));
    rows_ = static_cast<std::int64_t>(rows);
    std::vector<torch::Tensor> gradients;
    for (torch::Tensor& parameter : masters_) {
      if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
      gradients.push_back(parameter.grad());
    }
    if constexpr (requires { communicator.all_reduce_sum(gradients); }) {
      communicator.all_reduce_sum(gradients);
    } else {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> flat;
      for (const torch::Tensor& g : gradients) flat.push_back(g.detach().to(torch::kCPU, torch::kFloat64).flatten());
      torch::Tensor host = torch::cat(flat).contiguous();
      communicator.all_reduce_sum(std::span<double>(host.data_ptr<double>(), static_cast<std::size_t>(host.numel())));
      std::int64_t at = 0;
      for (torch::Tensor& g : gradients) {
        g.copy_(host.narrow(0, at, g.numel()).view(g.sizes()));
        at += g.numel();
      }
    }
  }

  /// One optimizer step on the accumulated gradient, after clipping to max_grad_norm; then zeroes the gradient
  /// and updates the EMA. No step when nothing was accumulated (by any rank, after all_reduce_gradients).
  policy_update_report apply_update() {
    policy_update_report report{.rows = rows_, .grad_norm = 0, .steps = steps_};
    if (rows_ == 0) return report;
    report.grad_norm = clip_gradient_norm(masters_, options_.optimizer.max_grad_norm);
    const bool finite = std::isfinite(report.grad_norm);
    if (finite) optimizer_->step();
    optimizer_->zero_grad();
    rows_ = 0;
    require(finite, "gradient norm is ", report.grad_norm, " after ", report.rows,
            " rows; the update was skipped (a non-finite loss weight or model output?)");
    copy_masters_to_model();
    if (options_.optimizer.ema_decay > 0) ema_.update(masters_);
    report.steps = ++steps_;
    last_update_ = report;
    return report;
  }

  /// Mean KL_r of the edges to the frozen base under the current parameters (kl_flow per row; no gradient,
  /// nothing accumulated).
  double kl_divergence(const edge_batch<torch::Tensor>& edges) requires AdapterSwitch<Model> {
    torch::NoGradGuard no_grad;
    const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
    const torch::Tensor mean =
        backend_.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, (*this)(edges.x, batch));
    const torch::Tensor reference =
        backend_.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, reference_velocity(edges.x, batch));
    const torch::Tensor std = torch::tensor(edges.std, torch::TensorOptions().dtype(torch::kFloat64)).to(mean.device());
    const torch::Tensor squares = (mean.to(torch::kFloat64) - reference.to(torch::kFloat64)).square().flatten(1);
    return (squares.mean(1) / (2.0 * std.square())).mean().item<double>();
  }

  /// Exchanges the trainable weights with their EMA (evaluate, then call again to restore).
  /// @pre ema_decay > 0 (else invalid_input).
  void swap_ema() {
    require(options_.optimizer.ema_decay > 0, "swap_ema needs optimizer.ema_decay > 0");
    ema_.swap(masters_);
    copy_masters_to_model();
  }

  /// Sets the trainable weights (masters and model tensors) to `values`, in trainable_parameters() order.
  /// @pre one tensor of each trainable tensor's shape (else invalid_input naming the index).
  void load_weights(std::span<const torch::Tensor> values) {
    require(values.size() == masters_.size(), "load_weights got ", values.size(), " tensors for ", masters_.size(),
            " trainable");
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      require(values[i].sizes() == masters_[i].sizes(), "load_weights: tensor ", i, " has shape ", values[i].sizes(),
              ", the trainable tensor ", masters_[i].sizes());
      masters_[i].copy_(values[i]);
    }
    copy_masters_to_model();
  }

  [[nodiscard]] const std::vector<torch::Tensor>& ema_parameters() const { return ema_.shadow; }
  /// The model's trainable tensors (in its dtype).
  [[nodiscard]] const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  /// What the optimizer updates: the float32 masters of 16-bit trainable tensors (master_weights), the model's own
  /// tensors otherwise; the optimizer state and the EMA belong to these.
  [[nodiscard]] const std::vector<torch::Tensor>& master_parameters() const { return masters_; }
  [[nodiscard]] bool has_master_copies() const {
    for (std::size_t i = 0; i < masters_.size(); ++i)
      if (!masters_[i].is_same(parameters_[i])) return true;
    return false;
  }
  [[nodiscard]] const autograd_policy_options& options() const { return options_; }
  [[nodiscard]] const torch_backend& backend() const { return backend_; }
  [[nodiscard]] const policy_update_report& last_update() const { return last_update_; }
  [[nodiscard]] torch::optim::AdamW& optimizer() { return *optimizer_; }
  [[nodiscard]] Model& model() { return *model_; }

 private:
  // Switches the model's adapters off for a scope, back on at its end (also when the model throws).
  struct adapters_off {
    Model& model;
    explicit adapters_off(Model& m) : model(m) { model.set_adapters_enabled(false); }
    ~adapters_off() { model.set_adapters_enabled(true); }
    adapters_off(const adapters_off&) = delete;
    adapters_off& operator=(const adapters_off&) = delete;
  };

  // The backward pass left gradients on the model's 16-bit tensors: add them to the masters' float32 sums, so that
  // the sum over an update's batches does not round at 8 bits.
  void move_gradients_to_masters() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      if (masters_[i].is_same(parameters_[i]) || !parameters_[i].grad().defined()) continue;
      const torch::Tensor gradient = parameters_[i].grad().to(torch::kFloat32);
      if (masters_[i].grad().defined())
        masters_[i].mutable_grad().add_(gradient);
      else
        masters_[i].mutable_grad() = gradient.clone();
      parameters_[i].mutable_grad() = torch::Tensor();
    }
  }

  void copy_masters_to_model() {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters_.size(); ++i)
      if (!masters_[i].is_same(parameters_[i])) parameters_[i].copy_(masters_[i]);
  }

  Model* model_;
  torch_backend backend_;
  autograd_policy_options options_;
  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> masters_;  // parameters_[i] itself, or its float32 master copy
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  ema_weights ema_;
  std::int64_t rows_ = 0;
  int steps_ = 0;
  policy_update_report last_update_;
};

}  // namespace branchgrpo
