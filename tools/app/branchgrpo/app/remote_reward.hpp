#pragma once
// [[rewards]] name = "remote": the leaves scored by a reward server (docs/rewards.md "Remote rewards"), through
// remote_client.hpp. Groupwise: the server gets each tree's leaves together, with the prompt strings, so a
// groupwise scorer on the server side works as well as a pointwise one.
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/app/remote_client.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/training/concepts.hpp"

namespace branchgrpo {

/// A reward server's scores of decoded leaves: images [rows, 3, H, W] or clips [rows, F, 3, H, W] in [-1, 1], sent
/// losslessly as float32 with each row's prompt text (`prompts[prompt index]`), tree and leaf index. A row holding
/// a non-finite value scores NaN without being sent (its tree is dropped, as with the in-process rewards).
/// Example: the shipped shapes model's leaves against `reward_server.py --scorer shapes_alignment` -> the scores of
///   the in-process shape_alignment to 1e-12 (tests/rewards/test_remote_run.cpp).
/// @pre prompt indices index `prompts`; groups.rows() == rows (else invalid_input naming both); a failing server
///      throws remote_client's one line.
class remote_reward {
 public:
  remote_reward(remote_options options, std::vector<std::string> prompts)
      : client_(std::make_shared<remote_client>(std::move(options))), prompts_(std::move(prompts)) {}

  /// Checks the server before the first iteration: it answers /info and runs the scorer for this media.
  void check_server() { (void)client_->check_scorer(); }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> rows_prompts,
                                 const leaf_groups& groups) {
    const auto rows = static_cast<std::int64_t>(rows_prompts.size());
    require(leaves.defined() && leaves.dim() >= 4 && leaves.size(0) == rows, "remote reward: ", rows,
            " prompts for leaves of shape ", leaves.defined() ? leaves.sizes() : c10::IntArrayRef{});
    require(groups.rows() == rows_prompts.size(), "remote reward: ", rows, " rows in ", groups.keys.size(),
            " groups of ", groups.leaves_per_tree);
    const torch::Tensor pixels = leaves.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    const std::vector<std::int64_t> shape(pixels.sizes().begin() + 1, pixels.sizes().end());
    const auto per_row = static_cast<std::size_t>(pixels[0].numel());
    const std::span<const float> all(pixels.data_ptr<float>(), static_cast<std::size_t>(pixels.numel()));
    std::vector<double> out(rows_prompts.size(), std::numeric_limits<double>::quiet_NaN());
    std::vector<remote_item> items;
    std::vector<std::size_t> sent;  // the rows behind items
    for (std::size_t r = 0; r < rows_prompts.size(); ++r) {
      const std::int64_t p = rows_prompts[r];
      require(p >= 0 && p < static_cast<std::int64_t>(prompts_.size()), "remote reward row ", r, " has prompt ", p,
              ", the prompt list has ", prompts_.size());
      const std::span<const float> row = all.subspan(r * per_row, per_row);
      bool finite = true;
      for (const float v : row) finite = finite && std::isfinite(v);
      if (!finite) continue;
      const auto tree = r / static_cast<std::size_t>(groups.leaves_per_tree);
      items.push_back({.prompt = prompts_[static_cast<std::size_t>(p)],
                       .prompt_index = p,
                       .group = groups.keys[tree],
                       .leaf = static_cast<std::int64_t>(r % static_cast<std::size_t>(groups.leaves_per_tree)),
                       .shape = shape,
                       .pixels = row});
      sent.push_back(r);
    }
    last_components_->clear();
    if (items.empty()) return out;
    const remote_scores scores = client_->score(items);
    for (std::size_t i = 0; i < sent.size(); ++i) out[sent[i]] = scores.scores[i];
    for (const auto& [name, values] : scores.components) {
      std::vector<double>& rows_of = (*last_components_)[name];
      rows_of.assign(rows_prompts.size(), std::numeric_limits<double>::quiet_NaN());
      for (std::size_t i = 0; i < sent.size(); ++i) rows_of[sent[i]] = values[i];
    }
    return out;
  }

  /// The named components the server returned with the last call's scores, one value per row (NaN for a row not
  /// sent); empty when it returned none. Copies of this reward share them.
  /// Example: shapes_alignment's {"colour": [...], "shape": [...]} -> logged as reward/remote/colour, .../shape.
  [[nodiscard]] std::map<std::string, std::vector<double>> last_components() const { return *last_components_; }

 private:
  std::shared_ptr<remote_client> client_;  // shared: a weighted_sum term is a copyable std::function
  std::vector<std::string> prompts_;
  std::shared_ptr<std::map<std::string, std::vector<double>>> last_components_ =
      std::make_shared<std::map<std::string, std::vector<double>>>();
};

}  // namespace branchgrpo
