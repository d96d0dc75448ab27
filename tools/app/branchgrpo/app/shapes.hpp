#pragma once
// The procedural "shapes" data set of the shipped demo model (models/shapes-tiny; docs/model.md): one coloured
// shape on a plain light-grey background per image, 3 x 16 x 16, RGB in [-1, 1] (pixel space: the image IS the
// latent, no autoencoder).
//
//   prompts     12 = 4 colours x 3 shapes, prompt p = 3 * colour + shape:
//               "a red circle", "a red square", "a red triangle", "a green circle", ..., "a yellow triangle"
//   draw        shapes_draw(seed, index): size, position and colour jitter of sample `index` from Philox4x32-10
//   render      shapes_render(sample): [3, 16, 16], each pixel the shape's 4 x 4-supersampled coverage
//   batch       make_shapes_batch(seed, first, count): samples first, ..., first + count - 1 with their prompts
//   embeddings  shapes_word_embeddings(prompts, context_in, vec_in): fixed keyed-normal vectors per word
//   model       load_shapes_model(dir) / make_shapes_transformer(model): a pretrained model directory
//   sampling    shapes_sample_ode(model, embeddings, prompts, seed): Euler ODE, 20 steps, SD3 shift 3
//
// Sample randomness (documented so any implementation reproduces the data set): the 8 uniforms of sample i are
//   u[4 b + k] = (r_k + 0.5) / 2^32,  r = philox4x32_10({i & 0xffffffff, i >> 32, b, 0x53485031}, {seed lo, hi}),
// b = 0, 1, k = 0..3 (noise/keyed_normal.hpp's Philox). u0 size, u1 centre x, u2 centre y, u3 background,
// u4..u6 colour jitter (r, g, b), u7 the prompt when the batch draws it (floor(12 u7)).
#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/core/numbers.hpp"
#include "branchgrpo/model_specs/flux/config.hpp"
#include "branchgrpo/model_specs/registry.hpp"
#include "branchgrpo/noise/keyed_normal.hpp"
#include "branchgrpo/rollout/ode_sampler.hpp"
#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/compat.hpp"
#include "branchgrpo/torch/flux/denoiser.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/flux/transformer.hpp"
#include "branchgrpo/torch/safetensors.hpp"

namespace branchgrpo {

// ---- The data set ---------------------------------------------------------------------------------------------

/// Side of every shapes image, in pixels.
inline constexpr std::int64_t shapes_image_size = 16;

inline constexpr std::array<std::string_view, 4> shapes_colour_names = {"red", "green", "blue", "yellow"};
inline constexpr std::array<std::string_view, 3> shapes_shape_names = {"circle", "square", "triangle"};

/// The colours' RGB in [0, 1] (before the per-sample jitter of +-0.06 per channel).
inline constexpr std::array<std::array<double, 3>, 4> shapes_palette = {{
    {0.90, 0.10, 0.10},  // red
    {0.10, 0.75, 0.15},  // green
    {0.15, 0.25, 0.95},  // blue
    {0.95, 0.85, 0.10},  // yellow
}};

/// The background grey level (all three channels), before its jitter of +-0.03.
inline constexpr double shapes_background = 0.92;

/// Number of prompts: colours x shapes.
inline constexpr std::int64_t shapes_prompt_count =
    static_cast<std::int64_t>(shapes_colour_names.size() * shapes_shape_names.size());

/// The 12 prompts in index order: prompt 3 c + s is "a <colour c> <shape s>".
/// Example: shapes_prompts()[0] == "a red circle", [4] == "a green square", [11] == "a yellow triangle".
inline std::vector<std::string> shapes_prompts() {
  std::vector<std::string> out;
  for (const std::string_view colour : shapes_colour_names)
    for (const std::string_view shape : shapes_shape_names)
      out.push_back("a " + std::string(colour) + " " + std::string(shape));
  return out;
}

/// What a prompt asks for: indices into shapes_colour_names and shapes_shape_names.
struct shapes_target {
  int colour = 0;
  int shape = 0;

  friend bool operator==(const shapes_target&, const shapes_target&) = default;
};

/// The colour and the shape a prompt names: its first word that is a colour name and its first word that is a
/// shape name (ASCII case-insensitive, words split at whitespace).
/// Example: "A Blue triangle" -> {.colour = 2, .shape = 2}; "a red dog" throws "prompt 'a red dog' names no shape
///   (circle, square, triangle)".
/// @pre the prompt holds one colour word and one shape word (else invalid_input naming the prompt, echoed with
///   echo_middle: at most 80 characters, control characters escaped, so "a red\0circle" reads 'a red\x00circle').
inline shapes_target parse_shapes_prompt(std::string_view prompt) {
  std::optional<int> colour, shape;
  std::size_t at = 0;
  while (at < prompt.size()) {
    while (at < prompt.size() && std::isspace(static_cast<unsigned char>(prompt[at]))) ++at;
    std::size_t end = at;
    while (end < prompt.size() && !std::isspace(static_cast<unsigned char>(prompt[end]))) ++end;
    std::string word(prompt.substr(at, end - at));
    for (char& ch : word) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (std::size_t c = 0; c < shapes_colour_names.size() && !colour; ++c)
      if (word == shapes_colour_names[c]) colour = static_cast<int>(c);
    for (std::size_t s = 0; s < shapes_shape_names.size() && !shape; ++s)
      if (word == shapes_shape_names[s]) shape = static_cast<int>(s);
    at = end;
  }
  require(colour.has_value(), "prompt '", echo_middle(prompt, 80), "' names no colour (red, green, blue, yellow)");
  require(shape.has_value(), "prompt '", echo_middle(prompt, 80), "' names no shape (circle, square, triangle)");
  return {.colour = *colour, .shape = *shape};
}

/// Everything that defines one image of the data set (pixel coordinates: x to the right, y down, pixel (row i,
/// column j) covers [j, j + 1) x [i, i + 1)).
struct shapes_sample {
  std::int64_t prompt = 0;
  double radius = 4;      ///< size R in [3, 5]: circle radius R, square half-side 0.85 R, triangle half-extent 1.2 R
  double cx = 8, cy = 8;  ///< centre
  std::array<double, 3> colour = shapes_palette[0];
  double background = shapes_background;

  friend bool operator==(const shapes_sample&, const shapes_sample&) = default;
};

namespace detail {

inline constexpr std::uint32_t shapes_philox_tag = 0x53485031u;  // "SHP1"

// `tag` separates data sets drawn from the same seed (the moving-shapes clips use their own).
inline std::array<double, 8> shapes_uniforms(std::uint64_t seed, std::uint64_t index,
                                             std::uint32_t tag = shapes_philox_tag) {
  std::array<double, 8> u{};
  for (std::uint32_t block = 0; block < 2; ++block) {
    const auto bits =
        philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), block, tag},
                      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    for (std::size_t k = 0; k < 4; ++k) u[4 * block + k] = (static_cast<double>(bits[k]) + 0.5) * 0x1p-32;
  }
  return u;
}

/// Half the width (and height) of a shape of size `radius`.
inline double shapes_half_extent(int shape, double radius) {
  return shape == 0 ? radius : shape == 1 ? 0.85 * radius : 1.2 * radius;
}

/// Whether point (x, y) lies inside the shape of `sample`.
inline bool shapes_inside(const shapes_sample& s, int shape, double x, double y) {
  const double e = shapes_half_extent(shape, s.radius);
  const double dx = x - s.cx, dy = y - s.cy;
  if (shape == 0) return dx * dx + dy * dy <= e * e;
  if (shape == 1) return std::abs(dx) <= e && std::abs(dy) <= e;
  // Upward triangle: apex (cx, cy - e), base from (cx - e, cy + e) to (cx + e, cy + e); half-width (dy + e) / 2.
  return dy <= e && std::abs(dx) <= (dy + e) / 2;
}

/// The background and colour jitter every drawn shape (image or clip) gets from its uniforms u3..u6:
/// background = 0.92 + 0.06 (u3 - 0.5), colour_k = clamp(palette_colour_k + 0.12 (u_{4+k} - 0.5), 0, 1).
/// Example: u3 = u4 = u5 = u6 = 0.5, colour 1 -> background 0.92, colour (0.10, 0.75, 0.15) exactly.
inline void shapes_jitter(shapes_sample& s, int colour, const std::array<double, 8>& u) {
  s.background = shapes_background + 0.06 * (u[3] - 0.5);
  for (std::size_t k = 0; k < 3; ++k)
    s.colour[k] = std::clamp(shapes_palette[static_cast<std::size_t>(colour)][k] + 0.12 * (u[4 + k] - 0.5), 0.0, 1.0);
}

/// The prompt of a drawn sample: `given`, else floor(count u7) (at most count - 1); refused outside [0, count)
/// with one line naming `what` ("shapes", "moving-shapes").
inline std::int64_t drawn_prompt(std::optional<std::int64_t> given, double u7, std::int64_t count,
                                 std::string_view what) {
  const std::int64_t prompt =
      given ? *given : std::min<std::int64_t>(static_cast<std::int64_t>(u7 * static_cast<double>(count)), count - 1);
  require(prompt >= 0 && prompt < count, what, " prompt ", prompt, " is outside [0, ", count, ")");
  return prompt;
}

/// Samples first, ..., first + count - 1 drawn with `seed` and rendered, stacked [count, item...], with their
/// prompts: the batch of the image and of the clip data set alike. `empty` is the shape of a batch of none.
template <class Draw, class Render>
std::pair<torch::Tensor, std::vector<std::int64_t>> draw_batch(std::uint64_t seed, std::uint64_t first,
                                                               std::int64_t count, std::string_view what, Draw&& draw,
                                                               Render&& render, std::vector<std::int64_t> empty) {
  require(count >= 0, what, " batch size must be non-negative, got ", count);
  std::vector<std::int64_t> prompts;
  std::vector<torch::Tensor> items;
  for (std::int64_t r = 0; r < count; ++r) {
    const auto sample = draw(seed, first + static_cast<std::uint64_t>(r));
    prompts.push_back(sample.prompt);
    items.push_back(render(sample));
  }
  return {count == 0 ? torch::empty(empty) : torch::stack(items), std::move(prompts)};
}

}  // namespace detail

/// Sample `index` of the data set drawn with `seed` (see the file comment for the uniforms u0..u7):
///   prompt = floor(12 u7) unless given; R = 3 + 2 u0; e = half extent (R, 0.85 R, 1.2 R for circle, square,
///   triangle); cx = 1 + e + (14 - 2 e) u1, cy = 1 + e + (14 - 2 e) u2 (the shape stays one pixel off the
///   border); background = 0.92 + 0.06 (u3 - 0.5); colour_k = clamp(palette_k + 0.12 (u_{4+k} - 0.5), 0, 1).
/// Example: any seed, index 5, prompt 4 -> prompt 4 (a green square), R in [3, 5], e = 0.85 R, cx and cy in
///   [1 + e, 15 - e], colour within 0.06 of (0.10, 0.75, 0.15) per channel.
/// @pre prompt, when given, in [0, 12) (else invalid_input).
/// @post a pure function of (seed, index, prompt).
inline shapes_sample shapes_draw(std::uint64_t seed, std::uint64_t index, std::optional<std::int64_t> prompt = {}) {
  const std::array<double, 8> u = detail::shapes_uniforms(seed, index);
  shapes_sample s;
  s.prompt = detail::drawn_prompt(prompt, u[7], shapes_prompt_count, "shapes");
  const int colour = static_cast<int>(s.prompt / 3), shape = static_cast<int>(s.prompt % 3);
  s.radius = 3.0 + 2.0 * u[0];
  const double e = detail::shapes_half_extent(shape, s.radius);
  const auto side = static_cast<double>(shapes_image_size);
  s.cx = 1.0 + e + (side - 2.0 - 2.0 * e) * u[1];
  s.cy = 1.0 + e + (side - 2.0 - 2.0 * e) * u[2];
  detail::shapes_jitter(s, colour, u);
  return s;
}

/// The image of `sample`, [3, 16, 16] float32 in [-1, 1]: per pixel the fraction c of its 4 x 4 sub-pixel
/// centres (offsets 0.125, 0.375, 0.625, 0.875) inside the shape, value = 2 (c colour + (1 - c) background) - 1.
/// Example: a red circle of radius 4 at (8, 8): pixel (8, 8) -> (0.8, -0.8, -0.8) without jitter; a corner pixel
///   -> the background 2 * 0.92 - 1 = 0.84 in every channel.
/// @pre sample.prompt in [0, 12).
inline torch::Tensor shapes_render(const shapes_sample& sample) {
  require(sample.prompt >= 0 && sample.prompt < shapes_prompt_count, "shapes prompt ", sample.prompt,
          " is outside [0, ", shapes_prompt_count, ")");
  const int shape = static_cast<int>(sample.prompt % 3);
  constexpr std::int64_t n = shapes_image_size;
  torch::Tensor image = torch::empty({3, n, n}, torch::kFloat32);
  float* out = image.data_ptr<float>();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      int inside = 0;
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b)
          inside += detail::shapes_inside(sample, shape, static_cast<double>(j) + 0.125 + 0.25 * b,
                                          static_cast<double>(i) + 0.125 + 0.25 * a);
      const double c = inside / 16.0;
      for (std::int64_t k = 0; k < 3; ++k)
        out[(k * n + i) * n + j] = static_cast<float>(
            2.0 * (c * sample.colour[static_cast<std::size_t>(k)] + (1.0 - c) * sample.background) - 1.0);
    }
  return image;
}

/// Images [count, 3, 16, 16] and prompts of a batch of the data set.
struct shapes_batch {
  torch::Tensor images;
  std::vector<std::int64_t> prompts;
};

/// Samples first, first + 1, ..., first + count - 1 of the data set drawn with `seed` (random prompts).
/// Example: make_shapes_batch(0, 10, 2).images[1] equals shapes_render(shapes_draw(0, 11)).
/// @pre count >= 0.
inline shapes_batch make_shapes_batch(std::uint64_t seed, std::uint64_t first, std::int64_t count) {
  auto [images, prompts] = detail::draw_batch(
      seed, first, count, "shapes", [](std::uint64_t s, std::uint64_t i) { return shapes_draw(s, i); },
      [](const shapes_sample& sample) { return shapes_render(sample); }, {0, 3, shapes_image_size, shapes_image_size});
  return {.images = std::move(images), .prompts = std::move(prompts)};
}

// ---- Prompt embeddings from words -----------------------------------------------------------------------------

/// Seed of the word vectors (ASCII "SHAPES").
inline constexpr std::uint64_t shapes_embedding_seed = 0x534841504553ull;

/// FNV-1a, 32 bits, of a word: the word's key into the keyed noise.
/// Example: fnv1a32("") == 0x811c9dc5, fnv1a32("a") == 0xe40c292c.
constexpr std::uint32_t fnv1a32(std::string_view word) {
  std::uint32_t hash = 0x811c9dc5u;
  for (const char ch : word) hash = (hash ^ static_cast<unsigned char>(ch)) * 0x01000193u;
  return hash;
}

/// The words of a prompt: split at ASCII whitespace, lower-cased.
inline std::vector<std::string> prompt_words(std::string_view prompt) {
  std::vector<std::string> words;
  std::string word;
  std::string text(prompt);
  text.push_back(' ');  // ends the last word
  for (const char ch : text) {
    if (std::isspace(static_cast<unsigned char>(ch))) {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
    }
  }
  return words;
}

/// Fixed random vector of a word: element j of table t (0 = context, 1 = pooled) is
///   keyed_normal(noise_key{.seed = shapes_embedding_seed, .tree = fnv1a32(word), .node = t,
///                          .stream = noise_stream::auxiliary}, j).
inline std::vector<double> shapes_word_vector(std::string_view word, std::uint32_t table, std::int64_t dim) {
  std::vector<double> v(static_cast<std::size_t>(dim));
  fill_keyed_normal(
      {.seed = shapes_embedding_seed, .tree = fnv1a32(word), .node = table, .stream = noise_stream::auxiliary}, v);
  return v;
}

/// Deterministic text conditioning built from words, the stand-in for T5 / CLIP of the shapes model:
///   context[n, i] = word vector (table 0) of word i of prompt n for i < its word count, zeros after;
///   pooled[n]     = sum over its words of the word vector (table 1) / sqrt(word count)  (zeros for no word).
/// L = `length`, or the longest prompt's word count when 0 (at least 1). float32 on the CPU.
/// Example: {"a red circle"}, context_in 32, vec_in 32 -> context [1, 3, 32], pooled [1, 32]; context[0, 1] is
///   the vector of "red", the same in every prompt holding "red".
/// @pre prompts not empty; context_in, vec_in >= 1; length 0 or at least every prompt's word count.
inline prompt_embeddings shapes_word_embeddings(std::span<const std::string> prompts, std::int64_t context_in,
                                                std::int64_t vec_in, std::int64_t length = 0) {
  require(!prompts.empty(), "word embeddings need at least one prompt");
  require(context_in >= 1 && vec_in >= 1, "word embeddings need positive widths, got context_in ", context_in,
          " and vec_in ", vec_in);
  std::vector<std::vector<std::string>> words;
  std::int64_t longest = 1;
  for (const std::string& prompt : prompts) {
    words.push_back(prompt_words(prompt));
    longest = std::max(longest, static_cast<std::int64_t>(words.back().size()));
  }
  require(length == 0 || length >= longest, "word embedding length ", length, " is below the longest prompt's ",
          longest, " words");
  const std::int64_t l = length == 0 ? longest : length;
  const auto n = static_cast<std::int64_t>(prompts.size());
  torch::Tensor context = torch::zeros({n, l, context_in}, torch::kFloat64);
  torch::Tensor pooled = torch::zeros({n, vec_in}, torch::kFloat64);
  auto c = context.accessor<double, 3>();
  auto p = pooled.accessor<double, 2>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& ws = words[static_cast<std::size_t>(i)];
    for (std::size_t w = 0; w < ws.size(); ++w) {
      const std::vector<double> token = shapes_word_vector(ws[w], 0, context_in);
      const std::vector<double> summary = shapes_word_vector(ws[w], 1, vec_in);
      for (std::int64_t j = 0; j < context_in; ++j)
        c[i][static_cast<std::int64_t>(w)][j] = token[static_cast<std::size_t>(j)];
      for (std::int64_t j = 0; j < vec_in; ++j)
        p[i][j] += summary[static_cast<std::size_t>(j)] / std::sqrt(static_cast<double>(ws.size()));
    }
  }
  return {.context = context.to(torch::kFloat32), .pooled = pooled.to(torch::kFloat32)};
}

// ---- flux_config as metadata text -------------------------------------------------------------------------------

/// The safetensors __metadata__ key holding a model's flux_config (its family's, model_specs/flux/spec.hpp).
inline constexpr std::string_view flux_config_metadata_key = flux_spec.metadata_key;

/// The safetensors __metadata__ key holding a video model's wan_config (moving_shapes.hpp's format).
inline constexpr std::string_view wan_config_metadata_key = wan_spec.metadata_key;

/// Throws invalid_input naming `source` and the keys when `metadata` holds the config keys of more than one family
/// of model_spec_table: such a file declares two families, and which one a reader took would depend on the order it
/// looked in.
/// Example: {"branchgrpo.flux_config": ..., "branchgrpo.wan_config": ...}, "m/model.safetensors" -> throws
///   "m/model.safetensors: __metadata__ holds both 'branchgrpo.flux_config' and 'branchgrpo.wan_config'; a model
///   file declares one family".
/// @post at most one family's key is in `metadata`.
inline void require_one_model_family(const std::map<std::string, std::string>& metadata, std::string_view source) {
  std::vector<std::string> held;
  for (const model_spec& spec : model_spec_table)
    if (metadata.contains(std::string(spec.metadata_key))) held.push_back("'" + std::string(spec.metadata_key) + "'");
  require(held.size() <= 1, source, ": __metadata__ holds ", held.size() == 2 ? "both " : "", name_list(held, " and "),
          "; a model file declares one family");
}

namespace detail {
inline std::string shortest_text(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

/// The fields of a model config's metadata text "key=value;key=value" (format_flux_config, format_wan_config), each
/// key once; `name` ("flux_config", "wan_config") and `source` prefix every error. Values go through the library's
/// one parsing path (core/numbers.hpp): "m: flux_config hidden = x: must be an integer in [0, 65536]".
struct config_fields {
  std::string source, name;
  std::map<std::string, std::string> fields;

  config_fields(std::string_view text, std::string_view source_, std::string_view name_)
      : source(source_), name(name_) {
    std::size_t at = 0;
    while (at <= text.size()) {
      const std::size_t end = std::min(text.find(';', at), text.size());
      const std::string_view item = text.substr(at, end - at);
      const std::size_t eq = item.find('=');
      require(eq != std::string_view::npos, source, ": ", name, " entry '", item, "' is not key=value");
      const std::string key(item.substr(0, eq));
      require(!fields.contains(key), source, ": ", name, " key '", key, "' appears twice");
      fields[key] = std::string(item.substr(eq + 1));
      at = end + 1;
    }
  }
  /// "<source>: <name> <key>", what a value's error names.
  [[nodiscard]] std::string where(const std::string& key) const { return source + ": " + name + " " + key; }
  /// Removes and returns a key's text (every key must appear).
  std::string take(const std::string& key) {
    const auto it = fields.find(key);
    require(it != fields.end(), source, ": ", name, " has no '", key, "'");
    std::string v = std::move(it->second);
    fields.erase(it);
    return v;
  }
  double number(const std::string& key) { return parse_number(take(key), where(key)); }
  std::int64_t integer(const std::string& key, std::int64_t low, std::int64_t high) {
    return parse_integer<std::int64_t>(take(key), where(key), low, high);
  }
  /// Three comma-separated integers in [low, high] ("rope_axes=8,12,12").
  std::array<std::int64_t, 3> triple(const std::string& key, std::int64_t low, std::int64_t high) {
    const std::string text = take(key);
    std::array<std::int64_t, 3> out{};
    std::size_t from = 0;
    for (std::size_t a = 0; a < 3; ++a) {
      const std::size_t comma = a < 2 ? text.find(',', from) : text.size();
      require(comma != std::string::npos, where(key), " = ", echo_text(text), ": must be three integers");
      out[a] = parse_integer<std::int64_t>(std::string_view(text).substr(from, comma - from),
                                           where(key + "[" + std::to_string(a) + "]"), low, high);
      from = comma + 1;
    }
    return out;
  }
  /// After every take: no key is left over.
  void finish() const {
    require(fields.empty(), source, ": unknown ", name, " key '", fields.empty() ? "" : fields.begin()->first, "'");
  }
};
}  // namespace detail

/// A flux_config as "key=value;..." in field order (booleans 0 / 1, doubles in shortest round-trip form).
/// Example: the shapes config -> "in_channels=12;hidden=64;heads=2;depth_double=2;depth_single=2;
///   rope_axes=8,12,12;rope_theta=10000;vec_in=32;context_in=32;mlp_ratio=4;qkv_bias=1;guidance_embed=0".
inline std::string format_flux_config(const flux_config& c) {
  std::ostringstream out;
  out << "in_channels=" << c.in_channels << ";hidden=" << c.hidden << ";heads=" << c.heads
      << ";depth_double=" << c.depth_double << ";depth_single=" << c.depth_single << ";rope_axes=" << c.rope_axes[0]
      << ',' << c.rope_axes[1] << ',' << c.rope_axes[2] << ";rope_theta=" << detail::shortest_text(c.rope_theta)
      << ";vec_in=" << c.vec_in << ";context_in=" << c.context_in << ";mlp_ratio=" << detail::shortest_text(c.mlp_ratio)
      << ";qkv_bias=" << (c.qkv_bias ? 1 : 0) << ";guidance_embed=" << (c.guidance_embed ? 1 : 0);
  return out.str();
}

/// Inverse of format_flux_config. Every one of the 12 keys must appear exactly once; `source` prefixes errors.
/// Example: parse_flux_config(format_flux_config(c), "m") == c; "hidden=x;..." throws
///   "m: flux_config hidden = x: must be an integer in [0, 65536]"; "depth_double=100000000;..." throws
///   "m: flux_config depth_double = 100000000: must be an integer in [0, 1024]" (nothing is built or enumerated).
/// @post the result passes validate().
inline flux_config parse_flux_config(std::string_view text, std::string_view source) {
  detail::config_fields f(text, source, "flux_config");
  flux_config c;
  c.in_channels = f.integer("in_channels", 0, flux_max_width);
  c.hidden = f.integer("hidden", 0, flux_max_width);
  c.heads = f.integer("heads", 0, flux_max_width);
  c.depth_double = f.integer("depth_double", 0, flux_max_depth);
  c.depth_single = f.integer("depth_single", 0, flux_max_depth);
  c.rope_axes = f.triple("rope_axes", 0, flux_max_width);
  c.rope_theta = f.number("rope_theta");
  c.vec_in = f.integer("vec_in", 0, flux_max_width);
  c.context_in = f.integer("context_in", 0, flux_max_width);
  c.mlp_ratio = f.number("mlp_ratio");
  c.qkv_bias = f.integer("qkv_bias", 0, 1) == 1;
  c.guidance_embed = f.integer("guidance_embed", 0, 1) == 1;
  f.finish();
  try {
    validate(c);
  } catch (const invalid_input& error) {
    fail(source, ": ", error.what());
  }
  return c;
}

/// The shipped model's transformer shape: 3 x 16 x 16 pixels packed 2 x 2 into 64 tokens of 12 channels,
/// hidden 64 in 2 heads of 32 (RoPE axes 8, 12, 12), 2 double + 2 single blocks, word embeddings of width 32,
/// no guidance embedding.
inline flux_config shapes_flux_config() {
  return {.in_channels = 12,
          .hidden = 64,
          .heads = 2,
          .depth_double = 2,
          .depth_single = 2,
          .rope_axes = {8, 12, 12},
          .vec_in = 32,
          .context_in = 32,
          .guidance_embed = false};
}

// ---- A pretrained model directory -------------------------------------------------------------------------------

/// A model directory as `branchgrpo pretrain` writes it: model.safetensors (bfl names, __metadata__ holding
/// "branchgrpo.flux_config") and prompts.safetensors (torch/flux/prompt_embeddings.hpp).
struct shapes_model {
  flux_config config;
  std::map<std::string, torch::Tensor> weights;  ///< bfl names, float32, CPU
  prompt_embeddings embeddings;                  ///< float32, CPU
  std::vector<std::string> prompts;
  std::map<std::string, std::string> metadata;  ///< model.safetensors' __metadata__
};

namespace detail {

/// What every pretrained model directory's model.safetensors holds, read once for either family: its metadata
/// (which must declare one family: require_one_model_family), the config under `config_key` parsed by
/// `parse(text, source)`, and the weights as float32 on the CPU, each of model_weight_dtypes and finite (checked as
/// it is copied). Errors are one line naming the file, e.g. "m/model.safetensors: no __metadata__ key
/// 'branchgrpo.flux_config'".
template <class Parse>
auto read_model_file(const std::filesystem::path& path, std::string_view config_key, Parse&& parse,
                     std::map<std::string, torch::Tensor>& weights, std::map<std::string, std::string>& metadata) {
  const safetensors_checkpoint checkpoint(path);
  metadata = checkpoint.metadata();
  require_one_model_family(metadata, path.string());
  const auto it = metadata.find(std::string(config_key));
  require(it != metadata.end(), path.string(), ": no __metadata__ key '", config_key, "'");
  auto config = parse(it->second, path.string());
  weights =
      load_safetensors(checkpoint, {.dtype = torch::kFloat32, .allowed_dtypes = model_weight_dtypes, .finite = true});
  return config;
}

/// The key of row r's starting noise in the ODE samplers: noise_key{seed, 0, tree = r, node 0, step 0, root_latent}.
inline auto ode_root_key(std::uint64_t seed) {
  return [seed](std::int64_t r) {
    return noise_key{.seed = seed, .tree = static_cast<std::uint32_t>(r), .stream = noise_stream::root_latent};
  };
}

}  // namespace detail

/// Reads DIR/model.safetensors and DIR/prompts.safetensors; checks that the file declares FLUX alone
/// (require_one_model_family), that every weight is of model_weight_dtypes and finite (checked as it is copied),
/// that the weights match the config and the embeddings' widths match its context_in / vec_in. Errors are one line
/// naming the file (and the tensor).
/// Example: load_shapes_model("models/shapes-tiny") -> config shapes_flux_config(), 12 prompts.
inline shapes_model load_shapes_model(const std::filesystem::path& dir) {
  const std::filesystem::path model_path = dir / "model.safetensors";
  const std::filesystem::path prompts_path = dir / "prompts.safetensors";
  require(std::filesystem::is_regular_file(model_path), model_path.string(), ": no such file");
  shapes_model out;
  out.config =
      detail::read_model_file(model_path, flux_config_metadata_key, parse_flux_config, out.weights, out.metadata);
  const flux_key_report report = check_flux_tensors(out.config, flux_layout::bfl, detail::tensor_shapes(out.weights));
  require(report.ok(), model_path.string(), ": weights do not match the config: ", report.message());
  prompt_file prompts = load_prompt_file(prompts_path);
  check_prompt_file(prompts, out.config, prompts_path.string());
  out.embeddings = std::move(prompts.embeddings);
  out.prompts = std::move(prompts.prompts);
  return out;
}

/// A transformer of the model's config holding its weights (float32, CPU, evaluation only: no adapters).
inline std::shared_ptr<flux_transformer> make_shapes_transformer(const shapes_model& model) {
  auto transformer = std::make_shared<flux_transformer>(model.config);
  load_flux_weights(*transformer, model.weights, flux_layout::bfl);
  return transformer;
}

// ---- Sampling -----------------------------------------------------------------------------------------------

namespace detail {

// The transformer over a prompt table's embeddings as a Denoiser<torch_backend> (float32, guidance 1): what
// shapes_sample_ode hands to the core's sample_ode.
struct shapes_ode_denoiser {
  flux_transformer* model;
  torch::Tensor context;  // [N, L, context_in] of the whole table
  torch::Tensor pooled;   // [N, vec_in]

  torch::Tensor operator()(const torch::Tensor& x, const denoise_batch& batch) {
    const std::int64_t rows = x.size(0);
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    const torch::Tensor index =
        torch::tensor(std::vector<std::int64_t>(batch.prompts.begin(), batch.prompts.end()), torch::kInt64)
            .to(x.device());
    return model->forward_latents(x, context.index_select(0, index), pooled.index_select(0, index),
                                  torch::full({rows}, batch.sigma, f32),
                                  model->config().guidance_embed ? torch::full({rows}, 1.0, f32) : torch::Tensor());
  }
};

}  // namespace detail

/// Images [rows, C, H, W] of the deterministic flow ODE (the core's sample_ode): x starts at the keyed normals
/// noise_key{seed, 0, tree = row, node 0, step 0, root_latent}, then x <- x + (sigma_{i+1} - sigma_i) v(x, sigma_i)
/// over shifted_linear_schedule(steps, shift) (Euler; v = eps - x0, the core's convention). No autograd.
/// Example: the shipped model, prompts {0, 4}, seed 1 -> [2, 3, 16, 16]: a red circle and a green square, mostly.
/// @pre prompts index embeddings' rows; steps >= 1; shift > 0; model on the CPU or any device (result on it).
inline torch::Tensor shapes_sample_ode(flux_transformer& model, const prompt_embeddings& embeddings,
                                       std::span<const std::int64_t> prompts, std::uint64_t seed, int steps = 20,
                                       double shift = 3.0, std::int64_t height = shapes_image_size,
                                       std::int64_t width = shapes_image_size) {
  const sigma_schedule schedule = shifted_linear_schedule(steps, shift);
  const auto rows = static_cast<std::int64_t>(prompts.size());
  const std::int64_t channels = model.config().latent_channels();
  const std::int64_t n = embeddings.context.size(0);
  for (std::size_t r = 0; r < prompts.size(); ++r)
    require(prompts[r] >= 0 && prompts[r] < n, "sample row ", r, " has prompt ", prompts[r], ", the table has ", n);
  const torch::Device device = model.img_in->weight.device();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  if (rows == 0) return torch::empty({0, channels, height, width}, f32);
  torch::NoGradGuard no_grad;
  torch_backend backend{.device = device, .dtype = torch::kFloat32};
  detail::shapes_ode_denoiser denoiser{
      .model = &model, .context = embeddings.context.to(f32), .pooled = embeddings.pooled.to(f32)};
  return sample_ode(backend, denoiser, schedule, latent_shape{{channels, height, width}}, prompts,
                    detail::ode_root_key(seed), rows)
      .front();
}

}  // namespace branchgrpo
