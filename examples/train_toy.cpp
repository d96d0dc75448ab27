// Training loop: BranchGRPO with width pruning (BranchGRPO-WidPru) on the 2-D toy flow model, 30 iterations
// over 8 prompts, in about a second on one CPU core. The toy (docs/toy.md) asks prompt p for ring mode p; its
// base model ignores the prompt, so the mean leaf reward rises only if the policy update works.
// Run: build/examples/example_train_toy   (exit status 1 when the reward did not rise by more than 0.2)
#include <branchgrpo/branchgrpo.hpp>
#include <branchgrpo/toy.hpp>

#include <cstdint>
#include <iomanip>
#include <iostream>
#include <vector>

int main() {
  namespace bg = branchgrpo;
  auto policy = bg::make_toy_policy(7);                       // a 2-D flow model with exact gradients
  bg::mode_reward<> reward;                                   // prompt p asks for ring mode p
  bg::host_backend backend;                                   // std::vector tensors
  auto recipe = bg::branch_method(bg::parent_top_k{.k = 1});  // dense tree, Parent-Top1 after the last split
  const bg::sigma_schedule schedule = bg::shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts = {0, 1, 2, 3, 4, 5, 6, 7};  // one tree (16 leaves) per prompt
  constexpr int iterations = 30;

  // The reward is noisy from one iteration to the next (128 leaves), so compare the means of 5 iterations.
  double first = 0, last = 0;
  std::cout << "iter  reward  evaluations  edges trained\n" << std::fixed << std::setprecision(3);
  for (int i = 0; i < iterations; ++i) {
    const bg::iteration_stats s = bg::train_iteration(backend, policy, reward, recipe, schedule, bg::toy_latent_shape(),
                                                      prompts, i, {.seed = 11, .total_iterations = iterations});
    if (i < 5) first += s.reward_mean / 5;
    if (i >= iterations - 5) last += s.reward_mean / 5;
    if (i % 5 == 0 || i == iterations - 1)
      std::cout << std::setw(4) << i << std::setw(8) << s.reward_mean << std::setw(13) << s.rollout_evaluations
                << std::setw(15) << s.edges_trained << '\n';
  }
  std::cout << "mean reward, first 5 iterations " << first << ", last 5 " << last << ", gain " << last - first << '\n';
  if (last - first > 0.2) return 0;
  std::cerr << "FAILED: the mean reward rose by " << last - first << ", expected more than 0.2\n";
  return 1;
}
