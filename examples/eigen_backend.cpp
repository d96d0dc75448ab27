// Swapping the tensor backend: the same rollout and training iteration on host_backend (std::vector, the
// reference) and on the Eigen adapter (adapters/eigen, target branchgrpo::eigen). The rollout engine, the
// trainer and the toy model are templates over a Backend, so the swap is the backend type and nothing else;
// every draw is keyed Philox noise made on the host, so both backends see the same numbers.
// Run: build/examples/example_eigen_backend   (exit status 1 when the backends disagree)
#include <branchgrpo/branchgrpo.hpp>
#include <branchgrpo/eigen/backend.hpp>
#include <branchgrpo/toy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace bg = branchgrpo;

struct outcome {
  std::vector<double> leaves;     // leaf latents, row-major, in tree.leaves() order
  std::vector<double> log_probs;  // per node: log-prob of the edge into it
  std::vector<double> weights;    // the toy policy's W after one training iteration
};

// Everything below the backend type is identical for every backend.
template <bg::Backend B>
outcome run(B backend) {
  auto policy = bg::make_toy_policy<B>(7, {}, backend);  // the toy computes its velocities through B
  auto recipe = bg::branch_method();
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts = {0, 3, 5};

  // A rollout of the dense tree, one tree per prompt: 3 x 16 leaves.
  std::vector<bg::tree_info> trees;
  for (std::size_t t = 0; t < prompts.size(); ++t)
    trees.push_back({.key = static_cast<std::uint32_t>(t), .prompt = prompts[t]});
  const auto result = bg::rollout(backend, policy, recipe.stepper, recipe.correlator, schedule,
                                  bg::rollout_tree(recipe.topology(schedule.steps()), trees), bg::toy_latent_shape(),
                                  {.max_batch = 64, .seed = 11, .iteration = 0});
  outcome out{.leaves = backend.to_host(bg::leaf_latents(backend, result)),
              .log_probs = {result.tree.log_probs().begin(), result.tree.log_probs().end()},
              .weights = {}};

  // One training iteration (it samples the same rollout again, then updates W).
  bg::mode_reward<B> reward;
  bg::train_iteration(backend, policy, reward, recipe, schedule, bg::toy_latent_shape(), prompts, 0, {.seed = 11});
  out.weights.assign(policy.parameters().begin(), policy.parameters().end());
  return out;
}

double max_abs_diff(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

int main() {
  const outcome host = run(bg::host_backend{});
  const outcome eigen = run(bg::eigen_backend{});                     // double precision
  const outcome eigen_float = run(bg::basic_eigen_backend<float>{});  // half the memory, ~1e-5 relative

  const double leaves = max_abs_diff(host.leaves, eigen.leaves);
  const double log_probs = max_abs_diff(host.log_probs, eigen.log_probs);
  const double weights = max_abs_diff(host.weights, eigen.weights);
  const double leaves_float = max_abs_diff(host.leaves, eigen_float.leaves);
  std::cout << host.leaves.size() / 2 << " leaves; max |host - eigen|: leaves " << leaves << ", edge log-probs "
            << log_probs << ", W after one iteration " << weights << "; float leaves " << leaves_float << '\n';

  bool ok = host.leaves.size() == 96;  // 3 trees x 16 leaves x 2 elements
  for (const auto& [diff, what] :
       {std::pair{leaves, "leaves"}, std::pair{log_probs, "edge log-probs"}, std::pair{weights, "trained weights"}})
    if (!(diff < 1e-9)) {
      std::cerr << "FAILED: host and eigen " << what << " differ by " << diff << '\n';
      ok = false;
    }
  if (!(leaves_float < 1e-3)) {
    std::cerr << "FAILED: float eigen leaves differ by " << leaves_float << '\n';
    ok = false;
  }
  return ok ? 0 : 1;
}
