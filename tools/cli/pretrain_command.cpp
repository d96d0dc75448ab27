#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <numbers>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/optim.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/png.hpp"

namespace branchgrpo::cli {
namespace {

using clock_type = std::chrono::steady_clock;

struct pretrain_options {
  std::string out;
  int steps = 1200;
  std::uint64_t seed = 0;
  std::int64_t batch = 32;
  double lr = 2e-3;
  int warmup = 100;
  double ema = 0.995;
  std::string t_sampling = "logit-normal";
  std::string config_json;
  int grid_samples = 8;
  int grid_scale = 4;
  int log_every = 100;
  int threads = 0;
  bool quiet = false;
};

// The shapes config with the JSON object's fields replacing its own. The data fix in_channels (3 x 2 x 2) and
// guidance_embed (no guidance); every other flux_config field may be given.
flux_config config_from_json(const std::string& text) {
  flux_config config = shapes_flux_config();
  if (text.empty()) return config;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    fail("--config-json is not valid JSON: ", error.what());
  }
  require(json.is_object(), "--config-json must be a JSON object, got ", json.dump());
  const auto integer = [](const nlohmann::json& value, const std::string& key) {
    require(value.is_number_integer(), "--config-json '", key, "' must be an integer, got ", value.dump());
    return value.get<std::int64_t>();
  };
  const auto number = [](const nlohmann::json& value, const std::string& key) {
    require(value.is_number(), "--config-json '", key, "' must be a number, got ", value.dump());
    return value.get<double>();
  };
  for (const auto& [key, value] : json.items()) {
    if (key == "hidden")
      config.hidden = integer(value, key);
    else if (key == "heads")
      config.heads = integer(value, key);
    else if (key == "depth_double")
      config.depth_double = integer(value, key);
    else if (key == "depth_single")
      config.depth_single = integer(value, key);
    else if (key == "vec_in")
      config.vec_in = integer(value, key);
    else if (key == "context_in")
      config.context_in = integer(value, key);
    else if (key == "rope_theta")
      config.rope_theta = number(value, key);
    else if (key == "mlp_ratio")
      config.mlp_ratio = number(value, key);
    else if (key == "qkv_bias") {
      require(value.is_boolean(), "--config-json 'qkv_bias' must be true or false, got ", value.dump());
      config.qkv_bias = value.get<bool>();
    } else if (key == "rope_axes") {
      require(value.is_array() && value.size() == 3, "--config-json 'rope_axes' must be 3 integers, got ",
              value.dump());
      for (std::size_t a = 0; a < 3; ++a) config.rope_axes[a] = integer(value[a], key);
    } else {
      fail("--config-json: unknown or fixed key '", key,
           "' (hidden, heads, depth_double, depth_single, rope_axes, rope_theta, vec_in, context_in, mlp_ratio, "
           "qkv_bias)");
    }
  }
  validate(config);
  return config;
}

void validate(const pretrain_options& o) {
  require(o.steps >= 1, "--steps must be at least 1, got ", o.steps);
  require(o.batch >= 1, "--batch must be at least 1, got ", o.batch);
  require(std::isfinite(o.lr) && o.lr > 0, "--lr must be positive, got ", o.lr);
  require(o.warmup >= 0, "--warmup must be non-negative, got ", o.warmup);
  require(o.ema >= 0 && o.ema < 1, "--ema must be in [0, 1), got ", o.ema);
  require(o.grid_samples >= 1, "--grid-samples must be at least 1, got ", o.grid_samples);
  require(o.grid_scale >= 1 && o.grid_scale <= 16, "--grid-scale must be in [1, 16], got ", o.grid_scale);
  require(o.log_every >= 1, "--log-every must be at least 1, got ", o.log_every);
  require(o.threads >= 0, "--threads must be non-negative, got ", o.threads);
  require(static_cast<std::uint64_t>(o.steps) <= max_noise_iteration, "--steps ", o.steps, " exceeds ",
          max_noise_iteration);
}

// Learning rate of step s: linear warmup over `warmup` steps, then cosine decay to 10 % at the last step.
double learning_rate(const pretrain_options& o, int step) {
  if (step < o.warmup) return o.lr * (step + 1) / o.warmup;
  const double progress = o.steps - o.warmup <= 1 ? 1.0 : double(step - o.warmup) / (o.steps - o.warmup - 1);
  return o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

// Keyed draws of one training step: eps [batch, 3, 16, 16] (stream edge, tree = row) and one normal n per row
// (stream auxiliary); t = sigmoid(n) (logit-normal) or Phi(n) (uniform).
struct step_noise {
  torch::Tensor eps;
  torch::Tensor t;
};

step_noise draw_noise(const pretrain_options& o, int step) {
  const std::int64_t per_row = 3 * shapes_image_size * shapes_image_size;
  std::vector<double> eps(static_cast<std::size_t>(o.batch * per_row));
  std::vector<double> t(static_cast<std::size_t>(o.batch));
  for (std::int64_t r = 0; r < o.batch; ++r) {
    const noise_key key{.seed = o.seed,
                        .iteration = static_cast<std::uint32_t>(step),
                        .tree = static_cast<std::uint32_t>(r),
                        .stream = noise_stream::edge};
    fill_keyed_normal(
        key, std::span<double>(eps).subspan(static_cast<std::size_t>(r * per_row), static_cast<std::size_t>(per_row)));
    const double n = keyed_normal({.seed = o.seed,
                                   .iteration = static_cast<std::uint32_t>(step),
                                   .tree = static_cast<std::uint32_t>(r),
                                   .stream = noise_stream::auxiliary},
                                  0);
    t[static_cast<std::size_t>(r)] =
        o.t_sampling == "uniform" ? 0.5 * std::erfc(-n / std::numbers::sqrt2) : 1.0 / (1.0 + std::exp(-n));
  }
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::from_blob(eps.data(), {o.batch, 3, shapes_image_size, shapes_image_size}, f64).to(torch::kFloat32),
          torch::from_blob(t.data(), {o.batch}, f64).to(torch::kFloat32)};
}

// Images [rows, 3, H, W] as a grid of `columns` tiles per row, each pixel a scale x scale block, 2-pixel gaps.
rgb_image image_grid(const torch::Tensor& images, int columns, int scale = 4) {
  const auto rows_count = static_cast<int>((images.size(0) + columns - 1) / columns);
  const auto h = static_cast<int>(images.size(2)), w = static_cast<int>(images.size(3));
  constexpr int gap = 2;
  rgb_image grid;
  grid.width = columns * (w * scale + gap) + gap;
  grid.height = rows_count * (h * scale + gap) + gap;
  grid.pixels.assign(static_cast<std::size_t>(grid.width) * static_cast<std::size_t>(grid.height) * 3, 255);
  for (std::int64_t n = 0; n < images.size(0); ++n) {
    const std::vector<std::uint8_t> rgb = image_to_rgb8(images[n]);
    const int x0 = gap + static_cast<int>(n % columns) * (w * scale + gap);
    const int y0 = gap + static_cast<int>(n / columns) * (h * scale + gap);
    for (int y = 0; y < h * scale; ++y)
      for (int x = 0; x < w * scale; ++x)
        for (int k = 0; k < 3; ++k)
          grid.pixels[(static_cast<std::size_t>(y0 + y) * static_cast<std::size_t>(grid.width) +
                       static_cast<std::size_t>(x0 + x)) *
                          3 +
                      static_cast<std::size_t>(k)] =
              rgb[(static_cast<std::size_t>(y / scale) * static_cast<std::size_t>(w) +
                   static_cast<std::size_t>(x / scale)) *
                      3 +
                  static_cast<std::size_t>(k)];
  }
  return grid;
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (const double v : values) sum += v;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

void run_pretrain(const pretrain_options& o) {
  validate(o);
  const flux_config config = config_from_json(o.config_json);
  if (o.threads > 0) torch::set_num_threads(o.threads);
  const std::filesystem::path dir(o.out);
  std::filesystem::create_directories(dir);

  const std::vector<std::string> prompts = shapes_prompts();
  const prompt_embeddings embeddings = shapes_word_embeddings(prompts, config.context_in, config.vec_in);

  torch::manual_seed(o.seed);  // the initial weights
  auto model = std::make_shared<flux_transformer>(config);
  {
    // The output layer starts at zero (adaLN-Zero style): the first velocity is 0, the loss starts at E|eps - x0|^2.
    torch::NoGradGuard no_grad;
    model->final_layer->linear->weight.zero_();
    model->final_layer->linear->bias.zero_();
  }
  std::vector<torch::Tensor> parameters = model->parameters();
  std::int64_t parameter_count = 0;
  for (const torch::Tensor& p : parameters) parameter_count += p.numel();
  auto optimizer = make_adamw(parameters, {.lr = o.lr, .weight_decay = 1e-4});
  ema_weights ema;
  ema.decay = o.ema;
  ema.reset(parameters);

  const auto start = clock_type::now();
  double window_loss = 0, last_loss = 0;
  int window = 0;
  for (int step = 0; step < o.steps; ++step) {
    const shapes_batch batch = make_shapes_batch(o.seed, static_cast<std::uint64_t>(step) * o.batch, o.batch);
    const step_noise noise = draw_noise(o, step);
    const torch::Tensor t = noise.t.view({o.batch, 1, 1, 1});
    const torch::Tensor x_t = (1 - t) * batch.images + t * noise.eps;
    const torch::Tensor target = noise.eps - batch.images;
    const torch::Tensor rows = torch::tensor(batch.prompts, torch::kInt64);
    const torch::Tensor v = model->forward_latents(x_t, embeddings.context.index_select(0, rows),
                                                   embeddings.pooled.index_select(0, rows), noise.t);
    const torch::Tensor loss = (v - target).square().mean();
    for (auto& group : optimizer->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(learning_rate(o, step));
    optimizer->zero_grad();
    loss.backward();
    clip_gradient_norm(parameters, 1.0);
    optimizer->step();
    ema.update(parameters);
    const double value = loss.item<double>();
    require(std::isfinite(value), "pretraining diverged at step ", step, ": loss ", value);
    window_loss += value;
    ++window;
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
      last_loss = window_loss / window;
      if (!o.quiet) {
        const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        std::cerr << "pretrain step " << step + 1 << "/" << o.steps << "  loss " << fixed(last_loss, 4) << "  lr "
                  << learning_rate(o, step) << "  " << fixed(seconds / (step + 1), 3) << " s/step\n";
      }
      window_loss = 0;
      window = 0;
    }
  }
  const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (o.ema > 0) ema.swap(parameters);  // save and sample the averaged weights
  model->eval();

  // The model, its prompts, and what made it.
  std::ostringstream training;
  training << "data=shapes 3x16x16 (shapes.hpp);steps=" << o.steps << ";batch=" << o.batch << ";lr=" << o.lr
           << ";warmup=" << o.warmup << ";schedule=cosine to 0.1;ema=" << o.ema << ";t_sampling=" << o.t_sampling
           << ";seed=" << o.seed << ";weight_decay=0.0001;clip=1;final_loss=" << last_loss
           << ";seconds=" << fixed(seconds, 1);
  save_safetensors(dir / "model.safetensors", flux_state(*model),
                   {{"format", "pt"},
                    {std::string(flux_config_metadata_key), format_flux_config(config)},
                    {"branchgrpo.latent", "pixels: RGB in [-1, 1], 3 x 16 x 16; decode (x + 1) / 2 clamped"},
                    {"branchgrpo.pretrain", training.str()}});
  save_prompt_file(dir / "prompts.safetensors", embeddings, prompts);

  // Samples (ODE, 20 steps, shift 3) and data set images, one row per prompt, scored with the rewards.
  std::vector<std::int64_t> grid_prompts;
  for (std::int64_t p = 0; p < shapes_prompt_count; ++p)
    for (int s = 0; s < o.grid_samples; ++s) grid_prompts.push_back(p);
  const torch::Tensor samples = shapes_sample_ode(*model, embeddings, grid_prompts, o.seed);
  std::vector<torch::Tensor> data_images;
  for (std::size_t i = 0; i < grid_prompts.size(); ++i)
    data_images.push_back(shapes_render(shapes_draw(o.seed ^ 0xDA7Aull, i, grid_prompts[i])));
  const torch::Tensor data = torch::stack(data_images);
  write_png((dir / "samples.png").string(), image_grid(samples, o.grid_samples, o.grid_scale));
  write_png((dir / "data.png").string(), image_grid(data, o.grid_samples, o.grid_scale));

  const shape_alignment alignment;
  const std::vector<double> sample_alignment = alignment(samples, grid_prompts);
  const std::vector<double> data_alignment = alignment(data, grid_prompts);
  std::vector<double> per_prompt(static_cast<std::size_t>(shapes_prompt_count), 0.0);
  for (std::size_t i = 0; i < grid_prompts.size(); ++i)
    per_prompt[static_cast<std::size_t>(grid_prompts[i])] += sample_alignment[i] / o.grid_samples;
  nlohmann::json summary = {
      {"out", dir.string()},
      {"steps", o.steps},
      {"batch", o.batch},
      {"seed", o.seed},
      {"parameters", parameter_count},
      {"model_bytes", std::filesystem::file_size(dir / "model.safetensors")},
      {"flux_config", format_flux_config(config)},
      {"final_loss", last_loss},
      {"seconds", seconds},
      {"alignment", mean(sample_alignment)},
      {"alignment_per_prompt", per_prompt},
      {"data_alignment", mean(data_alignment)},
      {"jpeg_kb", -mean(jpeg_compressibility{}(samples, grid_prompts))},
      {"data_jpeg_kb", -mean(jpeg_compressibility{}(data, grid_prompts))},
  };
  std::ofstream(dir / "pretrain.json") << summary.dump(2) << '\n';
  std::cout << summary.dump() << '\n';
}

}  // namespace

void add_pretrain_command(CLI::App& app) {
  auto options = std::make_shared<pretrain_options>();
  CLI::App* pretrain = app.add_subcommand(
      "pretrain", "Train a tiny FLUX transformer by flow matching on the procedural shapes data set");
  pretrain->add_option("--out", options->out, "Directory for model.safetensors, prompts.safetensors and the PNGs")
      ->required()
      ->type_name("DIR");
  pretrain->add_option("--steps", options->steps, "Optimizer steps")->type_name("N")->capture_default_str();
  pretrain->add_option("--seed", options->seed, "Seed of the weights, the data and the noise")
      ->type_name("S")
      ->capture_default_str();
  pretrain->add_option("--batch", options->batch, "Images per step")->type_name("B")->capture_default_str();
  pretrain->add_option("--lr", options->lr, "Peak AdamW learning rate")->type_name("LR")->capture_default_str();
  pretrain->add_option("--warmup", options->warmup, "Linear warmup steps (then cosine decay to 10%)")
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_option("--ema", options->ema, "EMA decay of the saved weights (0: none)")
      ->type_name("D")
      ->capture_default_str();
  pretrain->add_option("--t-sampling", options->t_sampling, "Distribution of the training noise level t")
      ->check(CLI::IsMember({"logit-normal", "uniform"}))
      ->type_name("logit-normal|uniform")
      ->capture_default_str();
  pretrain
      ->add_option(
          "--config-json", options->config_json,
          "FLUX config fields replacing the shapes config's, e.g. '{\"hidden\": 96, \"rope_axes\": [16, 16, 16]}'")
      ->type_name("JSON");
  pretrain->add_option("--grid-samples", options->grid_samples, "Samples per prompt in samples.png")
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_option("--grid-scale", options->grid_scale, "Screen pixels per image pixel in the PNG grids")
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_option("--log-every", options->log_every, "Steps between progress lines")
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_option("--threads", options->threads, "LibTorch intra-op threads (0: LibTorch's default)")
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_flag("--quiet", options->quiet, "No progress lines");
  pretrain->callback([options] { run_pretrain(*options); });
}

}  // namespace branchgrpo::cli
