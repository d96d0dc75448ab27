#pragma once
// An iteration's trace: what `branchgrpo train --trace DIR` writes for every iteration, one safetensors file
// DIR/trace-NNNNNN.safetensors (NNNNNN the iteration, from 0), read by python/tests/test_flux_equality.py to hold the
// Python package's rollout, rewards and credit against the tool's (docs/cli.md, "branchgrpo train"). It is the
// trainer's iteration_view (training/trainer.hpp) after stage 3, before the update, as tensors:
//
//   latents.<s>      [rows, latent...]  the rollout's latents at step s = 0 .. steps, in the run's dtype; rows are
//                                       tree.nodes_at_step(s) in order (latents.0: the roots' initial noise)
//   prompts          I64 [trees]        each tree's prompt row (tree t is the iteration's t-th prompt)
//   rewards          F64 [leaves]       each leaf's reward, tree.leaves() order (NaN: the reward failed)
//   log_probs        F64 [nodes]        each node's edge log-prob in the rollout (roots and ODE edges 0)
//   edge_advantage   F64 [nodes]        a trained edge's advantage (the edge into the node), else 0
//   trained          I64 [edges]        the trained nodes (SDE edges the pruner keeps), by step
//   __metadata__     "iteration" (decimal), "format" ("branchgrpo.trace 1")
//
// Nodes are the forest's: tree t's nodes are [t n, (t + 1) n) with n nodes per tree, as the core's rollout_tree
// numbers them. An iteration whose trees were all dropped (every one with a non-finite reward) has no credit: its
// edge_advantage is 0 everywhere and trained is empty.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/training/trainer.hpp"

namespace branchgrpo {

/// The trace file of iteration `iteration` under `dir`: "<dir>/trace-<iteration, 6 digits>.safetensors".
/// Example: iteration_trace_path("out/trace", 0) == "out/trace/trace-000000.safetensors".
inline std::filesystem::path iteration_trace_path(const std::filesystem::path& dir, int iteration) {
  return dir / ("trace-" + zero_padded(iteration, 6) + ".safetensors");
}

/// The tensors of an iteration's trace (see the file comment), on the CPU.
/// Example: branch on 2 prompts over 10 steps -> latents.0 [2, C, H, W], latents.10 [32, C, H, W], prompts [2],
///   rewards [32], log_probs and edge_advantage [118], trained [116].
/// @pre one process: view.forest's trees are view.result's (else invalid_input naming the ranks' share).
inline std::map<std::string, torch::Tensor> iteration_trace_tensors(const iteration_view<torch_backend>& view) {
  const rollout_tree& forest = view.forest;
  require(view.share.first == 0 && view.share.last == forest.tree_count(),
          "an iteration trace is one process's: this rank holds trees [", view.share.first, ", ", view.share.last,
          ") of ", forest.tree_count());
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const auto doubles = [&](const std::vector<double>& values) { return torch::tensor(values, f64); };
  std::map<std::string, torch::Tensor> out;
  for (std::size_t s = 0; s < view.result.latents.size(); ++s)
    out["latents." + std::to_string(s)] = view.result.latents[s].detach().to(torch::kCPU);
  std::vector<std::int64_t> prompts;
  for (std::int32_t t = 0; t < forest.tree_count(); ++t) prompts.push_back(forest.info(t).prompt);
  out["prompts"] = torch::tensor(prompts, torch::kInt64);
  out["rewards"] = doubles(view.leaves.scores);
  out["log_probs"] = doubles(std::vector<double>(forest.log_probs().begin(), forest.log_probs().end()));
  const edge_credit* credit = view.credit;
  out["edge_advantage"] = credit ? doubles(credit->edge_advantage) : torch::zeros({forest.node_count()}, f64);
  out["trained"] =
      credit ? torch::tensor(std::vector<std::int64_t>(credit->trained.begin(), credit->trained.end()), torch::kInt64)
             : torch::zeros({0}, torch::kInt64);
  return out;
}

/// Writes iteration_trace_tensors(view) to iteration_trace_path(dir, view.iteration) atomically; returns the path.
/// Example: write_iteration_trace("out/trace", view of iteration 3) -> "out/trace/trace-000003.safetensors".
/// @pre `dir` exists; one process (iteration_trace_tensors).
inline std::filesystem::path write_iteration_trace(const std::filesystem::path& dir,
                                                   const iteration_view<torch_backend>& view) {
  const std::filesystem::path path = iteration_trace_path(dir, view.iteration);
  save_safetensors(path, iteration_trace_tensors(view),
                   {{"iteration", std::to_string(view.iteration)}, {"format", "branchgrpo.trace 1"}});
  return path;
}

}  // namespace branchgrpo
