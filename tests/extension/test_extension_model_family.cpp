// docs/extending.md, "A model family": a toy family added through exactly the page's steps: its torch-free spec,
// its entry (transformer, loader, denoiser, latent shape, size) and one list entry
// (model_families::with<toy_family>), here in this file as a user's own, with no edit of the library. It is
// loaded, planned in memory and trained through the same entry points as FLUX and Wan2.1.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "branchgrpo/app/model_families.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/training_run.hpp"
#include "error_text.hpp"

namespace bg = branchgrpo;
using bg::testing::error_of;

namespace {

// Step 1: the spec (torch-free: model_specs/<family>/spec.hpp in the library).
constexpr std::array toy_configs = {
    bg::named_model_config{.name = "toy-net", .weights_name = "net", .released = false}};
constexpr std::array<std::string_view, 1> toy_layouts = {"toy"};
constexpr std::array<std::string_view, 1> toy_formats = {"comfyui"};
const std::set<std::string>& toy_patterns() {
  static const std::set<std::string> patterns = {"proj.weight", "proj.bias"};
  return patterns;
}
constexpr bg::model_spec toy_spec = {.name = "toy",
                                     .label = "Toy",
                                     .title = "toy transformer",
                                     .video = false,
                                     .metadata_key = "test.toy_config",
                                     .configs = toy_configs,
                                     .layouts = toy_layouts,
                                     .lora_formats = toy_formats,
                                     .patterns = toy_patterns};

// Step 2: the transformer and its call (torch/<family>/ in the library): the velocity of each pixel is a linear
// map (a lora_linear, so LoRA adapts it) of its channels, the prompt's mean text vector and sigma.
struct toy_config {
  std::int64_t channels = 3;
  std::int64_t text_width = 4;
};

struct toy_transformer : torch::nn::Module {
  explicit toy_transformer(const toy_config& c) : config(c) {
    proj = register_module("proj", std::make_shared<bg::lora_linear>(c.channels + c.text_width + 1, c.channels, true,
                                                                     bg::linear_role::mlp));
  }
  // x [rows, C, h, w], context [rows, L, W] -> [rows, C, h, w].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context, double sigma) {
    const torch::Tensor pixels = x.permute({0, 2, 3, 1});  // [rows, h, w, C]
    const torch::Tensor text = context.mean(1)
                                   .to(x.scalar_type())
                                   .view({x.size(0), 1, 1, -1})
                                   .expand({x.size(0), x.size(2), x.size(3), config.text_width});
    const torch::Tensor level = torch::full({x.size(0), x.size(2), x.size(3), 1}, sigma, x.options());
    return proj->forward(torch::cat({pixels, text, level}, -1)).permute({0, 3, 1, 2});
  }
  void set_gradient_checkpointing(bool on) { checkpointing = on; }

  toy_config config;
  std::shared_ptr<bg::lora_linear> proj;
  bool checkpointing = false;
};

struct toy_call {
  using model_type = toy_transformer;
  std::shared_ptr<toy_transformer> model;
  [[nodiscard]] torch::Device device() const { return model->proj->weight.device(); }
  torch::Tensor operator()(const torch::Tensor& x, const bg::prompt_embeddings& text, double sigma) const {
    return model->forward(x, text.context, sigma);
  }
  void check(const bg::prompt_table& table) const {
    bg::require(table.width() == model->config.text_width, "toy: prompts of width ", table.width(), ", the model's ",
                model->config.text_width);
  }
};
using toy_denoiser = bg::transformer_denoiser<toy_call>;

// Step 3: the family's entry (app/families/<family>.hpp in the library).
struct toy_family {
  static constexpr const bg::model_spec& spec = toy_spec;
  using config_type = toy_config;
  using transformer = toy_transformer;

  static toy_config named(std::string_view) { return {}; }
  static toy_config parse(std::string_view, std::string_view source) {
    bg::fail(source, ": a toy model has no model directory");
  }
  static bg::latent_shape latent(const bg::run_config& config, const toy_config& c) {
    return bg::latent_shape{{c.channels, config.model.latent_height, config.model.latent_width}};
  }
  static bg::transformer_size size(const toy_config& c, const bg::latent_shape& shape, std::int64_t text_tokens) {
    const std::int64_t in = c.channels + c.text_width + 1;
    const std::array<std::vector<std::int64_t>, 2> shapes = {std::vector<std::int64_t>{c.channels, in},
                                                             std::vector<std::int64_t>{c.channels}};
    struct tensor {
      std::vector<std::int64_t> shape;
    };
    bg::transformer_size out{.layers = 1,
                             .hidden = static_cast<double>(in),
                             .mlp = 0,
                             .heads = 0,
                             .tokens = static_cast<double>(shape.dims[1] * shape.dims[2]),
                             .keys = 0,
                             .prompt_width = static_cast<double>(c.text_width)};
    out.count(std::array{tensor{shapes[0]}, tensor{shapes[1]}});
    (void)text_tokens;
    return out;
  }
  static void load_weights(toy_transformer& model, const std::map<std::string, torch::Tensor>& tensors) {
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters()) {
      const auto it = tensors.find(item.key());
      bg::require(it != tensors.end(), "toy checkpoint: missing ", item.key());
      item.value().copy_(it->second);
    }
  }
  static toy_denoiser denoiser(std::shared_ptr<toy_transformer> model, bg::prompt_table table, const bg::run_config&) {
    return toy_denoiser(toy_call{.model = std::move(model)}, std::move(table));
  }
  // Two prompts with random text vectors of 2 tokens; the latents are the images (3 channels).
  static bg::run_model load(const bg::run_config& config) {
    torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    const toy_config c = named(config.model.config);
    bg::run_model out;
    out.hold<toy_family>(std::make_shared<toy_transformer>(c));
    out.prompts = {"a red circle", "a blue square"};
    out.embeddings =
        bg::prompt_table(bg::prompt_embeddings{.context = torch::randn({2, 2, c.text_width}), .pooled = {}});
    out.shape = latent(config, c);
    return out;
  }
  static std::shared_ptr<torch::nn::Module> base_transformer(const bg::run_config& config, const toy_config& c) {
    torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
    return std::make_shared<toy_transformer>(c);
  }
};

// Step 4: the one list entry.
using families = bg::model_families::with<toy_family>;
static_assert(bg::ModelFamily<toy_family>);
static_assert(
    std::same_as<families::configs,
                 std::variant<bg::flux_config, bg::wan_config, bg::sd3_config, bg::wan22_config, toy_config>>);

bg::run_config toy_run(const std::string& name) {
  bg::run_config config;
  config.model.dir = "";
  config.model.config = "toy-net";
  config.model.latent_height = 4;
  config.model.latent_width = 4;
  config.rollout.steps = 10;  // the default tree splits at 0, 3, 6 and 9
  config.data.prompts_per_iteration = 2;
  config.lora.rank = 2;
  config.lora.targets = {"mlp"};
  config.rewards = {{.name = "jpeg_compressibility", .weight = 1.0, .params = {}}};
  config.run.iterations = 1;
  config.run.output_dir = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(config.run.output_dir);
  return config;
}

}  // namespace

TEST_CASE("a toy model family added as one list entry is loaded, sized and trained like FLUX and Wan") {
  const bg::run_config config = toy_run("branchgrpo_test_extension_model_family");
  REQUIRE(std::holds_alternative<toy_config>(bg::run_transformer_config<families>(config)));
  CHECK(bg::run_latent_shape<families>(config, toy_config{}) == bg::latent_shape{{3, 4, 4}});

  bg::run_model model = bg::load_run_model<families>(config);
  CHECK(model.family == &toy_spec);
  CHECK_FALSE(model.is_video());
  CHECK(model.shape == bg::latent_shape{{3, 4, 4}});

  // The memory estimate from the family's size: 3 x 8 weights + 3 biases = 27 parameters in float32.
  const bg::run_memory_estimate e = bg::estimate_run_memory<families>(config, toy_config{}, 2);
  CHECK(e.weights == 27 * 4);
  CHECK(e.training == 2 * (3 + 8) * 4 * 3);  // rank 2 x (3 + 8) sides: gradient and two moments

  bg::weighted_sum reward = bg::make_run_reward(config, model);
  bg::training_run run(config, model, std::move(reward));
  const auto lora_b = [&] { return bg::lora_parameters(model.network()).at(1).clone(); };
  const torch::Tensor before = lora_b();
  const bg::iteration_stats stats = run.step();
  CHECK(run.iteration() == 1);
  CHECK(stats.edges_trained > 0);
  CHECK_FALSE(torch::equal(before, lora_b()));  // B starts at 0; one step moves it

  // The base weights export-lora merges into come from the family too.
  CHECK(bg::run_base_weights<families>(config).size() == 2);
}

TEST_CASE("the shipped list does not know the toy family, and says which families it has") {
  const bg::run_config config = toy_run("branchgrpo_test_extension_model_family_unknown");
  CHECK(error_of([&] { (void)bg::run_transformer_config(config); }) ==
        "config: model.config = \"toy-net\": none of the model families (flux, wan, sd3, wan22) names it");
  CHECK(error_of([&] { (void)bg::run_transformer_config<families>(config); }) == "(no error)");
}
