// Quickstart: the README's usage snippet as a program that checks what it prints.
// One dense tree per prompt, made-up leaf rewards, reward fusion up the tree, depth-wise advantages.
// Run: build/examples/example_quickstart   (exit status 1 when a checked fact does not hold)
#include <branchgrpo/branchgrpo.hpp>

#include <cmath>
#include <cstddef>
#include <iostream>
#include <vector>

int main() {
  namespace bg = branchgrpo;
  // The paper's dense tree: splits at steps 0, 3, 6, 9 into K = 2 -> 16 leaves, 203 evaluations over 20 steps.
  const bg::tree_plan plan = bg::split_schedule::dense()(20);
  const bg::rollout_tree tree(plan, {bg::tree_info{.key = 0, .prompt = 0}, bg::tree_info{.key = 1, .prompt = 1}});

  // One reward per leaf, in tree.leaves() order (made up here; normally: decode the leaf latents and score them).
  std::vector<double> leaf_rewards(static_cast<std::size_t>(tree.leaf_count()));
  for (std::size_t i = 0; i < leaf_rewards.size(); ++i) leaf_rewards[i] = 0.01 * static_cast<double>(i % 7);

  const std::vector<double> fused = bg::uniform_mean{}(tree, leaf_rewards);  // paper Eq. 3 with beta = 0
  const std::vector<double> advantages = bg::depth_wise{}(tree, {.leaf = leaf_rewards, .fused = fused});  // Eq. 4

  std::cout << plan.evaluations() << " evaluations per tree (" << tree.evaluations() << " for " << tree.tree_count()
            << " trees), " << tree.leaves_per_tree() << " leaves per tree, advantage of edge 1: " << advantages[1]
            << '\n';

  // Sixteen independent chains would cost 16 x 19 + 1 = 305 evaluations (sharing the root); the tree shares
  // its prefixes. Node 1 (the root's first child) holds leaves 0..7 of tree 0 (mean 0.02625) and node 2
  // leaves 8..15 (mean 0.0275): a depth of two nodes normalizes to -1/sqrt(2), +1/sqrt(2) (Eq. 4), here
  // -0.707099 because epsilon = 1e-8 is added to their std of 0.000884.
  bool ok = true;
  const auto check = [&ok](bool fact, const char* what) {
    if (!fact) std::cerr << "FAILED: " << what << '\n';
    ok = ok && fact;
  };
  check(plan.evaluations() == 203, "the dense tree costs 203 evaluations over 20 steps");
  check(tree.evaluations() == 406, "two trees cost 406 evaluations");
  check(tree.leaves_per_tree() == 16, "the dense tree has 16 leaves");
  check(std::abs(fused[1] - 0.02625) < 1e-12 && std::abs(fused[2] - 0.0275) < 1e-12, "node 1, 2 fuse their leaves");
  check(std::abs(advantages[1] + 1 / std::sqrt(2.0)) < 1e-4, "edge 1's advantage is about -1/sqrt(2)");
  check(advantages[0] == 0.0, "a root has no edge, so no advantage");
  return ok ? 0 : 1;
}
