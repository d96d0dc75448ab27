#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "branchgrpo/app/moving_shapes.hpp"
#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/app/video_rewards.hpp"
#include "branchgrpo/core/error.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/optim.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "cli/commands.hpp"
#include "cli/images/png.hpp"
#include "cli/options/memory_budget.hpp"
#include "cli/options/number_options.hpp"
#include "cli/output/output_file.hpp"
#include "cli/runs/signals.hpp"

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
  bool video = false;  ///< the moving-shapes clips and a Wan2.1-architecture transformer
};

// --config-json as a JSON object ("" = {}); one line naming the problem otherwise.
nlohmann::json config_json_object(const std::string& text) {
  if (text.empty()) return nlohmann::json::object();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    fail("--config-json is not valid JSON: ", error.what());
  }
  require(json.is_object(), "--config-json must be a JSON object, got ", echo_text(json.dump()));
  return json;
}

// A --config-json field's value. An integer beyond int64 (an unsigned 2^64 - 1) is refused, never wrapped; the
// config's limits come after (validate).
std::int64_t json_integer(const nlohmann::json& value, const std::string& key) {
  require(value.is_number_integer(), "--config-json '", key, "' must be an integer, got ", echo_text(value.dump()));
  return parse_integer<std::int64_t>(value.dump(), "--config-json '" + key + "'");
}
double json_number(const nlohmann::json& value, const std::string& key) {
  require(value.is_number(), "--config-json '", key, "' must be a number, got ", echo_text(value.dump()));
  return value.get<double>();
}
std::array<std::int64_t, 3> json_triple(const nlohmann::json& value, const std::string& key) {
  require(value.is_array() && value.size() == 3, "--config-json '", key, "' must be 3 integers, got ",
          echo_text(value.dump()));
  return {json_integer(value[0], key), json_integer(value[1], key), json_integer(value[2], key)};
}

// One --config-json key: the config field it sets. The fields' types decide how the value is read.
template <class Config>
struct json_field {
  std::string_view key;
  std::variant<std::int64_t Config::*, double Config::*, bool Config::*, std::array<std::int64_t, 3> Config::*> field;
};

// `config` with the JSON object's fields replacing its own; a key outside `fields` is refused with the list
// (`what`: "" or " for --video"), then the config's own limits apply (validate). One reader for both families.
// Example: '{"hidden": 96}' on the shapes config -> hidden 96; '{"in_channels": 4}' -> "--config-json: unknown or
//   fixed key 'in_channels' (hidden, heads, ...)".
template <class Config, std::size_t N>
Config config_from_json(const std::string& text, Config config, const std::array<json_field<Config>, N>& fields,
                        std::string_view what) {
  const nlohmann::json json = config_json_object(text);
  for (const auto& [key, value] : json.items()) {
    const auto it = std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.key == key; });
    if (it == fields.end()) {
      std::string names;
      for (const auto& f : fields) names += (names.empty() ? "" : ", ") + std::string(f.key);
      fail("--config-json: unknown or fixed key '", key, "'", what, " (", names, ")");
    }
    std::visit(
        [&]<class T>(T Config::*field) {
          if constexpr (std::is_same_v<T, std::int64_t>)
            config.*field = json_integer(value, key);
          else if constexpr (std::is_same_v<T, double>)
            config.*field = json_number(value, key);
          else if constexpr (std::is_same_v<T, bool>) {
            require(value.is_boolean(), "--config-json '", key, "' must be true or false, got ",
                    echo_text(value.dump()));
            config.*field = value.template get<bool>();
          } else {
            config.*field = json_triple(value, key);
          }
        },
        it->field);
  }
  validate(config);
  return config;
}

// The image model: the shapes config's fields but in_channels (3 x 2 x 2, the data's) and guidance_embed (no
// guidance).
constexpr std::array<json_field<flux_config>, 10> flux_json_fields{{{"hidden", &flux_config::hidden},
                                                                    {"heads", &flux_config::heads},
                                                                    {"depth_double", &flux_config::depth_double},
                                                                    {"depth_single", &flux_config::depth_single},
                                                                    {"rope_axes", &flux_config::rope_axes},
                                                                    {"rope_theta", &flux_config::rope_theta},
                                                                    {"vec_in", &flux_config::vec_in},
                                                                    {"context_in", &flux_config::context_in},
                                                                    {"mlp_ratio", &flux_config::mlp_ratio},
                                                                    {"qkv_bias", &flux_config::qkv_bias}}};

// The video model: the moving-shapes config's fields but in_dim and out_dim (3 pixel channels) and text_len (the
// prompts').
constexpr std::array<json_field<wan_config>, 8> wan_json_fields{{{"dim", &wan_config::dim},
                                                                 {"ffn_dim", &wan_config::ffn_dim},
                                                                 {"heads", &wan_config::heads},
                                                                 {"layers", &wan_config::layers},
                                                                 {"freq_dim", &wan_config::freq_dim},
                                                                 {"text_dim", &wan_config::text_dim},
                                                                 {"patch", &wan_config::patch},
                                                                 {"rope_theta", &wan_config::rope_theta}}};

// The most --threads: 4 per hardware thread (at least 4, at most 1024). More only adds stacks and contention.
int max_threads() { return static_cast<int>(std::clamp(4u * std::thread::hardware_concurrency(), 4u, 1024u)); }

// The counts' ranges are checked as the flags are parsed (add_pretrain_command); these are the real numbers'.
void validate(const pretrain_options& o) {
  require(o.lr > 0, "--lr must be positive, got ", o.lr);
  require(o.ema >= 0 && o.ema < 1, "--ema must be in [0, 1), got ", o.ema);
}

// Parameters of the transformer, from the config alone (nothing built): per double block two streams of qkv,
// projection, MLP and 6-way modulation; per single block the fused qkv + MLP input, the output and 3-way
// modulation; the embeddings and the final layer are small and counted roughly.
double parameter_estimate(const flux_config& c) {
  const auto h = static_cast<double>(c.hidden), m = static_cast<double>(c.mlp_hidden());
  const double double_block = 2 * (4 * h * h + 2 * h * m + 6 * h * h);
  const double single_block = h * (3 * h + m) + (h + m) * h + 3 * h * h;
  const double rest = h * (static_cast<double>(c.in_channels + c.vec_in + c.context_in) + 256 + 2 * h) +
                      h * static_cast<double>(c.in_channels);
  return static_cast<double>(c.depth_double) * double_block + static_cast<double>(c.depth_single) * single_block + rest;
}

// Bytes one image costs a training step, upper-bound-ish: its keyed noise (float64, then float32 copies) and the
// activations autograd keeps for the backward (float32): per block about 12 hidden-wide and 3 MLP-wide values
// per token, and the attention scores and probabilities (2 x heads x tokens^2); a double block counts twice
// (image and text streams). Tokens: 64 image (16 x 16, 2 x 2 patches) + the prompts' words (at most 8).
double bytes_per_image(const flux_config& c) {
  const double tokens = 64 + 8;
  const double per_block = tokens * static_cast<double>(12 * c.hidden + 3 * c.mlp_hidden()) +
                           2 * static_cast<double>(c.heads) * tokens * tokens;
  const double blocks = static_cast<double>(2 * c.depth_double + c.depth_single);
  const double noise = 3.0 * shapes_image_size * shapes_image_size * (8 + 4 + 4);
  return 4 * per_block * blocks + noise;
}

// The memory the sizes imply, checked before the model is built: the weights with their gradients, AdamW
// moments and EMA copy (5 float32 each), a step's batch, and the sample grids (every prompt x --grid-samples);
// `parameters` and `sample_bytes` from the family's estimates.
void check_memory(const pretrain_options& o, double parameters, double sample_bytes, std::int64_t prompts) {
  const double model = 5 * 4 * parameters;
  require_fits(model, "--config-json = " + echo_text(o.config_json.empty() ? "{}" : o.config_json),
               "the model and its optimizer state");
  require_fits(model + static_cast<double>(o.batch) * sample_bytes, setting_text("--batch", o.batch),
               "a training step");
  require_fits(model + static_cast<double>(prompts) * o.grid_samples * sample_bytes,
               setting_text("--grid-samples", o.grid_samples), "the sample grids");
}

// Learning rate of step s: linear warmup over `warmup` steps, then cosine decay to 10 % at the last step.
double learning_rate(const pretrain_options& o, int step) {
  if (step < o.warmup) return o.lr * (step + 1) / o.warmup;
  const double progress = o.steps - o.warmup <= 1 ? 1.0 : double(step - o.warmup) / (o.steps - o.warmup - 1);
  return o.lr * (0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
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

// Keyed draws of one training step: eps [batch, sample...] (stream edge, tree = row) and one normal n per row
// (stream auxiliary); t = sigmoid(n) (logit-normal) or Phi(n) (uniform).
struct step_noise {
  torch::Tensor eps;
  torch::Tensor t;
};

step_noise draw_noise(const pretrain_options& o, int step, const std::vector<std::int64_t>& sample_shape) {
  std::int64_t per_row = 1;
  for (const std::int64_t size : sample_shape) per_row *= size;
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
  std::vector<std::int64_t> shape{o.batch};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::from_blob(eps.data(), shape, f64).to(torch::kFloat32),
          torch::from_blob(t.data(), {o.batch}, f64).to(torch::kFloat32)};
}

// A data batch: clean samples x0 [batch, sample...] and their prompt rows.
struct data_batch {
  torch::Tensor x0;
  std::vector<std::int64_t> prompts;
};

// Rectified-flow training of `parameters` (x_t = (1 - t) x0 + t eps, target eps - x0, MSE), AdamW with warmup and
// cosine decay, gradient clipping at 1 and EMA: one loop for the image and the video model. `batch_of(step)` gives
// the data, `velocity(x_t, prompt rows, t)` the model's prediction. Returns the last logging window's mean loss.
template <class BatchOf, class Velocity>
double train_flow_matching(const pretrain_options& o, std::vector<torch::Tensor>& parameters, ema_weights& ema,
                           const std::vector<std::int64_t>& sample_shape, BatchOf&& batch_of, Velocity&& velocity,
                           clock_type::time_point start) {
  auto optimizer = make_adamw(parameters, {.lr = o.lr, .weight_decay = 1e-4});
  std::vector<std::int64_t> per_row(sample_shape.size() + 1, 1);  // t broadcast over each sample
  per_row[0] = o.batch;
  double window_loss = 0, last_loss = 0;
  int window = 0;
  for (int step = 0; step < o.steps; ++step) {
    check_stop("pretraining");  // per step, before its update (core/stop.hpp): nothing half-done is written
    const data_batch batch = batch_of(step);
    const step_noise noise = draw_noise(o, step, sample_shape);
    const torch::Tensor t = noise.t.view(per_row);
    const torch::Tensor x_t = (1 - t) * batch.x0 + t * noise.eps;
    const torch::Tensor target = noise.eps - batch.x0;
    const torch::Tensor v = velocity(x_t, torch::tensor(batch.prompts, torch::kInt64), noise.t);
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
  return last_loss;
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

// ---- The video model (--video) -----------------------------------------------------------------------------------

// Parameters of a Wan transformer from its config: per block self- and cross-attention (4 dim^2 each, plus
// biases), the FFN, the q/k norms and the 6-way modulation; the embeddings and the head.
double wan_parameter_estimate(const wan_config& c) {
  const auto d = static_cast<double>(c.dim), f = static_cast<double>(c.ffn_dim);
  const double block = 8 * d * d + 2 * d * f + 16 * d;
  const double patch = static_cast<double>(c.patch_volume());
  const double rest = d * (static_cast<double>(c.in_dim) * patch + static_cast<double>(c.text_dim) +
                           static_cast<double>(c.freq_dim) + 9 * d) +
                      d * static_cast<double>(c.out_dim) * patch;
  return static_cast<double>(c.layers) * block + rest;
}

// Bytes one clip costs a training step (as bytes_per_image): per block about 14 dim-wide and 2 FFN-wide values
// per video token plus the self- and cross-attention scores and probabilities, and the clip's keyed noise.
double bytes_per_clip(const wan_config& c) {
  const double tokens = static_cast<double>(moving_shapes_frames / c.patch[0] * (shapes_image_size / c.patch[1]) *
                                            (shapes_image_size / c.patch[2]));
  const double text = static_cast<double>(c.text_len);
  const double per_block = tokens * static_cast<double>(14 * c.dim + 2 * c.ffn_dim) +
                           2 * static_cast<double>(c.heads) * tokens * (tokens + text);
  const double noise = 3.0 * moving_shapes_frames * shapes_image_size * shapes_image_size * (8 + 4 + 4);
  return 4 * per_block * static_cast<double>(c.layers) + noise;
}

// Clips [n, F, 3, H, W] as a grid with one clip per row, its frames left to right.
rgb_image clip_grid(const torch::Tensor& frames, int scale) {
  return image_grid(frames.reshape({-1, 3, frames.size(3), frames.size(4)}), static_cast<int>(frames.size(1)), scale);
}

// ---- What both families share ------------------------------------------------------------------------------------

// What a pretraining run gives the files it writes.
struct pretrained {
  double last_loss = 0;  // the last logging window's mean loss
  double seconds = 0;
  std::int64_t parameters = 0;
};

// Trains every parameter of `model` by flow matching (train_flow_matching) with an EMA of decay --ema, then puts
// the EMA weights into the model (what is saved and sampled) and switches it to evaluation.
template <class Model, class BatchOf, class Velocity>
pretrained pretrain_model(const pretrain_options& o, Model& model, const std::vector<std::int64_t>& sample_shape,
                          BatchOf&& batch_of, Velocity&& velocity) {
  std::vector<torch::Tensor> parameters = model.parameters();
  pretrained out;
  for (const torch::Tensor& p : parameters) out.parameters += p.numel();
  ema_weights ema;
  ema.decay = o.ema;
  ema.reset(parameters);
  const auto start = clock_type::now();
  out.last_loss = train_flow_matching(o, parameters, ema, sample_shape, std::forward<BatchOf>(batch_of),
                                      std::forward<Velocity>(velocity), start);
  out.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (o.ema > 0) ema.swap(parameters);
  model.eval();
  return out;
}

// The "branchgrpo.pretrain" metadata: what made the model. `data` names the data set.
std::string pretrain_text(const pretrain_options& o, std::string_view data, const pretrained& run) {
  std::ostringstream out;
  out << "data=" << data << ";steps=" << o.steps << ";batch=" << o.batch << ";lr=" << o.lr << ";warmup=" << o.warmup
      << ";schedule=cosine to 0.1;ema=" << o.ema << ";t_sampling=" << o.t_sampling << ";seed=" << o.seed
      << ";weight_decay=0.0001;clip=1;final_loss=" << run.last_loss << ";seconds=" << fixed(run.seconds, 1);
  return out.str();
}

// The sample grids' prompts: each of `prompts` --grid-samples times, in order.
std::vector<std::int64_t> grid_prompts(const pretrain_options& o, std::int64_t prompts) {
  std::vector<std::int64_t> out;
  for (std::int64_t p = 0; p < prompts; ++p)
    for (int s = 0; s < o.grid_samples; ++s) out.push_back(p);
  return out;
}

// pretrain.json's fields that do not depend on the family, with the grid's reward per prompt.
nlohmann::json pretrain_summary(const pretrain_options& o, const std::filesystem::path& dir, const pretrained& run,
                                const std::vector<double>& sample_alignment, const std::vector<std::int64_t>& grid,
                                std::int64_t prompts) {
  std::vector<double> per_prompt(static_cast<std::size_t>(prompts), 0.0);
  for (std::size_t i = 0; i < grid.size(); ++i)
    per_prompt[static_cast<std::size_t>(grid[i])] += sample_alignment[i] / o.grid_samples;
  return {{"out", dir.string()},
          {"steps", o.steps},
          {"batch", o.batch},
          {"seed", o.seed},
          {"parameters", run.parameters},
          {"model_bytes", std::filesystem::file_size(dir / "model.safetensors")},
          {"final_loss", run.last_loss},
          {"seconds", run.seconds},
          {"alignment", mean(sample_alignment)},
          {"alignment_per_prompt", per_prompt}};
}

void write_summary(const std::filesystem::path& dir, const nlohmann::json& summary) {
  write_file(dir / "pretrain.json", summary.dump(2) + '\n');
  std::cout << summary.dump() << '\n';
}

// ---- The two families ---------------------------------------------------------------------------------------------

void run_pretrain_video(const pretrain_options& o, const std::filesystem::path& dir, const wan_config& config) {
  const std::vector<std::string> prompts = moving_shapes_prompts();
  // The word vectors of each prompt are the text the transformer attends to (pooled: unused by Wan).
  const prompt_embeddings embeddings = shapes_word_embeddings(prompts, config.text_dim, config.text_dim);
  require(embeddings.context.size(1) <= config.text_len, "the prompts have ", embeddings.context.size(1),
          " words, the config's text_len is ", config.text_len);

  torch::manual_seed(o.seed);  // the initial weights
  auto model = std::make_shared<wan_transformer>(config);
  {
    // The head's output starts at zero, as the image model's final layer: the first velocity is 0.
    torch::NoGradGuard no_grad;
    model->head->head->weight.zero_();
    model->head->head->bias.zero_();
  }
  const pretrained run = pretrain_model(
      o, *model, {3, moving_shapes_frames, shapes_image_size, shapes_image_size},
      [&](int step) {
        moving_shapes_batch batch =
            make_moving_shapes_batch(o.seed, static_cast<std::uint64_t>(step) * o.batch, o.batch);
        return data_batch{.x0 = std::move(batch.clips), .prompts = std::move(batch.prompts)};
      },
      [&](const torch::Tensor& x_t, const torch::Tensor& rows, const torch::Tensor& t) {
        return model->forward(x_t, 1000.0 * t, embeddings.context.index_select(0, rows));
      });

  save_safetensors(dir / "model.safetensors", wan_state(*model),
                   {{"format", "pt"},
                    {std::string(wan_config_metadata_key), format_wan_config(config)},
                    {"branchgrpo.latent", "pixels: RGB in [-1, 1], 3 x 8 x 16 x 16 [C, F, H, W]; decode (x + 1) / 2"},
                    {"branchgrpo.pretrain", pretrain_text(o, "moving shapes 3x8x16x16 (moving_shapes.hpp)", run)}});
  save_prompt_file(dir / "prompts.safetensors", embeddings, prompts);

  // Samples (ODE, 20 steps, Wan's shift 5) and data clips, --grid-samples per prompt, scored with the rewards.
  const std::vector<std::int64_t> grid = grid_prompts(o, moving_shapes_prompt_count);
  const torch::Tensor samples = clip_frames(video_sample_ode(model, embeddings.context, grid, o.seed));
  std::vector<torch::Tensor> data_clips;
  for (std::size_t i = 0; i < grid.size(); ++i)
    data_clips.push_back(moving_shapes_render(moving_shapes_draw(o.seed ^ 0xDA7Aull, i, grid[i])));
  const torch::Tensor data = clip_frames(torch::stack(data_clips));
  // One clip per prompt in the PNG strips (48 rows of 8 frames).
  const torch::Tensor first = torch::arange(0, static_cast<std::int64_t>(grid.size()), o.grid_samples);
  write_png((dir / "samples.png").string(), clip_grid(samples.index_select(0, first), o.grid_scale));
  write_png((dir / "data.png").string(), clip_grid(data.index_select(0, first), o.grid_scale));

  const moving_shape_alignment alignment;
  const temporal_smoothness smoothness;
  nlohmann::json summary = pretrain_summary(o, dir, run, alignment(samples, grid), grid, moving_shapes_prompt_count);
  summary["video"] = true;
  summary["wan_config"] = format_wan_config(config);
  summary["data_alignment"] = mean(alignment(data, grid));
  summary["smoothness"] = mean(smoothness(samples, grid));
  summary["data_smoothness"] = mean(smoothness(data, grid));
  write_summary(dir, summary);
}

void run_pretrain_image(const pretrain_options& o, const std::filesystem::path& dir, const flux_config& config) {
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
  const pretrained run = pretrain_model(
      o, *model, {3, shapes_image_size, shapes_image_size},
      [&](int step) {
        shapes_batch batch = make_shapes_batch(o.seed, static_cast<std::uint64_t>(step) * o.batch, o.batch);
        return data_batch{.x0 = std::move(batch.images), .prompts = std::move(batch.prompts)};
      },
      [&](const torch::Tensor& x_t, const torch::Tensor& rows, const torch::Tensor& t) {
        return model->forward_latents(x_t, embeddings.context.index_select(0, rows),
                                      embeddings.pooled.index_select(0, rows), t);
      });

  save_safetensors(dir / "model.safetensors", flux_state(*model),
                   {{"format", "pt"},
                    {std::string(flux_config_metadata_key), format_flux_config(config)},
                    {"branchgrpo.latent", "pixels: RGB in [-1, 1], 3 x 16 x 16; decode (x + 1) / 2 clamped"},
                    {"branchgrpo.pretrain", pretrain_text(o, "shapes 3x16x16 (shapes.hpp)", run)}});
  save_prompt_file(dir / "prompts.safetensors", embeddings, prompts);

  // Samples (ODE, 20 steps, shift 3) and data set images, one row per prompt, scored with the rewards.
  const std::vector<std::int64_t> grid = grid_prompts(o, shapes_prompt_count);
  const torch::Tensor samples = shapes_sample_ode(*model, embeddings, grid, o.seed);
  std::vector<torch::Tensor> data_images;
  for (std::size_t i = 0; i < grid.size(); ++i)
    data_images.push_back(shapes_render(shapes_draw(o.seed ^ 0xDA7Aull, i, grid[i])));
  const torch::Tensor data = torch::stack(data_images);
  write_png((dir / "samples.png").string(), image_grid(samples, o.grid_samples, o.grid_scale));
  write_png((dir / "data.png").string(), image_grid(data, o.grid_samples, o.grid_scale));

  const shape_alignment alignment;
  nlohmann::json summary = pretrain_summary(o, dir, run, alignment(samples, grid), grid, shapes_prompt_count);
  summary["flux_config"] = format_flux_config(config);
  summary["data_alignment"] = mean(alignment(data, grid));
  summary["jpeg_kb"] = -mean(jpeg_compressibility{}(samples, grid));
  summary["data_jpeg_kb"] = -mean(jpeg_compressibility{}(data, grid));
  write_summary(dir, summary);
}

void run_pretrain(const pretrain_options& o) {
  validate(o);
  // Everything is checked before the output directory is made.
  std::optional<flux_config> image;
  std::optional<wan_config> video;
  if (o.video) {
    video = config_from_json(o.config_json, moving_shapes_wan_config(), wan_json_fields, " for --video");
    check_memory(o, wan_parameter_estimate(*video), bytes_per_clip(*video), moving_shapes_prompt_count);
  } else {
    image = config_from_json(o.config_json, shapes_flux_config(), flux_json_fields, "");
    check_memory(o, parameter_estimate(*image), bytes_per_image(*image), shapes_prompt_count);
  }
  if (o.threads > 0) torch::set_num_threads(o.threads);
  const std::filesystem::path dir = make_directory(o.out);  // before the run: one line when it cannot be written
  if (video)
    run_pretrain_video(o, dir, *video);
  else
    run_pretrain_image(o, dir, *image);
}

}  // namespace

void add_pretrain_command(CLI::App& app) {
  auto options = std::make_shared<pretrain_options>();
  CLI::App* pretrain = app.add_subcommand(
      "pretrain", "Train a tiny FLUX transformer by flow matching on the procedural shapes data set");
  pretrain->add_option("--out", options->out, "Directory for model.safetensors, prompts.safetensors and the PNGs")
      ->required()
      ->type_name("DIR");
  // --steps and --warmup: a step is a noise key's iteration field (max_noise_iteration); --batch and
  // --grid-samples are checked against the memory they imply (check_memory), --threads against the machine.
  add_integer(pretrain, "--steps", options->steps, "Optimizer steps", 1, static_cast<int>(max_noise_iteration))
      ->type_name("N")
      ->capture_default_str();
  add_integer(pretrain, "--seed", options->seed, "Seed of the weights, the data and the noise")
      ->type_name("S")
      ->capture_default_str();
  add_integer(pretrain, "--batch", options->batch, "Images per step", std::int64_t{1},
              std::numeric_limits<std::int64_t>::max())
      ->type_name("B")
      ->capture_default_str();
  add_number(pretrain, "--lr", options->lr, "Peak AdamW learning rate", 1e-12, 1)
      ->type_name("LR")
      ->capture_default_str();
  add_integer(pretrain, "--warmup", options->warmup, "Linear warmup steps (then cosine decay to 10%)", 0,
              static_cast<int>(max_noise_iteration))
      ->type_name("N")
      ->capture_default_str();
  add_number(pretrain, "--ema", options->ema, "EMA decay of the saved weights (0: none)", 0, 0.999999)
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
  add_integer(pretrain, "--grid-samples", options->grid_samples, "Samples per prompt in samples.png", 1, 4096)
      ->type_name("N")
      ->capture_default_str();
  add_integer(pretrain, "--grid-scale", options->grid_scale, "Screen pixels per image pixel in the PNG grids", 1, 16)
      ->type_name("N")
      ->capture_default_str();
  add_integer(pretrain, "--log-every", options->log_every, "Steps between progress lines", 1,
              std::numeric_limits<int>::max())
      ->type_name("N")
      ->capture_default_str();
  add_integer(pretrain, "--threads", options->threads, "LibTorch intra-op threads (0: LibTorch's default)", 0,
              max_threads())
      ->type_name("N")
      ->capture_default_str();
  pretrain->add_flag("--quiet", options->quiet, "No progress lines");
  pretrain->add_flag("--video", options->video,
                     "Train a tiny Wan2.1-architecture transformer on the moving-shapes clips (8 x 16 x 16) instead");
  pretrain->callback([options] {
    const stop_signals stop;  // SIGINT / SIGTERM: one line and exit 128 + signal at the next step
    run_pretrain(*options);
  });
}

}  // namespace branchgrpo::cli
