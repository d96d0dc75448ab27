#pragma once
// The C++ trainer driving Python objects (update way (a) of docs/python.md): train_iteration (training/trainer.hpp)
// on python_torch_backend with
//   python_policy        a branchgrpo.Policy: its velocity for the rollout, accumulate / apply_update for the update
//                        (log-probs with gradients, the objective's weights d loss / d log-prob from C++, backward;
//                        the user's optimizer), its reference velocity for the KL term, its gradients summed over
//                        the ranks and its padding calls for a DDP- or FSDP-wrapped model
//   python_reward        the user's reward, pointwise or groupwise (the tree of each leaf), checked like score()
//   python_communicator  torch.distributed (gloo or nccl) through branchgrpo._distributed; one process without it
// so that every objective (PPO clip, RatioNorm, step weights, KL, NFT, AWM) runs its C++ update on torch tensors.
// Example: train_step(Method("branch"), policy, reward, ...) -> {"reward_mean": ..., "edges_trained": 436, ...}.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/distributed/communicator.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "branchgrpo/training/options.hpp"
#include "branchgrpo/training/run_recipe.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "method.hpp"
#include "parameters.hpp"
#include "rollout.hpp"
#include "torch_backend.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

// --- The communicator ----------------------------------------------------------------------------------------------

/// torch.distributed's process group `group` (None: the default group; one process when torch.distributed is not
/// initialized), through branchgrpo._distributed's all_reduce_sum, all_gather_bytes and barrier.
struct python_communicator {
  nb::object ops;    ///< the module branchgrpo._distributed
  nb::object group;  ///< the process group, or None
  int rank_ = 0, size_ = 1;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  void all_reduce_sum(std::span<double> values) {
    if (size_ == 1) return;
    const std::vector<double> summed =
        from_numpy<double>(ops.attr("all_reduce_sum")(numpy_copy(std::span<const double>(values)), group));
    bg::require(summed.size() == values.size(), "all_reduce_sum returned ", summed.size(), " values for ",
                values.size());
    std::copy(summed.begin(), summed.end(), values.begin());
  }
  void all_gather(std::span<const std::byte> local, std::span<std::byte> gathered) {
    if (size_ == 1) {
      bg::require(gathered.size() == local.size(), "all_gather: ", gathered.size(), " bytes for 1 rank of ",
                  local.size());
      std::copy(local.begin(), local.end(), gathered.begin());
      return;
    }
    const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(local.data()), local.size());
    const std::vector<std::uint8_t> all =
        from_numpy<std::uint8_t>(ops.attr("all_gather_bytes")(numpy_copy(bytes), size_, group));
    bg::require(all.size() == gathered.size(), "all_gather returned ", all.size(), " bytes, expected ",
                gathered.size());
    std::copy(all.begin(), all.end(), reinterpret_cast<std::uint8_t*>(gathered.data()));
  }
  void barrier() {
    if (size_ > 1) ops.attr("barrier")(group);
  }
};

static_assert(bg::Communicator<python_communicator>);

// --- The policy ------------------------------------------------------------------------------------------------------

/// A branchgrpo.Policy as the trainer's Policy: the rollout's calls go to its sampling velocity (checked like
/// rollout()'s velocity), the update's to its _accumulate (which calls back `gradient` for the objective's weights).
struct python_policy {
  nb::object ops;     ///< branchgrpo._torch_ops
  nb::object policy;  ///< the branchgrpo.Policy
  std::uint32_t iteration = 0;

  nb::object operator()(const nb::object& x, const bg::denoise_batch& batch) {
    python_velocity sample{.ops = ops, .velocity = policy.attr("_sample"), .iteration = iteration};
    return sample(x, batch);
  }
  nb::object reference_velocity(const nb::object& x, const bg::denoise_batch& batch) {
    python_velocity reference{.ops = ops, .velocity = policy.attr("_reference"), .iteration = iteration};
    return reference(x, batch);
  }
  std::vector<double> accumulate(const bg::edge_batch<nb::object>& edges, const bg::loss_gradient_fn& gradient) {
    const nb::object weights = nb::cpp_function([&gradient](const nb::handle& log_probs) {
      const std::vector<double> values = from_numpy<double>(log_probs);
      return numpy_copy(std::span<const double>(gradient(values)));
    });
    std::vector<std::int64_t> trees(edges.trees.begin(), edges.trees.end());
    return from_numpy<double>(policy.attr("_accumulate")(
        edges.x, edges.next, edges.sigma, edges.step, edges.coeffs.x_coeff, edges.coeffs.velocity_coeff,
        numpy_copy(std::span<const double>(edges.std)), numpy_copy(std::span<const std::int64_t>(edges.prompts)),
        numpy_copy(std::span<const std::int64_t>(trees)), weights, iteration));
  }
  void apply_update() { policy.attr("_apply_update")(); }
  void pad_accumulate() { policy.attr("_pad_accumulate")(); }
  void all_reduce_gradients(python_communicator& communicator) {
    policy.attr("_all_reduce_gradients")(communicator.size_, communicator.group);
  }
};

static_assert(bg::ReferencePolicy<python_policy, python_torch_backend>);
static_assert(bg::PaddedAccumulationPolicy<python_policy>);

// --- The reward ------------------------------------------------------------------------------------------------------

/// The user's reward through branchgrpo._torch_ops.call_reward (a tensor or sequence of one finite score per leaf,
/// or a mapping of named parts, each scores or (weight, scores); else a ValueError naming the iteration and the
/// leaves). Pointwise: reward(leaves, prompts). A ComponentReward: the parts of its last call, for per-reward
/// advantages.
struct python_reward {
  nb::object ops;
  nb::object reward;
  std::uint32_t iteration = 0;
  bool groupwise = false;  ///< reward(leaves, prompts, groups)
  bool win_rate = false;   ///< each score (each part's) replaced by its win rate within its tree
  std::vector<bg::reward_component> components = {};

  std::vector<double> operator()(const nb::object& leaves, std::span<const std::int64_t> prompts) {
    return score(leaves, prompts, nb::none());
  }
  /// The scores of one call with `groups` (None: pointwise), its parts kept.
  std::vector<double> score(const nb::object& leaves, std::span<const std::int64_t> prompts, nb::object groups) {
    const nb::tuple out = nb::cast<nb::tuple>(
        ops.attr("call_reward")(reward, leaves, numpy_copy(prompts), groups, iteration, groupwise, win_rate));
    components.clear();
    for (const nb::handle part : nb::borrow<nb::list>(out[1]))
      components.push_back({.name = nb::cast<std::string>(part[0]),
                            .weight = nb::cast<double>(part[1]),
                            .rows = from_numpy<double>(part[2])});
    return from_numpy<double>(out[0]);
  }
  [[nodiscard]] std::span<const bg::reward_component> last_component_rows() const { return components; }
};

/// The reward with the leaves' groups (groups[i] the tree key of leaf i): a groupwise reward's, or a win rate's.
struct python_group_reward {
  python_reward pointwise;

  std::vector<double> operator()(const nb::object& leaves, std::span<const std::int64_t> prompts,
                                 const bg::leaf_groups& groups) {
    std::vector<std::int64_t> keys;
    for (const std::uint32_t key : groups.keys)
      keys.insert(keys.end(), static_cast<std::size_t>(groups.leaves_per_tree), key);
    return pointwise.score(leaves, prompts, numpy_copy(std::span<const std::int64_t>(keys)));
  }
  [[nodiscard]] std::span<const bg::reward_component> last_component_rows() const {
    return pointwise.last_component_rows();
  }
};

static_assert(bg::PointwiseReward<python_reward, python_torch_backend>);
static_assert(bg::GroupwiseReward<python_group_reward, python_torch_backend>);
static_assert(bg::ComponentReward<python_reward> && bg::ComponentReward<python_group_reward>);

// --- One iteration ---------------------------------------------------------------------------------------------------

/// What train_step is given besides the Python objects.
struct train_request {
  std::vector<std::int64_t> prompts, latent;
  int steps = 20;
  double shift = 3.0;
  std::vector<double> sigmas;  ///< the schedule's steps + 1 values; empty: the shifted linear schedule (shift)
  int iteration = 0;
  bg::training_options options = {};
};

/// The run-wide options from their Python values: the loss section through ppo_options' parameters() (the config's
/// [loss] keys and rules).
inline bg::training_options training_options_from(std::int64_t max_batch, std::uint64_t seed, int updates,
                                                  int total_iterations, const nb::dict& loss) {
  bg::training_options out{.max_batch = max_batch,
                           .seed = seed,
                           .updates_per_iteration = updates,
                           .total_iterations = total_iterations,
                           .loss = {}};
  set_parameters(out.loss, loss, "loss");
  return out;
}

/// iteration_stats as a dict.
inline nb::dict stats_dict(const bg::iteration_stats& s) {
  nb::dict out;
  out["iteration"] = s.iteration;
  out["reward_mean"] = s.reward_mean;
  out["reward_std"] = s.reward_std;
  out["reward_min"] = s.reward_min;
  out["reward_max"] = s.reward_max;
  out["evaluations"] = s.rollout_evaluations;
  out["evaluations_saved"] = s.rollout_evaluations_saved;
  out["update_evaluations"] = s.update_evaluations;
  out["edges"] = s.edges;
  out["edges_trained"] = s.edges_trained;
  out["trees_dropped"] = s.trees_dropped;
  out["loss"] = s.loss;
  out["clip_fraction"] = s.clip_fraction;
  out["kl"] = s.kl;
  out["first_update_log_prob_gap"] = s.first_update_log_prob_gap;
  out["seconds"] = s.seconds;
  out["rollout_seconds"] = s.rollout_seconds;
  out["reward_seconds"] = s.reward_seconds;
  out["update_seconds"] = s.update_seconds;
  return out;
}

/// One train_iteration of `method` with the Python policy, reward and process group (see the file comment).
inline nb::dict train_step(method_spec& method, nb::object policy, nb::object reward, bool groupwise, bool win_rate,
                           const train_request& r, nb::object device, nb::object dtype, nb::object group) {
  const nb::object ops = nb::module_::import_("branchgrpo._torch_ops");
  const nb::object distributed = nb::module_::import_("branchgrpo._distributed");
  const auto [rank, size] = nb::cast<std::pair<int, int>>(distributed.attr("rank_and_size")(group));
  python_communicator communicator{.ops = distributed, .group = group, .rank_ = rank, .size_ = size};
  python_torch_backend backend{.ops = ops, .device = std::move(device), .dtype = std::move(dtype)};
  const auto iteration = static_cast<std::uint32_t>(r.iteration);
  python_policy model{.ops = ops, .policy = std::move(policy), .iteration = iteration};
  python_reward pointwise{
      .ops = ops, .reward = std::move(reward), .iteration = iteration, .groupwise = groupwise, .win_rate = win_rate};
  const bg::latent_shape shape{r.latent};
  const bg::sigma_schedule schedule = iteration_schedule(r.steps, r.shift, r.sigmas);
  if (r.options.loss.kl_beta > 0)
    bg::require(nb::cast<bool>(model.policy.attr("has_reference")), "loss.kl_beta = ", r.options.loss.kl_beta,
                ": needs the policy's reference velocity (Policy(..., reference=...))");
  const auto run = [&](auto& score) {
    return bg::train_iteration(backend, model, score, method.recipe, schedule, shape, r.prompts, r.iteration, r.options,
                               communicator);
  };
  if (groupwise || win_rate) {
    python_group_reward grouped{.pointwise = std::move(pointwise)};
    return stats_dict(run(grouped));
  }
  return stats_dict(run(pointwise));
}

}  // namespace branchgrpo::python
