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
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
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

// What a sharded update needs of a communicator, type-erased so that the policy is built once with its group and
// the trainer's calls (all_reduce_gradients, apply_update) stay as they are. A communicator that moves tensors
// (c10d_communicator: reduce_sum_to, all_gather of tensors, all_reduce_sum of tensors) does so on their device;
// any other goes through host doubles and bytes.
struct shard_collectives {
  int rank = 0, size = 1;
  std::function<void(std::span<double>)> all_reduce_values;
  std::function<void(std::vector<torch::Tensor>&)> all_reduce_tensors;
  std::function<void(torch::Tensor&, int)> reduce_to;                    // the sum reaches rank `root`
  std::function<void(const torch::Tensor&, torch::Tensor&)> all_gather;  // 1-D, rank order
};

// Every tensor becomes its sum over the ranks, through the communicator's tensor all-reduce when it has one, else
// through one buffer of host doubles (exact for float32 and float64 values).
template <Communicator C>
void all_reduce_tensors(C& communicator, std::vector<torch::Tensor>& tensors) {
  if constexpr (requires { communicator.all_reduce_sum(tensors); }) {
    communicator.all_reduce_sum(tensors);
  } else {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> flat;
    for (const torch::Tensor& t : tensors) flat.push_back(t.detach().to(torch::kCPU, torch::kFloat64).flatten());
    torch::Tensor host = torch::cat(flat).contiguous();
    communicator.all_reduce_sum(std::span<double>(host.data_ptr<double>(), static_cast<std::size_t>(host.numel())));
    std::int64_t at = 0;
    for (torch::Tensor& t : tensors) {
      t.copy_(host.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  }
}

template <Communicator C>
shard_collectives collectives_of(C& communicator) {
  shard_collectives out;
  out.rank = communicator.rank();
  out.size = communicator.size();
  C* const c = &communicator;
  out.all_reduce_values = [c](std::span<double> values) { c->all_reduce_sum(values); };
  out.all_reduce_tensors = [c](std::vector<torch::Tensor>& tensors) { all_reduce_tensors(*c, tensors); };
  if constexpr (requires(torch::Tensor & t) { c->reduce_sum_to(t, 0); }) {
    out.reduce_to = [c](torch::Tensor& t, int root) { c->reduce_sum_to(t, root); };
  } else {  // an all-reduce also leaves the sum on the root
    out.reduce_to = [c](torch::Tensor& t, int) {
      std::vector<torch::Tensor> one{t};
      all_reduce_tensors(*c, one);
    };
  }
  if constexpr (requires(const torch::Tensor& l, torch::Tensor& g) { c->all_gather(l, g); }) {
    out.all_gather = [c](const torch::Tensor& local, torch::Tensor& gathered) { c->all_gather(local, gathered); };
  } else {
    out.all_gather = [c](const torch::Tensor& local, torch::Tensor& gathered) {
      const torch::Tensor host = local.detach().to(torch::kCPU).contiguous();
      torch::Tensor all = torch::empty({gathered.numel()}, host.options());
      c->all_gather(std::span<const std::byte>(static_cast<const std::byte*>(host.data_ptr()), host.nbytes()),
                    std::span<std::byte>(static_cast<std::byte*>(all.data_ptr()), all.nbytes()));
      gathered.copy_(all);
    };
  }
  return out;
}

// ZeRO-2's reduction during the backward pass (sharding_mode::gradients). The trainable tensors, taken in a
// reduction order, are cut into buckets of `bucket` float32 elements; the buckets are reduced in that order, the
// same on every rank, so that the ranks' collectives match whatever order their hooks fire in.
// A tensor's hook only records that its gradient is coming; at the next hook (its accumulation into .grad is done
// by then) or at the end of the backward pass the gradient is added into its buckets and the tensor's .grad is
// released. A bucket whose tensors have all been taken is reduced at once, each rank's part of it (the elements in
// its range of the flat buffer) to that rank, which adds it into `owned`, the float32 sums of its range over the
// update's backward passes. So a rank holds its range's sums, the buckets still waiting for a tensor, and one
// tensor's gradient: not the whole gradient.
// The reduction order starts as the tensors' reverse order (the backward pass makes the last layers' gradients
// first) and, after the first update in which a rank ran a backward pass, becomes the order rank 0's (or the first
// such rank's) hooks fired in, agreed on by one all-gather inside an update's reduction (learn_order): then no
// bucket waits for a tensor that comes late (a block's modulation, whose gradient comes after its MLP's).
// Every rank must run the same number of backward passes per update (pad(): one with no gradient).
struct backward_reducer {
  shard_collectives collectives;
  flat_shard shard;
  std::vector<std::int64_t> offsets, sizes;  // each trainable tensor's first flat element and element count
  std::vector<torch::Tensor> parameters;     // the model's trainable tensors (their .grad is taken and released)
  std::int64_t bucket = 1;
  torch::TensorOptions options;  // float32 (the master dtype) on the tensors' device
  torch::Tensor owned;           // [shard.count()]: this rank's sums since the last update
  bool active = false;           // inside one of the policy's backward passes
  double peak = 0;               // the most bytes held at once (buckets, owned, .grad waiting to be taken)

  /// Cuts the buckets along `order` (every tensor once).
  void plan(std::vector<std::size_t> order) {
    order_ = std::move(order);
    segments_.clear();
    where_.assign(sizes.size(), {});
    std::int64_t filled = bucket;  // the current bucket's elements
    for (const std::size_t i : order_)
      for (std::int64_t begin = 0; begin < sizes[i];) {
        if (filled == bucket) {
          segments_.emplace_back();
          filled = 0;
        }
        const std::int64_t length = std::min(sizes[i] - begin, bucket - filled);
        where_[i].emplace_back(segments_.size() - 1, segments_.back().size());
        segments_.back().push_back({.tensor = i, .begin = begin, .length = length, .at = filled});
        begin += length;
        filled += length;
      }
  }
  /// The first plan: the tensors' reverse order.
  void plan_reverse() {
    std::vector<std::size_t> order(sizes.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = order.size() - 1 - k;
    plan(std::move(order));
  }
  /// At an update's reduction (every rank, once per update): until it has, adopt the order in which the first rank
  /// that ran a backward pass saw its gradients come (tensors it never saw, after them in reverse order). One
  /// all-gather, the first time only.
  void learn_order() {
    if (learned_) return;
    const auto n = static_cast<std::int64_t>(sizes.size());
    torch::Tensor mine = torch::full({n}, -1.0, torch::TensorOptions().dtype(torch::kFloat64));
    for (std::size_t k = 0; k < observed_.size(); ++k) mine[static_cast<std::int64_t>(k)] = double(observed_[k]);
    torch::Tensor all = mine;
    if (collectives.size > 1) {
      all = torch::empty({n * collectives.size}, mine.options());
      collectives.all_gather(mine, all);
    }
    const auto seen = all.accessor<double, 1>();
    for (int r = 0; r < collectives.size; ++r) {
      if (seen[r * n] < 0) continue;  // rank r ran no backward pass yet
      std::vector<std::size_t> order;
      std::vector<bool> placed(sizes.size(), false);
      for (std::int64_t k = 0; k < n && seen[r * n + k] >= 0; ++k) {
        order.push_back(static_cast<std::size_t>(seen[r * n + k]));
        placed[order.back()] = true;
      }
      for (std::size_t k = sizes.size(); k-- > 0;)
        if (!placed[k]) order.push_back(k);
      plan(std::move(order));
      learned_ = true;
      return;
    }
  }

  void begin() {
    waiting_.assign(segments_.size(), 0);
    buckets_.assign(segments_.size(), torch::Tensor());
    for (std::size_t b = 0; b < segments_.size(); ++b) waiting_[b] = static_cast<int>(segments_[b].size());
    taken_.assign(sizes.size(), false);
    pending_.clear();
    next_ = 0;
    if (!owned.defined()) owned = torch::zeros({shard.count()}, options);
    active = true;
  }
  // The hook of tensor i: its gradient is on its way into .grad.
  void hook(std::size_t i) {
    if (!active) return;
    take_pending();
    pending_.push_back(i);
    note();
  }
  // The end of the backward pass: every gradient taken, every bucket reduced (zeros where none came).
  void finish() {
    take_pending();
    note();
    while (next_ < segments_.size()) reduce(next_++);
    active = false;
    observing_ = observing_ && observed_.empty();  // one backward pass's order is the one to learn
  }
  // A backward pass without gradient: the same collectives, zeros (a rank with fewer edges than another).
  void pad() {
    begin();
    finish();
  }
  [[nodiscard]] double held_bytes() const {
    double bytes = owned.defined() ? static_cast<double>(owned.nbytes()) : 0.0;
    for (const torch::Tensor& b : buckets_)
      if (b.defined()) bytes += static_cast<double>(b.nbytes());
    for (const std::size_t i : pending_)
      if (parameters[i].grad().defined()) bytes += static_cast<double>(parameters[i].grad().nbytes());
    return bytes;
  }

 private:
  // A tensor's elements [begin, begin + length) at element `at` of its bucket.
  struct segment {
    std::size_t tensor = 0;
    std::int64_t begin = 0, length = 0, at = 0;
  };

  void note() { peak = std::max(peak, held_bytes()); }
  // Adds the .grad of every tensor whose hook fired into its buckets, releases it, and reduces the buckets that are
  // complete. A tensor whose .grad is not there yet (a hook for a gradient that is not accumulated: a recomputing
  // block's inner grad() under LibTorch 2.x) stays pending until it is.
  void take_pending() {
    torch::NoGradGuard no_grad;
    std::vector<std::size_t> still;
    for (const std::size_t i : pending_) {
      const torch::Tensor grad = parameters[i].grad();
      if (!grad.defined()) {
        still.push_back(i);
        continue;
      }
      if (!taken_[i]) {
        const torch::Tensor flat = grad.detach().reshape({-1}).to(options);
        for (const auto& [b, k] : where_[i]) {
          const segment& piece = segments_[b][k];
          torch::Tensor& sums = buckets_[b];
          if (!sums.defined()) sums = torch::zeros({bucket_length(b)}, options);
          sums.narrow(0, piece.at, piece.length).add_(flat.narrow(0, piece.begin, piece.length));
          --waiting_[b];
        }
        taken_[i] = true;
        if (observing_) observed_.push_back(i);
      }
      parameters[i].mutable_grad() = torch::Tensor();
    }
    pending_ = std::move(still);
    note();
    while (next_ < segments_.size() && waiting_[next_] == 0) reduce(next_++);
  }
  [[nodiscard]] std::int64_t bucket_length(std::size_t b) const {
    return segments_[b].back().at + segments_[b].back().length;
  }
  // Bucket b's sums (zeros where none came): each owner's elements packed in segment order, reduced to it, and added
  // into its `owned` at their places in its range.
  void reduce(std::size_t b) {
    torch::Tensor& sums = buckets_[b];
    if (!sums.defined()) sums = torch::zeros({bucket_length(b)}, options);
    struct part {
      std::int64_t at, flat, length;  // in the bucket, in the flat buffer
    };
    std::vector<std::vector<part>> owners(static_cast<std::size_t>(shard.size));
    for (const segment& piece : segments_[b]) {
      const std::int64_t first = offsets[piece.tensor] + piece.begin, last = first + piece.length;
      for (int owner = shard.owner(first); owner <= shard.owner(last - 1); ++owner) {
        const std::int64_t from = std::max(first, shard.chunk * owner), to = std::min(last, shard.chunk * (owner + 1));
        owners[static_cast<std::size_t>(owner)].push_back(
            {.at = piece.at + from - first, .flat = from, .length = to - from});
      }
    }
    for (int owner = 0; owner < shard.size; ++owner) {
      const std::vector<part>& parts = owners[static_cast<std::size_t>(owner)];
      if (parts.empty()) continue;
      std::vector<torch::Tensor> packed;
      for (const part& p : parts) packed.push_back(sums.narrow(0, p.at, p.length));
      torch::Tensor buffer = packed.size() == 1 ? packed.front() : torch::cat(packed);
      if (collectives.size > 1) collectives.reduce_to(buffer, owner);
      if (owner != shard.rank) continue;
      std::int64_t at = 0;
      for (const part& p : parts) {
        owned.narrow(0, p.flat - shard.lo, p.length).add_(buffer.narrow(0, at, p.length));
        at += p.length;
      }
    }
    sums = torch::Tensor();
  }

  std::vector<std::size_t> order_;                                       // the reduction order of the tensors
  std::vector<std::vector<segment>> segments_;                           // per bucket, in the reduction order
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> where_;  // per tensor: its (bucket, segment)s
  bool learned_ = false;                                                 // order_ is the observed one
  bool observing_ = true;                                                // until a backward pass with gradients ended
  std::vector<std::size_t> observed_;   // the order this rank's gradients came in, in its first backward pass
  std::vector<torch::Tensor> buckets_;  // pending sums by bucket (undefined: none yet, or reduced)
  std::vector<int> waiting_;            // per bucket: segments whose tensor is not taken yet
  std::vector<bool> taken_;             // per tensor: its gradient of this backward pass is in its buckets
  std::vector<std::size_t> pending_;    // tensors whose hook fired and whose .grad is not taken yet
  std::size_t next_ = 0;                // the next bucket to reduce
};

// The hooks a policy registered on tensors, removed when it goes (a moved-from holder owns none).
struct registered_hooks {
  std::vector<std::pair<torch::Tensor, unsigned>> hooks;
  registered_hooks() = default;
  registered_hooks(registered_hooks&& other) noexcept : hooks(std::move(other.hooks)) { other.hooks.clear(); }
  registered_hooks& operator=(registered_hooks&& other) noexcept {
    remove();
    hooks = std::move(other.hooks);
    other.hooks.clear();
    return *this;
  }
  registered_hooks(const registered_hooks&) = delete;
  registered_hooks& operator=(const registered_hooks&) = delete;
  ~registered_hooks() { remove(); }
  void remove() {
    for (auto& [tensor, handle] : hooks) tensor.remove_hook(handle);
    hooks.clear();
  }
};

// The group of one process, for policies built without a communicator (stateless: one instance serves all).
inline single_process& one_process() {
  static single_process one;
  return one;
}

}  // namespace detail

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
  template <Communicator C>
  autograd_policy(Model& model, torch_backend backend, autograd_policy_options options, C& communicator)
      : model_(&model), backend_(backend), options_(options), parameters_(model.trainable_parameters()) {
    validate_parameters(options.optimizer, "optimizer");
    validate_sharding(options.sharding, "optimizer");  // the config's names: optimizer.sharding
    require(!parameters_.empty(), "the model has no trainable parameters");
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      require(parameters_[i].defined() && parameters_[i].is_leaf() && parameters_[i].requires_grad(),
              "trainable parameter ", i, " is not a leaf tensor that requires grad");
    masters_ = parameters_;
    if (options.sharding.sharded()) {
      collectives_ = detail::collectives_of(communicator);
      build_shard();
      if (options.sharding.mode == sharding_mode::gradients) reduce_during_backward();
      optimizer_ = make_adamw(shard_masters_, options.optimizer);
      ema_.decay = options.optimizer.ema_decay;
      if (options.optimizer.ema_decay > 0) ema_.reset(shard_masters_);
      return;
    }
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
    if (reducer_) {  // ZeRO-2: each bucket reduced to its owners as the backward pass completes it
      reducer_->begin();
      try {
        (w * log_probs).sum().backward();
      } catch (...) {
        reducer_->active = false;
        throw;
      }
      reducer_->finish();
    } else {
      (w * log_probs).sum().backward();
      note_gradient_bytes();  // the backward's gradients, before the 16-bit ones move into the float32 sums
      move_gradients_to_masters();
    }
    note_gradient_bytes();
    rows_ += rows;
    return values;
  }

  /// PaddedAccumulationPolicy: an accumulate without rows. With ZeRO-2 (sharding_mode::gradients) the backward
  /// pass's bucket reductions are collectives, so every rank must make the same number of accumulate calls per
  /// update: a rank with fewer edges makes up the difference with this, which takes part in one backward pass's
  /// collectives with zeros. Otherwise nothing.
  void pad_accumulate() {
    if (reducer_) reducer_->pad();
  }

  /// DataParallelPolicy: the accumulated gradient and row count become their sums over the communicator's ranks
  /// (a parameter without a gradient on this rank counts as zeros), so every rank takes the same step. A
  /// communicator that reduces tensors (c10d) reduces them on their device; any other goes through host doubles.
  template <Communicator C>
  void all_reduce_gradients(C& communicator) {
    double rows = static_cast<double>(rows_);
    communicator.all_reduce_sum(std::span<double>(&rows, 1));
    rows_ = static_cast<std::int64_t>(rows);
    if (sharded()) {
      require(communicator.rank() == collectives_.rank && communicator.size() == collectives_.size,
              "all_reduce_gradients as rank ", communicator.rank(), " of ", communicator.size(),
              ", but the sharded policy was built for rank ", collectives_.rank, " of ", collectives_.size);
      reduce_gradients_to_shard();
      return;
    }
    std::vector<torch::Tensor> gradients;
    for (torch::Tensor& parameter : masters_) {
      if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
      gradients.push_back(parameter.grad());
    }
    detail::all_reduce_tensors(communicator, gradients);
  }

  /// One optimizer step on the accumulated gradient, after clipping to max_grad_norm; then zeroes the gradient
  /// and updates the EMA. No step when nothing was accumulated (by any rank, after all_reduce_gradients).
  policy_update_report apply_update() {
    policy_update_report report{.rows = rows_, .grad_norm = 0, .steps = steps_};
    if (rows_ == 0) return report;
    if (!sharded()) gradient_state_ = std::max(gradient_state_, gradient_bytes());
    // Sharded: the global norm is the square root of the shards' squared norms summed over the ranks.
    report.grad_norm = sharded() ? sharded_gradient_norm() : clip_gradient_norm(masters_, 0);
    scale_gradients_to_norm(optimized(), report.grad_norm, options_.optimizer.max_grad_norm);
    const bool finite = std::isfinite(report.grad_norm);
    if (finite) optimizer_->step();
    if (sharded())  // the pieces' gradients (ZeRO-2: views of the update's sums) are released, not kept as zeros
      for (torch::Tensor& piece : shard_masters_) piece.mutable_grad() = torch::Tensor();
    optimizer_->zero_grad();
    rows_ = 0;
    shard_gradients_ready_ = false;
    require(finite, "gradient norm is ", report.grad_norm, " after ", report.rows,
            " rows; the update was skipped (a non-finite loss weight or model output?)");
    if (sharded())
      gather_shards_into_model();
    else
      copy_masters_to_model();
    if (options_.optimizer.ema_decay > 0) ema_.update(optimized());
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
    if (sharded()) {
      ema_.swap(shard_masters_);
      gather_shards_into_model();
      return;
    }
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
    if (sharded()) {
      for (std::size_t k = 0; k < pieces_.size(); ++k)
        shard_masters_[k].copy_(piece_of(values[pieces_[k].tensor], pieces_[k]).view_as(shard_masters_[k]));
      return;
    }
    copy_masters_to_model();
  }

  /// Sharded: sets this rank's float32 masters to `pieces` (aligned with shard_masters(), in their shapes or flat),
  /// then all-gathers every rank's into the model's tensors: a sharded resume, each rank having read only its own
  /// range. A collective: every rank calls it.
  /// @pre one tensor per piece of that piece's element count (else invalid_input naming the piece).
  void load_shard_masters(std::span<const torch::Tensor> pieces) {
    require(sharded() && pieces.size() == shard_masters_.size(), "load_shard_masters got ", pieces.size(),
            " tensors for ", shard_masters_.size(), " pieces of the shard");
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      require(pieces[k].numel() == shard_masters_[k].numel(), "load_shard_masters: piece ", k, " has ",
              pieces[k].numel(), " elements, the shard's ", shard_masters_[k].numel());
      shard_masters_[k].copy_(pieces[k].reshape(shard_masters_[k].sizes()));
    }
    gather_shards_into_model();
  }

  /// The EMA of master_parameters(), or sharded, of shard_masters().
  [[nodiscard]] const std::vector<torch::Tensor>& ema_parameters() const { return ema_.shadow; }
  [[nodiscard]] bool sharded() const { return options_.sharding.sharded(); }
  /// Sharded: this rank's range of the flat buffer of trainable tensors.
  [[nodiscard]] const flat_shard& shard() const { return shard_; }
  /// Sharded: the float32 masters of this rank's range, one per trainable tensor it overlaps (what AdamW steps).
  [[nodiscard]] const std::vector<torch::Tensor>& shard_masters() const { return shard_masters_; }
  /// Sharded: full tensors, one per trainable tensor in its shape and the master dtype, from tensors aligned with
  /// shard_masters() on every rank (the masters themselves, AdamW's moments, the EMA): what a checkpoint stores at
  /// any world size. A collective: every rank calls it.
  /// Example: 2 ranks, trainable tensors [3] and [2] (chunk 3): rank 0 passes {[a, b, c]}, rank 1 {[d, e]} ->
  ///   {[a, b, c], [d, e]} on both.
  std::vector<torch::Tensor> gather_pieces(std::span<const torch::Tensor> per_piece) {
    require(sharded(), "gather_pieces needs a sharded policy");
    const torch::Tensor gathered = gathered_flat(per_piece);
    std::vector<torch::Tensor> full;
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      full.push_back(gathered.narrow(0, offsets_[i], parameters_[i].numel()).view(parameters_[i].sizes()).clone());
    return full;
  }
  /// Sharded: this rank's pieces of full tensors (one per trainable tensor, in order), shaped as shard_masters():
  /// the inverse of gather_pieces (a resume scatters a checkpoint's full tensors with it). No collective.
  /// @pre full tensors of the trainable tensors' element counts (else invalid_input naming the index).
  [[nodiscard]] std::vector<torch::Tensor> pieces_of(std::span<const torch::Tensor> full) const {
    require(sharded() && full.size() == parameters_.size(), "pieces_of got ", full.size(), " tensors for ",
            parameters_.size(), " trainable");
    std::vector<torch::Tensor> out;
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      const std::size_t i = pieces_[k].tensor;
      require(full[i].numel() == parameters_[i].numel(), "pieces_of: tensor ", i, " has ", full[i].numel(),
              " elements, the trainable tensor ", parameters_[i].numel());
      out.push_back(piece_of(full[i], pieces_[k]).to(masters_options()).view_as(shard_masters_[k]).clone());
    }
    return out;
  }
  /// The sum of `value` over the ranks the policy is sharded over (itself with one rank or unsharded). A
  /// collective when sharded over several ranks.
  double sum_over_ranks(double value) {
    if (sharded() && collectives_.size > 1) collectives_.all_reduce_values(std::span<double>(&value, 1));
    return value;
  }

  /// The training state's bytes on this rank (policy_memory), measured from the tensors it holds now; the gradient
  /// peak since the last reset_memory_peak().
  [[nodiscard]] policy_memory memory() {
    std::vector<const void*> seen;
    const auto bytes = [&](const torch::Tensor& t) -> double {
      if (!t.defined() || t.numel() == 0) return 0.0;
      const void* storage = t.storage().data();
      if (std::find(seen.begin(), seen.end(), storage) != seen.end()) return 0.0;
      seen.push_back(storage);
      return static_cast<double>(t.storage().nbytes());
    };
    policy_memory out;
    for (const torch::Tensor& t : parameters_) out.parameters += bytes(t);
    for (const torch::Tensor& t : optimized()) out.parameters += bytes(t);
    for (const auto& [key, state] : optimizer_->state()) {
      const auto& adamw = static_cast<const torch::optim::AdamWParamState&>(*state);
      out.optimizer += bytes(adamw.exp_avg()) + bytes(adamw.exp_avg_sq()) + bytes(adamw.max_exp_avg_sq());
    }
    for (const torch::Tensor& t : ema_.shadow) out.optimizer += bytes(t);
    out.gradients = gradient_state_;
    out.gradients_peak = std::max({gradient_bytes_peak_, gradient_bytes(), reducer_ ? reducer_->peak : 0.0});
    return out;
  }
  /// Starts a new gradient peak (policy_memory::gradients_peak) from the bytes held now.
  void reset_memory_peak() {
    gradient_state_ = 0;
    gradient_bytes_peak_ = gradient_bytes();
    if (reducer_) reducer_->peak = reducer_->held_bytes();
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
    if (sharded()) {  // 16-bit tensors' gradients summed in float32 beside them, for the shard's reduction
      for (std::size_t i = 0; i < parameters_.size(); ++i) {
        if (!parameters_[i].grad().defined() || parameters_[i].scalar_type() == master_dtype_) continue;
        const torch::Tensor gradient = parameters_[i].grad().to(master_dtype_);
        if (gradient_sums_[i].defined())
          gradient_sums_[i].add_(gradient);
        else
          gradient_sums_[i] = gradient.clone();
        parameters_[i].mutable_grad() = torch::Tensor();
      }
      return;
    }
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

  // Bytes held in gradient buffers now: the model's tensors' .grad(), the float32 sums of 16-bit ones, the masters'
  // and the shard's .grad() (each storage once).
  [[nodiscard]] double gradient_bytes() const {
    std::vector<const void*> seen;
    double total = 0;
    const auto add = [&](const torch::Tensor& t) {
      if (!t.defined() || t.numel() == 0) return;
      const void* storage = t.storage().data();
      if (std::find(seen.begin(), seen.end(), storage) != seen.end()) return;
      seen.push_back(storage);
      total += static_cast<double>(t.storage().nbytes());
    };
    for (const torch::Tensor& t : parameters_) add(t.grad());
    for (const torch::Tensor& t : masters_) add(t.grad());
    for (const torch::Tensor& t : gradient_sums_) add(t);
    for (const torch::Tensor& t : shard_masters_) add(t.grad());
    if (reducer_ && reducer_->owned.defined()) add(reducer_->owned);
    return total;
  }
  // Raises the gradient peak to what is held now plus `extra` bytes of transient buffers.
  void note_gradient_bytes(double extra = 0) {
    gradient_bytes_peak_ = std::max(gradient_bytes_peak_, gradient_bytes() + extra);
  }

  // One trainable tensor's part of this rank's range: its flat elements [begin, begin + length).
  struct shard_piece {
    std::size_t tensor = 0;
    std::int64_t begin = 0, length = 0;
  };

  static torch::Tensor piece_of(const torch::Tensor& tensor, const shard_piece& piece) {
    return tensor.detach().reshape({-1}).narrow(0, piece.begin, piece.length);
  }

  // Lays the trainable tensors end to end, finds this rank's range and makes its float32 pieces. A piece that is
  // a whole tensor keeps the tensor's shape (with one rank every piece does: AdamW then sees the unsharded tensors).
  void build_shard() {
    torch::NoGradGuard no_grad;
    const auto is_16_bit = [](const torch::Tensor& t) {
      return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
    };
    master_dtype_ = is_16_bit(parameters_.front()) ? torch::kFloat32 : parameters_.front().scalar_type();
    std::int64_t total = 0;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const torch::ScalarType dtype = is_16_bit(parameters_[i]) ? torch::kFloat32 : parameters_[i].scalar_type();
      require(dtype == master_dtype_, "sharding needs one master dtype: trainable tensor ", i, " has ", dtype,
              ", tensor 0 ", master_dtype_);
      require(parameters_[i].device() == parameters_.front().device(), "sharding needs one device: trainable tensor ",
              i, " is on ", parameters_[i].device(), ", tensor 0 on ", parameters_.front().device());
      offsets_.push_back(total);
      total += parameters_[i].numel();
    }
    shard_ = flat_shard::of(total, collectives_.rank, collectives_.size);
    gradient_sums_.resize(parameters_.size());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const std::int64_t first = std::max(shard_.lo, offsets_[i]);
      const std::int64_t last = std::min(shard_.hi, offsets_[i] + parameters_[i].numel());
      if (first >= last) continue;
      const shard_piece piece{.tensor = i, .begin = first - offsets_[i], .length = last - first};
      torch::Tensor master = piece_of(parameters_[i], piece).to(master_dtype_).clone();
      if (piece.length == parameters_[i].numel()) master = master.view(parameters_[i].sizes());
      master.set_requires_grad(true);
      pieces_.push_back(piece);
      shard_masters_.push_back(master);
    }
  }

  // ZeRO-2: a hook on every trainable tensor feeds the backward pass's gradients into the bucket reducer.
  void reduce_during_backward() {
    reducer_ = std::make_unique<detail::backward_reducer>();
    reducer_->collectives = collectives_;
    reducer_->shard = shard_;
    reducer_->offsets = offsets_;
    for (const torch::Tensor& p : parameters_) reducer_->sizes.push_back(p.numel());
    reducer_->parameters = parameters_;
    reducer_->bucket = options_.sharding.bucket_elements();
    reducer_->options = masters_options();
    reducer_->plan_reverse();
    detail::backward_reducer* const reducer = reducer_.get();  // stable: the hooks go with the policy
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      hooks_.hooks.emplace_back(parameters_[i],
                                parameters_[i].register_hook([reducer, i](const torch::Tensor&) { reducer->hook(i); }));
  }

  // Tensor i's summed gradient on this rank, in the master dtype (zeros where it has none).
  torch::Tensor local_gradient(std::size_t i) {
    const torch::Tensor& source =
        parameters_[i].scalar_type() == master_dtype_ ? parameters_[i].grad() : gradient_sums_[i];
    return source.defined() ? source.detach() : torch::zeros(parameters_[i].sizes(), masters_options());
  }
  [[nodiscard]] torch::TensorOptions masters_options() const {
    return torch::TensorOptions().dtype(master_dtype_).device(parameters_.front().device());
  }

  // The gradient summed over the ranks, for this rank's range only, into the pieces' .grad(). ZeRO-1: every
  // tensor's full gradient all-reduced, then sliced, and the full local gradients released. ZeRO-2: the backward
  // passes reduced every bucket to its owners already (backward_reducer); this rank's sums become its pieces'
  // gradients. One rank: the same steps without a collective.
  void reduce_gradients_to_shard() {
    torch::NoGradGuard no_grad;
    gradient_state_ = std::max(gradient_state_, gradient_bytes());
    if (reducer_) {
      reducer_->learn_order();  // every rank reaches this once per update: the one point to agree on the order
      if (!reducer_->owned.defined()) reducer_->owned = torch::zeros({shard_.count()}, masters_options());
      std::int64_t at = 0;
      for (std::size_t k = 0; k < pieces_.size(); ++k) {
        shard_masters_[k].mutable_grad() = reducer_->owned.narrow(0, at, pieces_[k].length).view_as(shard_masters_[k]);
        at += pieces_[k].length;
      }
      reducer_->owned = torch::Tensor();  // the next update's sums start afresh (the pieces keep these)
    } else {
      std::vector<torch::Tensor> gradients;
      for (std::size_t i = 0; i < parameters_.size(); ++i) gradients.push_back(local_gradient(i));
      if (collectives_.size > 1) collectives_.all_reduce_tensors(gradients);
      // Tensor by tensor: its pieces copied, then its full gradient released (one piece in flight, not a shard).
      std::size_t k = 0;
      for (std::size_t i = 0; i < parameters_.size(); ++i) {
        for (; k < pieces_.size() && pieces_[k].tensor == i; ++k)
          shard_masters_[k].mutable_grad() = piece_of(gradients[i], pieces_[k]).view_as(shard_masters_[k]).clone();
        note_gradient_bytes();
        gradients[i] = torch::Tensor();
        parameters_[i].mutable_grad() = torch::Tensor();
        gradient_sums_[i] = torch::Tensor();
      }
    }
    note_gradient_bytes();
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      parameters_[i].mutable_grad() = torch::Tensor();
      gradient_sums_[i] = torch::Tensor();
    }
    shard_gradients_ready_ = true;
  }

  // The tensors AdamW steps and the EMA follows: the masters, or sharded, this rank's pieces.
  [[nodiscard]] const std::vector<torch::Tensor>& optimized() const { return sharded() ? shard_masters_ : masters_; }

  // The global gradient norm of a sharded update (reducing the gradients to the shards first when
  // all_reduce_gradients did not: one rank).
  double sharded_gradient_norm() {
    if (!shard_gradients_ready_) reduce_gradients_to_shard();
    double squares = gradient_squares(shard_masters_);
    if (collectives_.size > 1) collectives_.all_reduce_values(std::span<double>(&squares, 1));
    return std::sqrt(squares);
  }

  // Every rank's pieces, all-gathered (padded to equal chunks), into the model's tensors (rounded to their dtype).
  void gather_shards_into_model() {
    torch::NoGradGuard no_grad;
    const torch::Tensor gathered = gathered_flat(shard_masters_);
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      parameters_[i].detach().copy_(
          gathered.narrow(0, offsets_[i], parameters_[i].numel()).view(parameters_[i].sizes()));
  }

  // The flat buffer of per-piece tensors (aligned with pieces_) from every rank: each rank's chunk padded with zeros
  // to the same length, all-gathered; with one rank, this rank's chunk.
  torch::Tensor gathered_flat(std::span<const torch::Tensor> per_piece) {
    require(per_piece.size() == pieces_.size(), "gathering ", per_piece.size(), " tensors for ", pieces_.size(),
            " pieces of the shard");
    torch::NoGradGuard no_grad;
    torch::Tensor local = torch::zeros({shard_.chunk}, masters_options());
    std::int64_t at = 0;
    for (std::size_t k = 0; k < pieces_.size(); ++k) {
      local.narrow(0, at, pieces_[k].length).copy_(per_piece[k].detach().reshape({-1}));
      at += pieces_[k].length;
    }
    if (collectives_.size == 1) return local;
    torch::Tensor gathered = torch::empty({shard_.padded()}, masters_options());
    collectives_.all_gather(local, gathered);
    return gathered;
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
  std::vector<torch::Tensor> masters_;              // parameters_[i] itself, or its float32 master copy
  std::unique_ptr<torch::optim::AdamW> optimizer_;  // over masters_, or sharded over shard_masters_
  // Sharded only:
  detail::shard_collectives collectives_;
  flat_shard shard_;
  std::vector<std::int64_t> offsets_;         // each trainable tensor's first element in the flat buffer
  std::vector<shard_piece> pieces_;           // this rank's range, tensor by tensor
  std::vector<torch::Tensor> shard_masters_;  // one master per piece: what AdamW and the EMA hold
  std::vector<torch::Tensor> gradient_sums_;  // ZeRO-1: float32 gradient sums of 16-bit tensors until the reduction
  torch::ScalarType master_dtype_ = torch::kFloat32;
  bool shard_gradients_ready_ = false;
  double gradient_bytes_peak_ = 0;                     // policy_memory::gradients_peak
  double gradient_state_ = 0;                          // policy_memory::gradients
  std::unique_ptr<detail::backward_reducer> reducer_;  // ZeRO-2 only
  detail::registered_hooks hooks_;                     // on parameters_, feeding reducer_ (removed first)
  ema_weights ema_;
  std::int64_t rows_ = 0;
  int steps_ = 0;
  policy_update_report last_update_;
};

}  // namespace branchgrpo
