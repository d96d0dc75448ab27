#pragma once
// [[rewards]] name = "vlm_judge": each decoded leaf scored by a vision-language model served behind an
// OpenAI-compatible chat endpoint (vLLM, SGLang), as the probability that it answers "yes" to a question about the
// leaf's prompt (vlm_judge_client.hpp; docs/rewards.md "VLM judge"). Pointwise: one request per leaf, in order.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "branchgrpo/app/png.hpp"
#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/vlm_judge_client.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/stop.hpp"
#include "branchgrpo/torch/compat.hpp"

namespace branchgrpo {

/// A VLM judge's scores of decoded leaves: images [rows, 3, H, W] in [-1, 1], or clips [rows, F, 3, H, W] of which
/// the middle frame (index F / 2) is judged (a still: the judge sees no motion). Each row goes out as an 8-bit PNG
/// (image_to_rgb8: byte = round(255 clamp((x + 1) / 2, 0, 1))) with the question about its prompt
/// (`prompts[prompt index]`); a row holding a non-finite value scores NaN without being sent (its tree is dropped,
/// as with the other rewards).
/// Example: a red 8 x 8 leaf of prompt "a red circle" against tests/rewards/fake_openai_server.py -> (0.05 + 0.8)
///   / 0.9 = 0.9444...; against `vllm serve Qwen/Qwen2.5-VL-7B-Instruct`, P(yes) / (P(yes) + P(no)).
/// @pre leaves [rows, 3, H, W] or [rows, F, 3, H, W] with rows == prompt indices, indices within `prompts` (else
///      invalid_input naming them); a failing server throws vlm_judge_client's one line.
/// @post one score per row, in [0, 1] or NaN (non-finite row).
class vlm_judge_reward {
 public:
  vlm_judge_reward(vlm_judge_options options, std::vector<std::string> prompts)
      : client_(std::make_shared<vlm_judge_client>(std::move(options))), prompts_(std::move(prompts)) {}

  /// Checks the server before the first iteration: it lists the model at /v1/models.
  void check_model() { client_->check_model(); }

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> rows_prompts) {
    const bool clips = leaves.defined() && leaves.dim() == 5 && leaves.size(1) >= 1;
    const torch::Tensor images =
        detail::reward_images(clips ? leaves.select(1, leaves.size(1) / 2) : leaves, rows_prompts, "vlm judge");
    for (std::size_t r = 0; r < rows_prompts.size(); ++r)  // all before the first request
      require(rows_prompts[r] >= 0 && rows_prompts[r] < static_cast<std::int64_t>(prompts_.size()), "vlm judge row ", r,
              " has prompt ", rows_prompts[r], ", the prompt list has ", prompts_.size());
    std::vector<double> out(rows_prompts.size(), std::numeric_limits<double>::quiet_NaN());
    for (std::size_t r = 0; r < rows_prompts.size(); ++r) {
      const std::int64_t p = rows_prompts[r];
      const auto row = static_cast<std::int64_t>(r);
      if (!detail::row_finite(images, row)) continue;
      check_stop("scoring by the vlm judge");  // between requests (core/stop.hpp)
      const rgb_image image{.width = static_cast<int>(images.size(3)),
                            .height = static_cast<int>(images.size(2)),
                            .pixels = image_to_rgb8(images[row])};
      out[r] = client_->score(prompts_[static_cast<std::size_t>(p)], encode_png(image));
    }
    return out;
  }

 private:
  std::shared_ptr<vlm_judge_client> client_;  // shared: a weighted_sum term is a copyable std::function
  std::vector<std::string> prompts_;
};

}  // namespace branchgrpo
