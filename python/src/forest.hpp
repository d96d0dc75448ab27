#pragma once
// Plans and forests for Python: a topology's plan from its name and keyword parameters, the edge kinds by name, and
// a forest whose per-node arrays are exposed as read-only numpy views owned by the Python object that holds it.
// Example: make_plan("sequential", 20, {group_size: 4}).roots == 1; forest(plan, 2).leaves: the leaf nodes in order.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/topology/catalog.hpp"
#include "branchgrpo/tree/rollout_tree.hpp"
#include "branchgrpo/tree/tree_plan.hpp"
#include "parameters.hpp"

namespace branchgrpo::python {

namespace nb = nanobind;
namespace bg = branchgrpo;

// --- Plans --------------------------------------------------------------------------------------------------------

inline bg::tree_plan make_plan(const std::string& kind, int steps, const nb::dict& params) {
  auto topology = bg::make_policy<bg::topology_policies>(kind);
  std::visit([&](auto& p) { set_parameters(p, params, "topology"); }, topology);
  return std::visit([&](const auto& p) { return p(steps); }, topology);
}

inline std::vector<std::string> kind_names(const bg::tree_plan& plan) {
  std::vector<std::string> out;
  for (const bg::edge_kind k : plan.kinds)
    out.emplace_back(k == bg::edge_kind::sde ? "sde" : k == bg::edge_kind::ode ? "ode" : "skip");
  return out;
}

// --- Trees --------------------------------------------------------------------------------------------------------

// A forest of `trees` trees of one plan, its arrays copied once out of rollout_tree and exposed as read-only views.
struct forest {
  forest(const bg::tree_plan& plan, std::int32_t trees) : forest(bg::rollout_tree(plan, tree_infos(trees))) {}
  explicit forest(bg::rollout_tree built) : tree(std::move(built)) {
    const std::int32_t n = tree.node_count();
    parent.resize(static_cast<std::size_t>(n));
    step.resize(static_cast<std::size_t>(n));
    kind.resize(static_cast<std::size_t>(n));
    sibling.resize(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) {
      parent[static_cast<std::size_t>(i)] = tree.parent(i);
      step[static_cast<std::size_t>(i)] = tree.step(i);
      kind[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(tree.kind(i));
      sibling[static_cast<std::size_t>(i)] = tree.sibling_rank(i);
    }
    leaves.assign(tree.leaves().begin(), tree.leaves().end());
    for (std::int32_t t = 0; t < tree.tree_count(); ++t) prompts.push_back(tree.info(t).prompt);
  }
  static std::vector<bg::tree_info> tree_infos(std::int32_t trees) {
    bg::require(trees >= 1, "Tree: trees = ", trees, ": must be at least 1");
    return std::vector<bg::tree_info>(static_cast<std::size_t>(trees));
  }

  bg::rollout_tree tree;
  std::vector<std::int32_t> parent, step, sibling, leaves;
  std::vector<std::uint8_t> kind;
  std::vector<std::int64_t> prompts;  ///< each tree's prompt
};

template <class T>
nb::ndarray<nb::numpy, const T, nb::ndim<1>> view(nb::handle owner, const std::vector<T>& values) {
  return nb::ndarray<nb::numpy, const T, nb::ndim<1>>(values.data(), {values.size()}, owner);
}

}  // namespace branchgrpo::python
