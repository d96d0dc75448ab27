#pragma once
// The model families a run can train, as one list: load_run_model, the run's transformer shape, memory planning and
// `export-lora`'s base weights go through it, so nothing outside a family's own header (app/families/<family>.hpp)
// tests which family a run is. Its torch-free half, the model_spec of each family (names, medium, configs, layouts,
// LoRA keys, bench models), is model_specs/registry.hpp, which the run config, `weights`, `export-lora` and `bench`
// read.
//
//   model_families                     family_list<flux_family, wan_family, sd3_family, wan22_family>
//   run_transformer                    std::variant<flux_config, wan_config, sd3_config, wan22_config>
//   run_transformer_config(config)     model.config's named shape, or model.dir's metadata
//   load_run_model(config)             the family's loader: transformer, prompts, latent shape, decoder
//   run_base_weights(config)           the transformer's weights before training, by name (export-lora --merge)
//
// A family is a struct with (ModelFamily): spec (its model_spec), config_type, transformer (a torch module with
// set_gradient_checkpointing), named(model.config), parse(metadata text, source), latent(config, shape),
// size(shape, latent, text tokens), load_weights(transformer, tensors), denoiser(transformer, table, config),
// load(config) and base_transformer(config, shape). Adding one: its header and one entry in model_families
// (docs/extending.md, "A model family"); each function here takes the list as a template argument, so a program
// may train its own family through family_list<...>::with<its_family> without editing this file.
#include <array>
#include <concepts>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/app/families/flux.hpp"
#include "branchgrpo/app/families/sd3.hpp"
#include "branchgrpo/app/families/wan.hpp"
#include "branchgrpo/app/families/wan22.hpp"
#include "branchgrpo/app/run_model.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/transformer_size.hpp"
#include "branchgrpo/config/run_config.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/safetensors.hpp"

namespace branchgrpo {

/// What model_families needs of a family (see the file comment).
template <class F>
concept ModelFamily = requires(const run_config& run, const typename F::config_type& c, const latent_shape& shape,
                               std::shared_ptr<typename F::transformer> model, prompt_table table) {
  { F::spec } -> std::convertible_to<const model_spec&>;
  requires std::derived_from<typename F::transformer, torch::nn::Module>;
  model->set_gradient_checkpointing(true);
  { F::named(std::string_view()) } -> std::same_as<typename F::config_type>;
  { F::parse(std::string_view(), std::string_view()) } -> std::same_as<typename F::config_type>;
  { F::latent(run, c) } -> std::same_as<latent_shape>;
  { F::size(c, shape, std::int64_t{}) } -> std::same_as<transformer_size>;
  F::load_weights(*model, std::map<std::string, torch::Tensor>());
  { F::denoiser(model, table, run) } -> TorchVelocityModel;
  { F::load(run) } -> std::same_as<run_model>;
  { F::base_transformer(run, c) } -> std::convertible_to<std::shared_ptr<torch::nn::Module>>;
};

/// A list of model families. `configs` is the variant of their shapes; with<G...> the list with G... appended.
/// @pre the families' config types are distinct (a shape tells its family).
template <ModelFamily... F>
struct family_list {
  using configs = std::variant<typename F::config_type...>;
  template <ModelFamily... G>
  using with = family_list<F..., G...>;

  /// fn(std::type_identity<Family>{}, shape) for the family whose config `shape` holds.
  template <class Fn>
  static decltype(auto) visit(const configs& shape, Fn&& fn) {
    return std::visit([&](const auto& c) -> decltype(auto) { return fn(family_of<std::decay_t<decltype(c)>>{}, c); },
                      shape);
  }
  /// fn(std::type_identity<Family>{}) for each family in order until one returns true; whether one did.
  template <class Fn>
  static bool any(Fn&& fn) {
    return (fn(std::type_identity<F>{}) || ...);
  }
  /// The families' names: "flux, wan, sd3, wan22".
  static std::string names() { return name_list(std::array{F::spec.name...}, ", "); }

 private:
  template <class C>
  using family_of = std::type_identity<
      std::tuple_element_t<0, decltype(std::tuple_cat(std::conditional_t<std::same_as<typename F::config_type, C>,
                                                                         std::tuple<F>, std::tuple<>>()...))>>;
  template <class C>
  static constexpr int families_of = (int{std::same_as<typename F::config_type, C>} + ...);
  static_assert(((families_of<typename F::config_type> == 1) && ...),
                "two model families share a config type: a run's shape must tell its family");
};

/// The families `branchgrpo` trains.
using model_families = family_list<flux_family, wan_family, sd3_family, wan22_family>;

/// The transformer shape of a run: a FLUX or SD3 (image), or a Wan2.1 or Wan2.2 (video) one.
using run_transformer = model_families::configs;

/// The transformer shape of a run: model.config's named shape (its family's `named`), or the config in the
/// metadata of model.dir's model.safetensors under a family's key (only its header is read; the file is mapped,
/// not loaded). A file declaring two families is refused naming it and both keys (require_one_model_family).
/// Example: model.config = "wan-tiny" -> named_wan_config("wan-tiny"); model.dir = models/shapes-tiny -> its
///   flux_config; a directory whose file has neither key -> "m/model.safetensors: no __metadata__ key
///   'branchgrpo.flux_config' or 'branchgrpo.wan_config'".
template <class Families = model_families>
typename Families::configs run_transformer_config(const run_config& config) {
  const model_section& m = config.model;
  std::optional<typename Families::configs> out;
  if (m.dir.empty()) {
    Families::any([&]<class F>(std::type_identity<F>) {
      if (F::spec.find(m.config) != nullptr) out = F::named(m.config);
      return out.has_value();
    });
    require(out.has_value(), config.source, ": model.config = \"", m.config, "\": none of the model families (",
            Families::names(), ") names it");
    return *out;
  }
  const std::filesystem::path path = config.input_path(m.dir) / "model.safetensors";
  const safetensors_file file(path);
  require_one_model_family(file.metadata(), path.string());
  std::vector<std::string> keys;
  Families::any([&]<class F>(std::type_identity<F>) {
    keys.push_back("'" + std::string(F::spec.metadata_key) + "'");
    const auto it = file.metadata().find(std::string(F::spec.metadata_key));
    if (it != file.metadata().end()) out = F::parse(it->second, path.string());
    return out.has_value();
  });
  if (!out) fail(path.string(), ": no __metadata__ key ", name_list(keys));
  return *out;
}

/// The FLUX shape of an image run (run_transformer_config, refusing a video model).
inline flux_config run_flux_config(const run_config& config) {
  const run_transformer model = run_transformer_config(config);
  if (const auto* flux = std::get_if<flux_config>(&model)) return *flux;
  const model_spec& found = model_families::visit(
      model, []<class F>(std::type_identity<F>, const auto&) -> const model_spec& { return F::spec; });
  fail(config.source, ": model.", config.model.dir.empty() ? "config" : "dir", " is a ", found.label, " (",
       found.video ? "video" : "image", ") model where a ", flux_spec.label, " (image) model is expected");
}

/// The run's latent shape (its family's `latent`): [C, h, w] for images, [C, F, h, w] for clips.
template <class Families = model_families>
latent_shape run_latent_shape(const run_config& config, const typename Families::configs& model) {
  return Families::visit(model, [&]<class F>(std::type_identity<F>, const auto& c) { return F::latent(config, c); });
}

/// Loads what [model] and [data] name, through the family of run_transformer_config: its transformer (model.dir's
/// or model.config's with model.weights), the prompt embeddings, the latent shape and the decoder. Errors are one
/// line naming the file or the key.
template <class Families = model_families>
run_model load_run_model(const run_config& config) {
  return Families::visit(run_transformer_config<Families>(config),
                         [&]<class F>(std::type_identity<F>, const auto&) { return F::load(config); });
}

/// The run's base transformer weights in its family's native layout (bfl / official names), loaded as
/// load_run_model loads the transformer (model.dir's weights, or model.config's random initialization from
/// run.seed with model.weights over it), then rounded to model.dtype as the training run held them.
template <class Families = model_families>
std::map<std::string, torch::Tensor> run_base_weights(const run_config& config) {
  const std::shared_ptr<torch::nn::Module> model =
      Families::visit(run_transformer_config<Families>(config),
                      [&]<class F>(std::type_identity<F>, const auto& c) -> std::shared_ptr<torch::nn::Module> {
                        return F::base_transformer(config, c);
                      });
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model->named_parameters())
    out.emplace(item.key(), item.value().detach().to(run_dtype(config)));
  return out;
}

}  // namespace branchgrpo
