#pragma once
// TorchScript models exported from Python (torch.jit.script / torch.jit.trace, then .save) as a decoder and as a
// reward, so models the library does not implement natively (a VAE of another family, HPS-v2.1, PickScore,
// ImageReward; docs/export_rewards.md) plug into training.
//
//   load_torchscript(path, device)         torch::jit::load + eval(), one-line errors naming the file
//   torchscript_decoder{module, path}      forward(latents) -> images [B, C, H', W']
//   torchscript_reward{module, path, ...}  forward(images [B, 3, H, W] in [0, 1], prompts int64 [B]) -> scores [B];
//                                          models the core's Reward concept on torch_backend, its `decode`
//                                          turning leaf latents into those images first
//
// Scores of rows whose image holds a NaN or an infinity are NaN (the trainer drops their trees) whatever the
// module returns for them: the module sees zeros in their place, so one failed leaf cannot poison the batch.
//
//   check_torchscript_prompts(module, path, prompts, source)  a reward indexes its own prompt list: refuses one
//                                          exported (scripts/export_reward.py) for another list than the run's
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/torch/compat.hpp"

#pragma push_macro("CHECK")  // LibTorch's CHECK must not replace a test framework's (compat.hpp)
#include <torch/script.h>
#pragma pop_macro("CHECK")

namespace branchgrpo {

namespace detail {

/// The first line of an error message.
inline std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

/// One line of a LibTorch error: the first, except for the TorchScript interpreter's errors, whose first line
/// is a generic header and whose last line is the Python-side exception (e.g. "RuntimeError: shape ...").
inline std::string torch_error_line(const std::string& text) {
  if (text.find("Traceback of TorchScript") == std::string::npos) return first_line(text);
  const std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return first_line(text);
  const std::size_t newline = text.rfind('\n', end);
  const std::size_t begin = text.find_first_not_of(" \t", newline == std::string::npos ? 0 : newline + 1);
  return text.substr(begin, end + 1 - begin);
}

inline std::string torch_error_line(const c10::Error& e) {
  return torch_error_line(std::string(e.what_without_backtrace()));
}

}  // namespace detail

/// A TorchScript module from `path` on `device`, in eval mode, with a forward method.
/// Example: load_torchscript("missing.pt") throws "missing.pt: cannot open the TorchScript file: No such file or
///   directory"; a FIFO "x.pt: is a FIFO, not a TorchScript file"; a file
///   that is not a TorchScript archive throws "cannot load TorchScript file 'bad.pt': " + LibTorch's first line.
inline torch::jit::Module load_torchscript(const std::filesystem::path& path, torch::Device device = torch::kCPU) {
  // The one input-file check first: a FIFO or a directory is one line here, never a blocked or confused load.
  (void)open_input_file(path, {.what = "TorchScript file"});
  torch::jit::Module module;
  try {
    module = torch::jit::load(path.string(), device);
  } catch (const c10::Error& e) {
    fail("cannot load TorchScript file '", path.string(), "': ", detail::torch_error_line(e));
  } catch (const std::exception& e) {
    fail("cannot load TorchScript file '", path.string(), "': ", detail::torch_error_line(std::string(e.what())));
  }
  require(module.find_method("forward").has_value(), "TorchScript file '", path.string(), "' has no forward method");
  module.eval();
  return module;
}

/// The module attribute scripts/export_reward.py stores the exported-for prompt list in (List[str], index order).
inline constexpr const char* torchscript_prompts_attribute = "training_prompts";

/// The prompt list a reward module was exported for (attribute "training_prompts"), or nullopt for a module
/// without one (exported by hand, or before scripts/export_reward.py embedded the list).
/// Example: a module exported for prompts.safetensors holding "a cat\na dog" -> {"a cat", "a dog"}.
/// @post throws invalid_input naming `path` when the attribute is there but is not a list of strings.
inline std::optional<std::vector<std::string>> torchscript_prompts(const torch::jit::Module& module,
                                                                   const std::filesystem::path& path) {
  if (!module.hasattr(torchscript_prompts_attribute)) return std::nullopt;
  const torch::jit::IValue value = module.attr(torchscript_prompts_attribute);
  require(value.isList(), "TorchScript reward '", path.string(), "': attribute ", torchscript_prompts_attribute,
          " is a ", value.tagKind(), ", not a list of prompts");
  std::vector<std::string> prompts;
  for (const torch::jit::IValue& item : value.toListRef()) {
    require(item.isString(), "TorchScript reward '", path.string(), "': attribute ", torchscript_prompts_attribute,
            " holds a ", item.tagKind(), ", not only prompt strings");
    prompts.push_back(item.toStringRef());
  }
  return prompts;
}

/// Checks that a reward module scores the run's prompt list: its forward takes indices into the list it was
/// exported for, so a module made for another list would silently score every leaf against the wrong text.
/// `prompt_source` names where the run's prompts come from (the prompt-embeddings file or shard directory).
/// A module without an embedded list is accepted with one "warning:" line on `log` (it cannot be checked).
/// Example: a module exported for {"a cat", "a dog"} and a run on {"a cat", "a bird"} from prompts.safetensors
///   throws "TorchScript reward 'hps.pt' was exported for another prompt list than prompts.safetensors: prompt 1
///   is 'a dog' there, 'a bird' here (2 prompts there, 2 here); re-export it with scripts/export_reward.py
///   --prompts prompts.safetensors".
/// @post returns normally iff the lists are equal or the module has none; else throws invalid_input (one line).
inline void check_torchscript_prompts(const torch::jit::Module& module, const std::filesystem::path& path,
                                      std::span<const std::string> prompts, const std::string& prompt_source,
                                      std::ostream& log = std::cerr) {
  const std::optional<std::vector<std::string>> exported = torchscript_prompts(module, path);
  if (!exported) {
    log << "warning: TorchScript reward '" << path.string() << "' holds no prompt list (attribute "
        << torchscript_prompts_attribute << "; exported by hand or by an older script), so it is not checked against "
        << prompt_source << ": its prompt indices are trusted to mean the run's prompts\n";
    return;
  }
  if (std::equal(exported->begin(), exported->end(), prompts.begin(), prompts.end())) return;
  const auto [there, here] = std::mismatch(exported->begin(), exported->end(), prompts.begin(), prompts.end());
  const std::size_t at = static_cast<std::size_t>(there - exported->begin());
  std::string difference;
  if (there != exported->end() && here != prompts.end())
    difference = "prompt " + std::to_string(at) + " is '" + echo_middle(*there, 80) + "' there, '" +
                 echo_middle(*here, 80) + "' here";
  else
    difference = "the first " + std::to_string(at) + " prompts are the same";
  fail("TorchScript reward '", path.string(), "' was exported for another prompt list than ", prompt_source, ": ",
       difference, " (", exported->size(), " prompts there, ", prompts.size(),
       " here); re-export it with scripts/export_reward.py --prompts ", prompt_source);
}

namespace detail {

/// Runs `module.forward(inputs)` without autograd; LibTorch errors become one invalid_input line naming `path`.
inline torch::Tensor run_torchscript(torch::jit::Module& module, const std::filesystem::path& path,
                                     std::vector<torch::jit::IValue> inputs, const char* role) {
  torch::NoGradGuard no_grad;
  torch::jit::IValue out;
  try {
    out = module.forward(std::move(inputs));
  } catch (const c10::Error& e) {
    fail("TorchScript ", role, " '", path.string(), "' failed: ", torch_error_line(e));
  } catch (const std::exception& e) {  // the interpreter's own errors (torch::jit::JITException, ...)
    fail("TorchScript ", role, " '", path.string(), "' failed: ", torch_error_line(std::string(e.what())));
  }
  require(out.isTensor(), "TorchScript ", role, " '", path.string(), "' returned a ", out.tagKind(),
          " instead of a tensor");
  return out.toTensor();
}

}  // namespace detail

/// A TorchScript decoder: latents [B, ...] -> images [B, C, H, W] (whatever range the export produces; the
/// FLUX decoder's is [-1, 1], see unit_images in autoencoder.hpp).
/// Example: a module computing tanh(z[:, :3]) upsampled 2x maps [2, 4, 3, 5] to [2, 3, 6, 10].
/// @pre module loaded by load_torchscript (eval mode, on the device the latents are moved to).
struct torchscript_decoder {
  torch::jit::Module module;
  std::filesystem::path path;          ///< named in error messages
  torch::Device device = torch::kCPU;  ///< latents are moved here first

  /// @post a 4-D tensor with latents.size(0) rows (else invalid_input naming the file and the shape).
  torch::Tensor operator()(const torch::Tensor& latents) {
    require(latents.defined() && latents.dim() >= 1, "TorchScript decoder '", path.string(),
            "' needs latents [B, ...]");
    const torch::Tensor images = detail::run_torchscript(module, path, {latents.to(device)}, "decoder");
    require(images.dim() == 4 && images.size(0) == latents.size(0), "TorchScript decoder '", path.string(),
            "' returned ", images.sizes(), " for ", latents.size(0), " rows (expected [B, C, H, W])");
    return images;
  }
};

/// load_torchscript(path, device) wrapped as a decoder.
inline torchscript_decoder load_torchscript_decoder(const std::filesystem::path& path,
                                                    torch::Device device = torch::kCPU) {
  return {.module = load_torchscript(path, device), .path = path, .device = device};
}

/// Leaf latents [rows, ...] -> images [rows, 3, H, W] in [0, 1].
using image_decoder_fn = std::function<torch::Tensor(const torch::Tensor& leaves)>;

namespace detail {

/// A TorchScript reward model and how it is fed: what torchscript_reward and torchscript_video_reward hold.
struct torchscript_scorer {
  torch::jit::Module& module;
  const std::filesystem::path& path;
  const std::function<torch::Tensor(const torch::Tensor&)>& decode;  ///< empty: the leaves are the samples
  std::int64_t batch;
  torch::Device device;
  torch::Dtype dtype;
};

/// What a sample is for one kind of reward model: images [B, 3, H, W] or clips [B, F, 3, H, W], and the names
/// its messages use.
struct torchscript_samples {
  std::string_view type;     ///< the C++ type, e.g. "torchscript_reward"
  std::string_view model;    ///< e.g. "TorchScript reward"
  std::string_view samples;  ///< "images", "frames"
  std::string_view shape;    ///< the sample's dimensions after the rows, e.g. "3, H, W"
  std::int64_t dims = 4;     ///< with the rows
  std::int64_t channel_dim = 1;
  const char* what = "reward";        ///< run_torchscript's name of the call
  std::string_view items = "images";  ///< what the count of returned scores is of
};

/// The loop both TorchScript rewards share: chunks of `batch` leaves decoded without autograd, checked to be
/// [count, shape] with 3 channels, non-finite samples replaced by zeros (their scores NaN, so one failed leaf
/// cannot poison the batch), forward(samples, prompt ids) -> [count] scores.
inline std::vector<double> score_with_torchscript(const torchscript_scorer& scorer, const torch::Tensor& leaves,
                                                  std::span<const std::int64_t> prompts,
                                                  const torchscript_samples& kind) {
  const std::string name = std::string(kind.type) + " '" + scorer.path.string() + "'";
  require(scorer.batch >= 1, kind.type, ": batch ", scorer.batch, " must be at least 1");
  require(leaves.defined() && leaves.dim() >= 1, name, " needs leaves [rows, ...]");
  const std::int64_t rows = leaves.size(0);
  require(static_cast<std::int64_t>(prompts.size()) == rows, name, ": ", prompts.size(), " prompts for ", rows,
          " leaves");
  for (std::size_t r = 0; r < prompts.size(); ++r)
    require(prompts[r] >= 0, name, ": prompt index ", prompts[r], " at row ", r, " is negative");
  std::vector<double> scores;
  scores.reserve(static_cast<std::size_t>(rows));
  for (std::int64_t begin = 0; begin < rows; begin += scorer.batch) {
    const std::int64_t count = std::min(scorer.batch, rows - begin);
    torch::Tensor samples;
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor chunk = leaves.narrow(0, begin, count);
      samples = scorer.decode ? scorer.decode(chunk) : chunk;
    }
    require(samples.defined() && samples.dim() == kind.dims && samples.size(0) == count &&
                samples.size(kind.channel_dim) == 3,
            name, ": ", kind.samples, " must be [", count, ", ", kind.shape, "], got ",
            samples.defined() ? samples.sizes() : torch::IntArrayRef{});
    samples = samples.to(scorer.device, scorer.dtype);
    const torch::Tensor finite = torch::isfinite(samples).reshape({count, -1}).all(1);
    std::vector<std::int64_t> row_shape(static_cast<std::size_t>(kind.dims), 1);
    row_shape[0] = count;
    const torch::Tensor safe = torch::where(finite.view(row_shape), samples, torch::zeros_like(samples));
    const torch::Tensor prompt_ids =
        torch::tensor(std::vector<std::int64_t>(prompts.begin() + begin, prompts.begin() + begin + count),
                      torch::kInt64)
            .to(scorer.device);
    const torch::Tensor out = run_torchscript(scorer.module, scorer.path, {safe, prompt_ids}, kind.what);
    require(out.numel() == count, kind.model, " '", scorer.path.string(), "' returned ", out.sizes(), " for ", count,
            " ", kind.items, " (expected [", count, "])");
    const torch::Tensor values = out.reshape({count}).to(torch::kCPU, torch::kFloat64).contiguous();
    const torch::Tensor ok = finite.to(torch::kCPU);
    for (std::int64_t i = 0; i < count; ++i)
      scores.push_back(ok[i].item<bool>() ? values[i].item<double>() : std::nan(""));
  }
  return scores;
}

}  // namespace detail

/// A TorchScript reward model behind the core's Reward concept (torch_backend): the leaves are decoded to images
/// in [0, 1] by `decode` (identity when empty: the leaves are such images already), passed in chunks of `batch`
/// rows with their prompt indices (int64 [rows]) to forward(images, prompts) -> scores [rows].
/// Example: forward = mean of the image's channels weighted (1, 2, 3) + prompt; a grey 0.5 image with prompt 2
///   scores 0.5 * 6 + 2 = 5, the same image holding one NaN pixel scores NaN.
/// @pre prompts.size() == leaves.size(0); prompt indices non-negative; batch >= 1.
/// @post one score per leaf, in leaf order; NaN where the image was not finite.
struct torchscript_reward {
  torch::jit::Module module;
  std::filesystem::path path;            ///< named in error messages
  image_decoder_fn decode;               ///< leaves -> images in [0, 1]; empty: identity
  std::int64_t batch = 16;               ///< rows per forward call (memory bound of the reward model)
  torch::Device device = torch::kCPU;    ///< images and prompts are moved here
  torch::Dtype dtype = torch::kFloat32;  ///< images are converted to this dtype

  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
    return detail::score_with_torchscript(
        {.module = module, .path = path, .decode = decode, .batch = batch, .device = device, .dtype = dtype}, leaves,
        prompts,
        {.type = "torchscript_reward",
         .model = "TorchScript reward",
         .samples = "images",
         .shape = "3, H, W",
         .dims = 4,
         .channel_dim = 1,
         .what = "reward"});
  }
};

/// load_torchscript(path, device) wrapped as a reward with the given decoder (empty: leaves are images).
/// Example: load_torchscript_reward("hps.pt", [&](const torch::Tensor& z) { return ae->decode_images(z); }).
inline torchscript_reward load_torchscript_reward(const std::filesystem::path& path, image_decoder_fn decode = {},
                                                  torch::Device device = torch::kCPU) {
  return {.module = load_torchscript(path, device), .path = path, .decode = std::move(decode), .device = device};
}

}  // namespace branchgrpo
