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
//             apply_update(): grad-norm clipping, AdamW step, zero grads, EMA, in the gradient mode chosen once from
//             options.sharding (gradient_modes/: replicated, with master_weights' float32 masters; ZeRO-1; ZeRO-2).
//   reference reference_velocity(x, batch): the frozen base (adapters off, no gradient) for models with
//             set_adapters_enabled (LoRA): the policy is then a ReferencePolicy, and train_iteration applies the
//             loss's KL term (ppo_options::kl_beta) through accumulate, as for every other policy.
//
// The update recomputes log-probs with the same two backend functions the rollout used, so an edge's
// log-prob before the first optimizer step equals the rollout's bit for bit when the model is batch-invariant
// (iteration_stats::first_update_log_prob_gap == 0); the trainer uses the recomputed value as the old
// log-prob of the first update anyway, so that update's ratio is exactly 1 in every case.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/gradient_modes/gradient_mode.hpp"
#include "branchgrpo/torch/gradient_modes/replicated.hpp"
#include "branchgrpo/torch/gradient_modes/zero1.hpp"
#include "branchgrpo/torch/gradient_modes/zero2.hpp"
#include "branchgrpo/torch/optim.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/sharding.hpp"

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
  /// ZeRO-1 / ZeRO-2 over the communicator the policy is built with (training/sharding.hpp); none: every rank
  /// keeps everything, as without it. Sharded, the master of every 16-bit tensor is float32 (master_weights is
  /// implied), and a tensor without a gradient on any rank counts as zeros (it is stepped: weight decay applies).
  sharding_options sharding = {};

  friend bool operator==(const autograd_policy_options&, const autograd_policy_options&) = default;
};

/// The bytes of training state a policy holds on this rank, read off its tensors' storages (each storage counted
/// once): what sharding divides. Example: full fine-tuning of a float32 model of P parameters, unsharded, after a
/// step: parameters 4P, gradients 4P, optimizer 8P (AdamW's two moments; + 4P with an EMA); ZeRO-1 on N ranks:
/// parameters 4P + 4P / N (the working weights and this rank's masters), gradients 4P, optimizer 8P / N; ZeRO-2:
/// gradients 4P / N.
struct policy_memory {
  double parameters = 0;  ///< trainable tensors (the model's working copies) and their float32 masters
  /// The gradient an update carries: the bytes in gradient buffers when its last backward pass ended (the full
  /// gradient; under ZeRO-2 this rank's sums, 4 / N bytes a parameter), the most over the updates since the last
  /// reset_memory_peak().
  double gradients = 0;
  /// The most bytes held in gradient buffers at any moment since the last reset_memory_peak(): `gradients` plus what
  /// is in flight (under ZeRO-2 the buckets waiting for a tensor and one tensor's .grad; under ZeRO-1 a piece).
  double gradients_peak = 0;
  double optimizer = 0;  ///< AdamW's moments and the EMA's shadows
};

/// What one apply_update did.
struct policy_update_report {
  std::int64_t rows = 0;  ///< edges accumulated since the previous update (0: no step was taken)
  double grad_norm = 0;   ///< global gradient norm before clipping (PPO + KL)
  int steps = 0;          ///< optimizer steps taken so far
};

namespace detail {

// The group of one process, for policies built without a communicator (stateless: one instance serves all).
inline single_process& one_process() {
  static single_process one;
  return one;
}

}  // namespace detail

/// A TorchVelocityModel as Policy<torch_backend> (and Denoiser<torch_backend>); with AdapterSwitch also
/// ReferencePolicy<torch_backend>. C is the type of the group the policy is built for (single_process without
/// one): its gradient mode (gradient_modes/gradient_mode.hpp), chosen once from options.sharding, holds it.
/// Example: a model whose adapters start as zero (LoRA B = 0) -> before any update, accumulate returns the
///   rollout's log-probs exactly and reference_velocity equals the velocity (KL 0); after apply_update with a
///   non-zero PPO weight, only trainable_parameters() changed, and the KL is positive.
/// @pre `model` outlives the policy; its trainable_parameters() are leaf tensors with requires_grad and stay
///      the same tensors; options valid (the optimizer obeys its rules), else invalid_input.
/// @post apply_update throws invalid_input (and zeroes the gradient, taking no step) when the gradient norm
///       is not finite: a NaN never reaches the weights silently.
template <TorchVelocityModel Model, Communicator C = single_process>
class autograd_policy {
 public:
  /// The gradient modes, by options.sharding.mode: none, optimizer (ZeRO-1), gradients (ZeRO-2).
  using gradient_mode = std::variant<gradient_modes::replicated, gradient_modes::zero1<C>, gradient_modes::zero2<C>>;
  static_assert(gradient_modes::GradientMode<gradient_modes::replicated> &&
                    gradient_modes::ShardedGradientMode<gradient_modes::zero1<C>, C> &&
                    gradient_modes::ShardedGradientMode<gradient_modes::zero2<C>, C>,
                "every alternative of gradient_mode must model GradientMode (gradient_modes/gradient_mode.hpp)");

  autograd_policy(Model& model, torch_backend backend,
                  autograd_policy_options options = {}) requires std::same_as<C, single_process>
      : autograd_policy(model, backend, options, detail::one_process()) {}

  /// The policy of rank communicator.rank() of its group: with options.sharding, this rank keeps its shard of the
  /// optimizer state, and all_reduce_gradients / apply_update / swap_ema / load_weights are collectives over
  /// `communicator` (every rank calls them in the same order).
  /// Example: autograd_policy policy(model, backend, {.sharding = {.mode = sharding_mode::gradients}}, comm) on 2
  ///   ranks: optimizer_state_elements() is half the one-rank policy's (to within one chunk's rounding).
  /// With sharding_mode::gradients (ZeRO-2) the gradient is reduced to its owners bucket by bucket during each
  /// backward pass (a hook on every trainable tensor), so no rank holds the whole gradient; every rank must then
  /// make the same number of accumulate calls per update (train_iteration pads with pad_accumulate()).
  /// @pre `communicator` outlives the policy; the model's trainable tensors live on one device and, sharded, have
  ///      one master dtype (float32 for 16-bit and float32 tensors) (else invalid_input).
  autograd_policy(Model& model, torch_backend backend, autograd_policy_options options, C& communicator)
      : model_(&model),
        backend_(backend),
        options_(options),
        parameters_(checked_parameters(model, options)),
        mode_(choose_mode(parameters_, options, communicator)),
        optimizer_(make_adamw(optimized(), options.optimizer)) {
    ema_.decay = options.optimizer.ema_decay;
    if (options.optimizer.ema_decay > 0) ema_.reset(optimized());
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
    if (rows == 0) {  // no backward pass; with ZeRO-2 the collectives of one all the same
      pad_accumulate();
      return {};
    }
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
    const torch::Tensor loss = (w * log_probs).sum();
    std::visit([&](auto& mode) { mode.backward(loss); }, mode_);
    rows_ += rows;
    return values;
  }

  /// PaddedAccumulationPolicy: an accumulate without rows. With ZeRO-2 (sharding_mode::gradients) the backward
  /// pass's bucket reductions are collectives, so every rank must make the same number of accumulate calls per
  /// update: a rank with fewer edges makes up the difference with this, which takes part in one backward pass's
  /// collectives with zeros. Otherwise nothing.
  void pad_accumulate() {
    std::visit([](auto& mode) { mode.pad(); }, mode_);
  }

  /// DataParallelPolicy: the accumulated gradient and row count become their sums over the communicator's ranks
  /// (a parameter without a gradient on this rank counts as zeros), so every rank takes the same step. A
  /// communicator that reduces tensors (c10d) reduces them on their device; any other goes through host doubles.
  /// Sharded: `communicator` is the group the policy was built for (else invalid_input).
  template <Communicator Comm>
  void all_reduce_gradients(Comm& communicator) {
    double rows = static_cast<double>(rows_);
    communicator.all_reduce_sum(std::span<double>(&rows, 1));
    rows_ = static_cast<std::int64_t>(rows);
    std::visit([&](auto& mode) { mode.all_reduce_gradients(communicator); }, mode_);
  }

  /// One optimizer step on the accumulated gradient, after clipping to max_grad_norm; then zeroes the gradient
  /// and updates the EMA. No step when nothing was accumulated (by any rank, after all_reduce_gradients).
  policy_update_report apply_update() {
    policy_update_report report{.rows = rows_, .grad_norm = 0, .steps = steps_};
    if (rows_ == 0) return report;
    return std::visit([&](auto& mode) { return step(mode, report); }, mode_);
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
    std::visit(
        [&](auto& mode) {
          ema_.swap(mode.optimized());
          mode.publish();
        },
        mode_);
  }

  /// Sets the trainable weights (masters and model tensors) to `values`, in trainable_parameters() order.
  /// @pre one tensor of each trainable tensor's shape (else invalid_input naming the index).
  void load_weights(std::span<const torch::Tensor> values) {
    const std::vector<torch::Tensor>& masters = master_parameters();
    require(values.size() == masters.size(), "load_weights got ", values.size(), " tensors for ", masters.size(),
            " trainable");
    for (std::size_t i = 0; i < masters.size(); ++i)
      require(values[i].sizes() == masters[i].sizes(), "load_weights: tensor ", i, " has shape ", values[i].sizes(),
              ", the trainable tensor ", masters[i].sizes());
    std::visit([&](auto& mode) { mode.load(values); }, mode_);
  }

  /// Sharded: sets this rank's float32 masters to `pieces` (aligned with shard_masters(), in their shapes or flat),
  /// then all-gathers every rank's into the model's tensors: a sharded resume, each rank having read only its own
  /// range. A collective: every rank calls it.
  /// @pre one tensor per piece of that piece's element count (else invalid_input naming the piece).
  void load_shard_masters(std::span<const torch::Tensor> pieces) {
    require(sharded(), "load_shard_masters got ", pieces.size(), " tensors for 0 pieces of the shard");
    sharded_part()->load_pieces(pieces);
  }

  /// The EMA of master_parameters(), or sharded, of shard_masters().
  [[nodiscard]] const std::vector<torch::Tensor>& ema_parameters() const { return ema_.shadow; }
  [[nodiscard]] bool sharded() const { return sharded_part() != nullptr; }
  /// Sharded: this rank's range of the flat buffer of trainable tensors (unsharded: an empty range of one rank).
  [[nodiscard]] const flat_shard& shard() const {
    static const flat_shard none{};
    return sharded() ? sharded_part()->shard() : none;
  }
  /// Sharded: the float32 masters of this rank's range, one per trainable tensor it overlaps (what AdamW steps).
  [[nodiscard]] const std::vector<torch::Tensor>& shard_masters() const {
    static const std::vector<torch::Tensor> none;
    return sharded() ? sharded_part()->masters() : none;
  }
  /// Sharded: full tensors, one per trainable tensor in its shape and the master dtype, from tensors aligned with
  /// shard_masters() on every rank (the masters themselves, AdamW's moments, the EMA): what a checkpoint stores at
  /// any world size. A collective: every rank calls it.
  /// Example: 2 ranks, trainable tensors [3] and [2] (chunk 3): rank 0 passes {[a, b, c]}, rank 1 {[d, e]} ->
  ///   {[a, b, c], [d, e]} on both.
  std::vector<torch::Tensor> gather_pieces(std::span<const torch::Tensor> per_piece) {
    require(sharded(), "gather_pieces needs a sharded policy");
    return sharded_part()->gather_pieces(per_piece);
  }
  /// Sharded: this rank's pieces of full tensors (one per trainable tensor, in order), shaped as shard_masters():
  /// the inverse of gather_pieces (a resume scatters a checkpoint's full tensors with it). No collective.
  /// @pre full tensors of the trainable tensors' element counts (else invalid_input naming the index).
  [[nodiscard]] std::vector<torch::Tensor> pieces_of(std::span<const torch::Tensor> full) const {
    require(sharded(), "pieces_of got ", full.size(), " tensors for ", parameters_.size(), " trainable");
    return sharded_part()->pieces_of(full);
  }
  /// The sum of `value` over the ranks the policy is sharded over (itself with one rank or unsharded). A
  /// collective when sharded over several ranks.
  double sum_over_ranks(double value) { return sharded() ? sharded_part()->sum_over_ranks(value) : value; }

  /// The training state's bytes on this rank (policy_memory), measured from the tensors it holds now; the gradient
  /// peak since the last reset_memory_peak().
  [[nodiscard]] policy_memory memory() {
    gradient_modes::storage_bytes held;
    policy_memory out;
    for (const torch::Tensor& t : parameters_) out.parameters += held.add(t);
    for (const torch::Tensor& t : optimized()) out.parameters += held.add(t);
    for (const auto& [key, state] : optimizer_->state()) {
      const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
      out.optimizer += held.add(adamw.exp_avg()) + held.add(adamw.exp_avg_sq()) + held.add(adamw.max_exp_avg_sq());
    }
    for (const torch::Tensor& t : ema_.shadow) out.optimizer += held.add(t);
    std::visit(
        [&](const auto& mode) {
          out.gradients = mode.gradient_state();
          out.gradients_peak = mode.gradient_peak();
        },
        mode_);
    return out;
  }
  /// Starts a new gradient peak (policy_memory::gradients_peak) from the bytes held now.
  void reset_memory_peak() {
    std::visit([](auto& mode) { mode.reset_peak(); }, mode_);
  }

  /// Elements of AdamW's moment tensors on this rank (exp_avg and exp_avg_sq; 0 before the first step): sharded
  /// over N ranks, about 1/N of the unsharded policy's.
  [[nodiscard]] std::int64_t optimizer_state_elements() {
    std::int64_t elements = 0;
    for (const auto& [key, state] : optimizer_->state()) {
      const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
      elements += adamw.exp_avg().numel() + adamw.exp_avg_sq().numel();
    }
    return elements;
  }
  /// The model's trainable tensors (in its dtype).
  [[nodiscard]] const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  /// What the optimizer updates: the float32 masters of 16-bit trainable tensors (master_weights), the model's own
  /// tensors otherwise; the optimizer state and the EMA belong to these.
  /// Sharded: the model's own tensors (the float32 masters are shard_masters()).
  [[nodiscard]] const std::vector<torch::Tensor>& master_parameters() const {
    return std::visit([](const auto& mode) -> const std::vector<torch::Tensor>& { return mode.master_parameters(); },
                      mode_);
  }
  [[nodiscard]] bool has_master_copies() const {
    const std::vector<torch::Tensor>& masters = master_parameters();
    for (std::size_t i = 0; i < masters.size(); ++i)
      if (!masters[i].is_same(parameters_[i])) return true;
    return false;
  }
  [[nodiscard]] const autograd_policy_options& options() const { return options_; }
  [[nodiscard]] const torch_backend& backend() const { return backend_; }
  [[nodiscard]] const policy_update_report& last_update() const { return last_update_; }
  [[nodiscard]] torch::optim::AdamW& optimizer() { return *optimizer_; }
  [[nodiscard]] Model& model() { return *model_; }
  /// The gradient mode the policy was built with.
  [[nodiscard]] const gradient_mode& mode() const { return mode_; }

 private:
  // Switches the model's adapters off for a scope, back on at its end (also when the model throws).
  struct adapters_off {
    Model& model;
    explicit adapters_off(Model& m) : model(m) { model.set_adapters_enabled(false); }
    ~adapters_off() { model.set_adapters_enabled(true); }
    adapters_off(const adapters_off&) = delete;
    adapters_off& operator=(const adapters_off&) = delete;
  };

  // The model's trainable tensors, once the options and the tensors are checked (before a mode is built on them).
  static std::vector<torch::Tensor> checked_parameters(Model& model, const autograd_policy_options& options) {
    validate_parameters(options.optimizer, "optimizer");
    validate_sharding(options.sharding, "optimizer");  // the config's names: optimizer.sharding
    std::vector<torch::Tensor> parameters = model.trainable_parameters();
    require(!parameters.empty(), "the model has no trainable parameters");
    for (std::size_t i = 0; i < parameters.size(); ++i)
      require(parameters[i].defined() && parameters[i].is_leaf() && parameters[i].requires_grad(),
              "trainable parameter ", i, " is not a leaf tensor that requires grad");
    return parameters;
  }

  // The one place the mode is chosen.
  static gradient_mode choose_mode(const std::vector<torch::Tensor>& parameters, const autograd_policy_options& options,
                                   C& communicator) {
    switch (options.sharding.mode) {
      case sharding_mode::optimizer:
        return gradient_modes::zero1<C>(parameters, communicator);
      case sharding_mode::gradients:
        return gradient_modes::zero2<C>(parameters, communicator, options.sharding.bucket_elements());
      default:  // none (validate_sharding refuses parameters)
        return gradient_modes::replicated(parameters, options.master_weights);
    }
  }

  // apply_update's step under `mode`: the global norm, clipping, AdamW, the weights into the model, the EMA.
  template <class Mode>
  policy_update_report step(Mode& mode, policy_update_report report) {
    report.grad_norm = mode.gradient_norm();
    scale_gradients_to_norm(mode.optimized(), report.grad_norm, options_.optimizer.max_grad_norm);
    const bool finite = std::isfinite(report.grad_norm);
    if (finite) optimizer_->step();
    mode.release_gradients();
    optimizer_->zero_grad();
    rows_ = 0;
    require(finite, "gradient norm is ", report.grad_norm, " after ", report.rows,
            " rows; the update was skipped (a non-finite loss weight or model output?)");
    mode.publish();
    if (options_.optimizer.ema_decay > 0) ema_.update(mode.optimized());
    report.steps = ++steps_;
    last_update_ = report;
    return report;
  }

  // The tensors AdamW steps and the EMA follows.
  [[nodiscard]] const std::vector<torch::Tensor>& optimized() const {
    return std::visit([](const auto& mode) -> const std::vector<torch::Tensor>& { return mode.optimized(); }, mode_);
  }
  // The shard of a sharded mode; null for the replicated one.
  [[nodiscard]] gradient_modes::sharded_masters<C>* sharded_part() {
    return std::visit(
        [](auto& mode) -> gradient_modes::sharded_masters<C>* {
          if constexpr (gradient_modes::ShardedGradientMode<std::remove_cvref_t<decltype(mode)>, C>)
            return &mode.shard();
          else
            return nullptr;
        },
        mode_);
  }
  [[nodiscard]] const gradient_modes::sharded_masters<C>* sharded_part() const {
    return const_cast<autograd_policy*>(this)->sharded_part();
  }

  Model* model_;
  torch_backend backend_;
  autograd_policy_options options_;
  std::vector<torch::Tensor> parameters_;
  gradient_mode mode_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;  // over the mode's optimized()
  ema_weights ema_;
  std::int64_t rows_ = 0;
  int steps_ = 0;
  policy_update_report last_update_;
};

/// Without a communicator, the policy of one process.
template <TorchVelocityModel Model>
autograd_policy(Model&, torch_backend) -> autograd_policy<Model>;
template <TorchVelocityModel Model>
autograd_policy(Model&, torch_backend, autograd_policy_options) -> autograd_policy<Model>;
template <TorchVelocityModel Model, Communicator C>
autograd_policy(Model&, torch_backend, autograd_policy_options, C&) -> autograd_policy<Model, C>;

}  // namespace branchgrpo
