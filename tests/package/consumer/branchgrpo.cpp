// Builds the paper's dense tree from the installed headers; fails unless it costs 203 evaluations.
#include <branchgrpo/topology.hpp>

#include <iostream>

int main() {
  const branchgrpo::tree_plan plan = branchgrpo::split_schedule::dense()(20);
  const branchgrpo::rollout_tree tree(plan, {branchgrpo::tree_info{}});
  std::cout << "dense tree: " << tree.leaf_count() << " leaves, " << tree.evaluations() << " evaluations\n";
  return tree.evaluations() == 203 && tree.leaf_count() == 16 ? 0 : 1;
}
