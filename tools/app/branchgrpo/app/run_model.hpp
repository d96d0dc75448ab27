#pragma once
// What a training run trains, whatever its model family: the run_model (the transformer as a module, the prompts,
// the latent shape, the decoder, and the family's denoiser factory, set by run_model::hold<Family>), the
// run_denoiser every family's denoiser becomes, the config's dtype and device, and the loader parts every family
// shares (the prompts of data.embeddings with their negatives, a transformer built in place, its checkpoint checked
// for the family, the TorchScript decoder). The families themselves are app/families/<family>.hpp, listed in
// app/model_families.hpp (load_run_model picks one).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/memory.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/files/input_file.hpp"
#include "branchgrpo/model_specs/family.hpp"
#include "branchgrpo/model_specs/spec.hpp"
#include "branchgrpo/rollout/backend.hpp"
#include "branchgrpo/safetensors.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/policy.hpp"
#include "branchgrpo/torch/prompt_table.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/torchscript.hpp"

namespace branchgrpo {

/// Leaf latents [rows, C, h, w] -> images [rows, 3, H, W] in [-1, 1]; video latents [rows, C, F, h, w] -> frames
/// [rows, F', 3, H, W] in [-1, 1].
using latent_decoder_fn = std::function<torch::Tensor(const torch::Tensor& leaves)>;

/// Prompts the run evaluates on and never trains on ([eval] embeddings): their rows, strings and, under
/// classifier-free guidance, negatives (as run_model's own). Empty without [eval].
struct heldout_prompt_set {
  prompt_table embeddings;
  std::vector<std::string> prompts;
  prompt_embeddings negative_embeddings = {};
  std::vector<std::int64_t> negative_index = {};

  [[nodiscard]] bool empty() const { return prompts.empty(); }
};

/// The run's denoiser, whatever its family's: one TorchVelocityModel and Denoiser (velocity, operator(),
/// trainable_parameters, set_adapters_enabled) for the autograd policy, the rollout and the ODE sampler. It holds the
/// family's own denoiser (a transformer_denoiser, torch/transformer_denoiser.hpp) and forwards each call to it: the
/// app's one type erasure of a model, so that training_run and its policy are one type for every family.
class run_denoiser {
 public:
  template <class D>
  requires(!std::same_as<D, run_denoiser> && TorchVelocityModel<D> &&
           AdapterSwitch<D>) explicit run_denoiser(D denoiser)
      : self_(std::make_shared<D>(std::move(denoiser))), calls_(&calls_of<D>) {}

  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    return calls_->velocity(self_.get(), x, batch);
  }
  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    return calls_->denoise(self_.get(), x, batch);
  }
  std::vector<torch::Tensor> trainable_parameters() { return calls_->trainable(self_.get()); }
  void set_adapters_enabled(bool enabled) { calls_->adapters(self_.get(), enabled); }

 private:
  struct calls {
    torch::Tensor (*velocity)(void*, const torch::Tensor&, const denoise_batch&);
    torch::Tensor (*denoise)(void*, const torch::Tensor&, const denoise_batch&);
    std::vector<torch::Tensor> (*trainable)(void*);
    void (*adapters)(void*, bool);
  };
  template <class D>
  static constexpr calls calls_of = {
      .velocity = [](void* d, const torch::Tensor& x,
                     const denoise_batch& b) { return static_cast<D*>(d)->velocity(x, b); },
      .denoise = [](void* d, const torch::Tensor& x, const denoise_batch& b) { return (*static_cast<D*>(d))(x, b); },
      .trainable = [](void* d) { return static_cast<D*>(d)->trainable_parameters(); },
      .adapters = [](void* d, bool enabled) { static_cast<D*>(d)->set_adapters_enabled(enabled); }};

  std::shared_ptr<void> self_;
  const calls* calls_;
};

/// What a run trains: the transformer (base weights loaded, no adapters yet) of one family, the prompt table (for
/// Wan the context is the text the model attends to; pooled is unused), the latent shape ([C, h, w] or
/// [C, F, h, w]) and the decoder (empty: the latents are the images, as for the shapes model). A family's loader
/// fills it and sets the transformer with hold<Family>, which also records how the family makes its denoiser.
struct run_model {
  /// The transformer as a module (LoRA, parameters, device moves); set by hold().
  std::shared_ptr<torch::nn::Module> transformer;
  /// The family's spec (model_specs/spec.hpp): its name and medium; set by hold().
  const model_spec* family = nullptr;
  /// The prompts' rows: in memory for a model directory's prompts, read by row from the mapped files of
  /// data.embeddings (a prompt file or a shard directory) otherwise.
  prompt_table embeddings;
  std::vector<std::string> prompts;
  latent_shape shape;
  latent_decoder_fn decode;
  /// Classifier-free guidance (model.guidance_scale != 1): the negative prompts' table (rows like embeddings') and
  /// each prompt's negative row in it; empty without guidance.
  prompt_embeddings negative_embeddings = {};
  std::vector<std::int64_t> negative_index = {};
  /// The held-out prompts of [eval] (empty without it).
  heldout_prompt_set heldout = {};
  /// The noise levels a second expert runs at (Wan2.2's low-noise expert; model.guidance_scale_2 guides them); empty
  /// for a model of one. Set by the family's load.
  std::function<bool(double sigma)> second_expert_at;
  /// The family's denoiser over `table` under the run's [model] options (Family::denoiser); set by hold().
  std::function<run_denoiser(prompt_table table, const run_config& config)> make_denoiser;
  /// The transformer's gradient checkpointing on or off; set by hold().
  std::function<void(bool)> set_gradient_checkpointing;

  /// Holds `model` as this run's transformer of family `Family` (app/families/): the one place that knows its type.
  /// Example: m.hold<wan_family>(std::make_shared<wan_transformer>(config)) -> m.is_video(), m.network() is it, and
  ///   m.make_denoiser(table, run) is a wan_denoiser over it.
  template <class Family>
  void hold(std::shared_ptr<typename Family::transformer> model) {
    transformer = model;
    family = &Family::spec;
    make_denoiser = [model](prompt_table table, const run_config& config) {
      return run_denoiser(Family::denoiser(model, std::move(table), config));
    };
    set_gradient_checkpointing = [model](bool on) { model->set_gradient_checkpointing(on); };
  }

  /// Whether the family's latents are clips [C, F, h, w] (else images [C, h, w]); false before hold().
  [[nodiscard]] bool is_video() const { return family != nullptr && family->video; }
  [[nodiscard]] torch::nn::Module& network() const { return *transformer; }
};

/// torch dtype and device of the config's model section.
inline torch::Dtype run_dtype(const run_config& config) {
  return config.model.dtype == "bfloat16"  ? torch::kBFloat16
         : config.model.dtype == "float16" ? torch::kFloat16
                                           : torch::kFloat32;
}
inline torch::Device run_device(const run_config& config) {
  const torch::Device device(config.model.device);
  require(!device.is_cuda() || torch::cuda::is_available(), config.source, ": model.device = \"", config.model.device,
          "\": CUDA is not available in this build or on this machine");
  return device;
}

/// Where the run's prompts come from: data.embeddings (a prompt file or a shard directory) when set, else the
/// model directory's prompts.safetensors.
/// Example: data.embeddings = "prompts/" in /runs/a.toml -> "/runs/prompts/".
inline std::filesystem::path run_prompt_path(const run_config& config) {
  return !config.data.embeddings.empty() ? config.input_path(config.data.embeddings)
                                         : config.input_path(config.model.dir) / "prompts.safetensors";
}

/// The text length of the run's prompt embeddings (the context tensor's second dimension, from the header of
/// data.embeddings (its first shard for a directory) or model.dir's prompts.safetensors); 512 (FLUX's T5 length) when
/// the file has no such tensor.
inline std::int64_t run_text_tokens(const run_config& config) {
  const std::filesystem::path path = run_prompt_path(config);
  const safetensors_file file(std::filesystem::is_directory(path) ? detail::prompt_shards(path).front() : path);
  const safetensors_tensor* context = file.find("context");
  return context != nullptr && context->shape.size() == 3 ? context->shape[1] : 512;
}

namespace detail {

/// The negatives of `file` that the config's guidance uses, into `negatives` and `index` (each of the file's
/// `prompt_count` prompts' negative row; nothing when model.guidance_scale is 1): every prompt's own negative, or
/// the one model.negative_prompt names. One line naming the key or the file otherwise.
inline void take_negative_prompts(const run_config& config, prompt_dataset& file, const std::string& source,
                                  std::size_t prompt_count, prompt_embeddings& negatives,
                                  std::vector<std::int64_t>& index) {
  const model_section& m = config.model;
  if (!m.guided()) return;
  require(file.has_negatives(), source, ": model.guidance_scale = ", m.guidance_scale,
          " needs negative prompts, and the file has none (write them with scripts/export_prompt_embeddings.py "
          "--negative-prompt, or set model.guidance_scale = 1)");
  negatives = std::move(file.negative_embeddings);
  index = std::move(file.negative_index);
  if (m.negative_prompt.empty()) return;
  const auto found = std::find(file.negative_prompts.begin(), file.negative_prompts.end(), m.negative_prompt);
  require(found != file.negative_prompts.end(), config.source, ": model.negative_prompt = \"",
          echo_middle(m.negative_prompt, 80), "\" is none of the ", file.negative_prompts.size(),
          " negative prompts of ", source);
  index.assign(prompt_count, found - file.negative_prompts.begin());
}

/// The text encoder a named config's released weights were trained with ("" for the test and shipped shapes).
inline std::string expected_encoder(const model_section& m) {
  const named_model_config* named = find_named_config(m.config);
  return named == nullptr ? "" : std::string(named->text_encoder);
}

/// A transformer of `shape` created in model.dtype and moved to model.device before any weights are loaded into
/// it: a released checkpoint is then copied tensor by tensor into its place, and no float32 copy of the whole
/// model ever exists on the host (FLUX.1-dev: 24 GB in bfloat16 instead of 48 GB).
template <class Transformer, class Shape>
std::shared_ptr<Transformer> make_in_place(const run_config& config, const Shape& shape) {
  std::shared_ptr<Transformer> model;
  {
    const default_dtype_guard in_dtype(run_dtype(config));
    model = std::make_shared<Transformer>(shape);
  }
  model->to(run_device(config));
  return model;
}

/// model.weights' tensors in model.dtype: each refused unless of model_weight_dtypes and finite, naming the file.
inline std::map<std::string, torch::Tensor> load_weights_file(const run_config& config) {
  return load_safetensors(config.input_path(config.model.weights),
                          {.dtype = run_dtype(config), .allowed_dtypes = model_weight_dtypes, .finite = true});
}

/// model.weights loaded into `model` (load_weights_file, then Family::load_weights: any of the family's layouts,
/// detected). Every error is one line naming the key and the file: a checkpoint of another family is refused from
/// its header before any tensor is copied, one of this family that does not fit model.config with the problems
/// listed.
/// Example: model.config = "tiny" with model.weights = "moving-shapes-tiny/model.safetensors" (Wan's names) throws
///   "run.toml: model.weights = \"/m/moving-shapes-tiny/model.safetensors\": holds Wan weights (all 123 tensors
///   have Wan names); model.config = \"tiny\" is a FLUX model (give a FLUX checkpoint, or a Wan config: wan-tiny,
///   wan-t2v-1.3b or wan-t2v-14b)"; FLUX.1-schnell's weights under model.config = "dev" throw
///   "run.toml: model.weights = \"...\": does not fit model.config = \"dev\": FLUX checkpoint (bfl layout) does not
///   match the config: missing guidance_in.in_layer.weight, ...".
template <class Family>
void load_run_weights(typename Family::transformer& model, const run_config& config) {
  const model_section& m = config.model;
  const std::string key = config.source + ": model.weights = \"" + path_text(config.input_path(m.weights)) + "\"";
  {
    const safetensors_checkpoint header(config.input_path(m.weights));  // mapped: names, shapes, dtypes only
    std::vector<std::string_view> names;
    for (const safetensors_tensor& tensor : header.tensors()) names.push_back(tensor.name);
    const model_spec& want = Family::spec;
    if (const model_spec* found = weights_family(names); found != nullptr && found->name != want.name) {
      const std::size_t count = family_score(names, *found);
      fail(key, ": holds ", found->label, " weights (",
           count == names.size() ? "all " + std::to_string(count)
                                 : std::to_string(count) + " of its " + std::to_string(names.size()),
           " tensors have ", found->label, " names); model.config = \"", m.config, "\" is a ", want.label,
           " model (give a ", want.label, " checkpoint, or a ", found->label,
           " config: ", config_list(*found, config_order::random_first), ")");
    }
  }
  const std::map<std::string, torch::Tensor> tensors = load_weights_file(config);
  try {
    Family::load_weights(model, tensors);
  } catch (const invalid_input& error) {
    fail(key, ": does not fit model.config = \"", m.config, "\": ", error.what());
  }
}

/// One "warning:" line on stderr when rows of a prompt set (`source`: its file or shard directory) hold the same
/// prompt: each row is a prompt of its own to the schedule, so the repeated one is trained (or evaluated) more.
/// Example: rows 3 and 7 of p.safetensors both "a red circle" -> "warning: p.safetensors: rows 3 and 7 hold the
///   same prompt 'a red circle'"; with more repeated rows: "... (and 2 more rows repeat an earlier prompt)".
inline void warn_repeated_prompts(std::span<const std::string> prompts, const std::filesystem::path& source) {
  const std::optional<repeated_prompt> repeated = find_repeated_prompt(prompts);
  if (!repeated) return;
  std::string line = "warning: " + path_text(source) + ": rows " + std::to_string(repeated->first) + " and " +
                     std::to_string(repeated->second) + " hold the same prompt '" +
                     echo_middle(prompts[repeated->second], 80) + "'";
  if (repeated->repeats > 1)
    line += " (and " + std::to_string(repeated->repeats - 1) + " more " +
            (repeated->repeats == 2 ? "row repeats" : "rows repeat") + " an earlier prompt)";
  std::fprintf(stderr, "%s\n", line.c_str());
}

/// Throws invalid_input unless eval.embeddings' rows (`heldout`) fit in one table with the training prompts'
/// (`train`): the same tokens, width and pooled width, which a file exported for another model family or text
/// encoder does not have (the model's own checks pass a shorter Wan text, or a FLUX file of another length).
/// Example: eval.embeddings = the moving-shapes model's prompts (5 tokens) beside shapes-tiny's (3) throws
///   "run.toml: eval.embeddings = \"/m/moving-shapes-tiny/prompts.safetensors\": prompts of 5 tokens x 32 features
///   (pooled 32); the training prompts (/m/shapes-tiny/prompts.safetensors) are 3 tokens x 32 features (pooled 32):
///   export the held-out prompts for the same model and text encoder (scripts/export_prompt_embeddings.py)".
inline void check_heldout_table(const run_config& config, const prompt_table& train, const prompt_table& heldout) {
  if (heldout.tokens() == train.tokens() && heldout.width() == train.width() &&
      heldout.pooled_width() == train.pooled_width())
    return;
  const auto dims = [](const prompt_table& t) {
    return std::to_string(t.tokens()) + " tokens x " + std::to_string(t.width()) + " features (" +
           (t.has_pooled() ? "pooled " + std::to_string(t.pooled_width()) : std::string("no pooled vectors")) + ")";
  };
  fail(config.source, ": eval.embeddings = \"", path_text(config.input_path(config.eval.embeddings)), "\": prompts of ",
       dims(heldout), "; the training prompts (", path_text(run_prompt_path(config)), ") are ", dims(train),
       ": export the held-out prompts for the same model and text encoder (scripts/export_prompt_embeddings.py)");
}

/// data.embeddings (a prompt file or a shard directory, mapped: open_prompt_dataset; when given, or without
/// model.dir) into `out`, then eval.embeddings (with [eval]) into out.heldout: each checked against the model's
/// `shape` (the family's config: check_prompt_dataset), made for `family` (its spec's name) and its encoder, with the
/// negatives the config's guidance uses. One line naming the file otherwise.
template <class Shape>
void load_run_prompts(const run_config& config, std::string_view family, const Shape& shape, run_model& out) {
  const auto open = [&](const std::string& key_value) {
    const std::filesystem::path path = config.input_path(key_value);
    prompt_dataset file = open_prompt_dataset(path);
    check_prompt_dataset(file, shape, path.string());
    check_prompt_source(file.source_metadata(), family, expected_encoder(config.model), path.string());
    return std::pair{std::move(file), path.string()};
  };
  if (!config.data.embeddings.empty() || config.model.dir.empty()) {
    auto [file, source] = open(config.data.embeddings);
    out.embeddings = file.rows;
    out.prompts = std::move(file.prompts);
    take_negative_prompts(config, file, source, out.prompts.size(), out.negative_embeddings, out.negative_index);
  }
  warn_repeated_prompts(out.prompts, run_prompt_path(config));
  if (config.eval.enabled()) {
    auto [file, source] = open(config.eval.embeddings);
    warn_repeated_prompts(file.prompts, source);
    check_heldout_table(config, out.embeddings, file.rows);
    heldout_prompt_set& heldout = out.heldout;
    heldout.embeddings = file.rows;
    heldout.prompts = std::move(file.prompts);
    take_negative_prompts(config, file, source, heldout.prompts.size(), heldout.negative_embeddings,
                          heldout.negative_index);
    require(heldout.prompts.size() * static_cast<std::size_t>(config.eval.samples) >= 2, config.source,
            ": eval.samples = ", config.eval.samples, ": ", source, " holds ", heldout.prompts.size(),
            " prompt; an evaluation's interval needs at least 2 samples in all");
  }
}

/// Throws invalid_input unless the run's guidance (model.guidance_scale != 1) has its negative prompts.
inline void require_guidance_negatives(const run_config& config, const run_model& out) {
  const model_section& m = config.model;
  require(!m.guided() || !out.negative_index.empty(), config.source, ": model.guidance_scale = ", m.guidance_scale,
          " needs negative prompts: give data.embeddings a file with them (model.dir = \"", m.dir, "\" has none)");
}

/// Throws invalid_input unless the images (a video model's: the clips' frames) that the reward entry `where`
/// ("rewards[0]", "eval.rewards[1]") named `name` scores are at least min_side x min_side pixels, as far as they are
/// known before the run: with model.decoder = "pixels" the latents are the images. (FLUX's and Wan's autoencoders
/// make images 8 times the latent's sides, more than any in-process reward needs; a TorchScript decoder's images
/// are known only when it runs, and a reward's own check names them then.)
/// Example: model.latent_height = 2 with [[rewards]] name = "alignment" (images of at least 3 x 3) throws
///   "run.toml: rewards[0] (alignment) scores images of at least 3 x 3 pixels; model.latent_height = 2 and
///   model.latent_width = 16 make 2 x 16 (model.decoder = \"pixels\": the latents are the images)".
inline void check_reward_image_size(const run_config& config, const run_model& model, const std::string& where,
                                    std::string_view name, std::int64_t min_side) {
  if (config.model.decoder != "pixels") return;
  const std::vector<std::int64_t>& dims = model.shape.dims;  // [C, h, w] or [C, F, h, w]
  const std::int64_t h = dims[dims.size() - 2], w = dims.back();
  if (h >= min_side && w >= min_side) return;
  fail(config.source, ": ", where, " (", name, ") scores ", model.is_video() ? "frames" : "images", " of at least ",
       min_side, " x ", min_side, " pixels; model.latent_height = ", h, " and model.latent_width = ", w, " make ", h,
       " x ", w, " (model.decoder = \"pixels\": the latents are the images)");
}

/// Whether model.decoder names a TorchScript decoder (*.pt, *.ptl) rather than an autoencoder's safetensors.
inline bool is_torchscript_decoder_path(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".pt" || ext == ".ptl";
}

/// A TorchScript decoder (latents -> images [rows, 3, H, W] or frames [rows, F, 3, H, W]) on `device`, its output
/// clamped to [-1, 1]: the image and the video loaders' one path for it.
inline latent_decoder_fn torchscript_latent_decoder(const std::filesystem::path& path, torch::Device device) {
  auto decoder = std::make_shared<torchscript_decoder>(load_torchscript_decoder(path, device));
  return [decoder](const torch::Tensor& z) { return (*decoder)(z).clamp(-1.0, 1.0); };
}

}  // namespace detail

}  // namespace branchgrpo
