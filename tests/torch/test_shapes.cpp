// The shapes data set, word embeddings, flux_config metadata, the prompt-embeddings file, the rewards and the
// shipped model (adapters/torch/branchgrpo/torch/{shapes,prompt_file,rewards}.hpp).
#include <torch/torch.h>
#include <turbojpeg.h>

#include "branchgrpo/app/rewards.hpp"
#include "branchgrpo/app/run_memory.hpp"
#include "branchgrpo/app/shapes.hpp"
#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "error_text.hpp"
#include "source_tree.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <numbers>
#include <set>
#include <string>
#include <variant>
#include <vector>

using namespace branchgrpo;
using branchgrpo::testing::error_of;
using branchgrpo::testing::models_dir;
using Catch::Matchers::Contains;

static_assert(Reward<jpeg_compressibility, torch_backend>);
static_assert(Reward<jpeg_incompressibility, torch_backend>);
static_assert(Reward<shape_alignment, torch_backend>);
static_assert(Reward<weighted_sum, torch_backend>);
static_assert(!Reward<int, torch_backend>);

namespace {

const double not_a_number = std::numeric_limits<double>::quiet_NaN();

std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / "branchgrpo_test_shapes";
  std::filesystem::create_directories(dir);
  return dir / name;
}

// A 16 x 16 image of grey `background` with an axis-aligned rectangle rows [r0, r1) x columns [c0, c1) of `rgb`
// (values in [0, 1]), as [3, 16, 16] in [-1, 1].
torch::Tensor rectangle(std::array<double, 3> rgb, int r0, int r1, int c0, int c1, double background = 0.92) {
  torch::Tensor image = torch::full({3, 16, 16}, 2 * background - 1, torch::kFloat32);
  for (int k = 0; k < 3; ++k)
    image[k].slice(0, r0, r1).slice(1, c0, c1).fill_(2 * rgb[static_cast<std::size_t>(k)] - 1);
  return image;
}

// Bytes of the JPEG of an interleaved RGB image, straight from TurboJPEG (the reward's reference).
unsigned long reference_jpeg_size(std::vector<unsigned char> rgb, int width, int height, int quality) {
  tjhandle handle = tjInitCompress();
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const int status = tjCompress2(handle, rgb.data(), width, 0, height, TJPF_RGB, &buffer, &size, TJSAMP_420, quality,
                                 TJFLAG_ACCURATEDCT);
  tjFree(buffer);
  tjDestroy(handle);
  REQUIRE(status == 0);
  return size;
}

std::vector<std::int64_t> zeros(std::size_t n) { return std::vector<std::int64_t>(n, 0); }

}  // namespace

// ---- Data set ---------------------------------------------------------------------------------------------------

TEST_CASE("shapes prompts: 4 colours x 3 shapes in index order 3 colour + shape") {
  const std::vector<std::string> prompts = shapes_prompts();
  REQUIRE(prompts.size() == 12);
  CHECK(prompts[0] == "a red circle");
  CHECK(prompts[4] == "a green square");
  CHECK(prompts[11] == "a yellow triangle");
  for (std::size_t p = 0; p < prompts.size(); ++p)
    CHECK((parse_shapes_prompt(prompts[p]) ==
           shapes_target{.colour = static_cast<int>(p / 3), .shape = static_cast<int>(p % 3)}));
  CHECK((parse_shapes_prompt("A Blue triangle") == shapes_target{.colour = 2, .shape = 2}));
  CHECK_THROWS_WITH(parse_shapes_prompt("a red dog"), "prompt 'a red dog' names no shape (circle, square, triangle)");
  CHECK_THROWS_WITH(parse_shapes_prompt("a square"), Contains("names no colour"));
}

TEST_CASE("shapes_draw is a pure function of (seed, index) within the documented ranges") {
  CHECK(shapes_draw(3, 17) == shapes_draw(3, 17));
  CHECK_FALSE(shapes_draw(3, 17) == shapes_draw(3, 18));
  CHECK_FALSE(shapes_draw(3, 17) == shapes_draw(4, 17));
  CHECK(shapes_draw(0, 5, 4).prompt == 4);
  CHECK_THROWS_WITH(shapes_draw(0, 5, 12), "shapes prompt 12 is outside [0, 12)");
  std::map<std::int64_t, int> counts;
  for (std::uint64_t i = 0; i < 1200; ++i) {
    const shapes_sample s = shapes_draw(1, i);
    ++counts[s.prompt];
    const int shape = static_cast<int>(s.prompt % 3);
    const double e = shape == 0 ? s.radius : shape == 1 ? 0.85 * s.radius : 1.2 * s.radius;
    REQUIRE(s.radius >= 3.0);
    REQUIRE(s.radius <= 5.0);
    REQUIRE(s.cx - e >= 1.0);  // one pixel of background all around
    REQUIRE(s.cx + e <= 15.0);
    REQUIRE(s.cy - e >= 1.0);
    REQUIRE(s.cy + e <= 15.0);
    REQUIRE(std::abs(s.background - 0.92) <= 0.03);
    for (std::size_t k = 0; k < 3; ++k)
      REQUIRE(std::abs(s.colour[k] - shapes_palette[static_cast<std::size_t>(s.prompt / 3)][k]) <= 0.06 + 1e-12);
  }
  // Uniform prompts: expected 100 each, binomial sd 9.6; the bounds are 4 sd (and the draw is fixed).
  REQUIRE(counts.size() == 12);
  for (const auto& [prompt, count] : counts) {
    CHECK(count > 60);
    CHECK(count < 140);
  }
}

TEST_CASE("the jitter and the prompt draw shared by the image and the clip data sets") {
  // The doc example: mid uniforms leave the palette and the background exactly.
  shapes_sample s;
  branchgrpo::detail::shapes_jitter(s, 1, {0, 0, 0, 0.5, 0.5, 0.5, 0.5, 0});
  CHECK(s.background == 0.92);
  CHECK(s.colour == shapes_palette[1]);
  // u = 1 everywhere: +0.03 on the background, +0.06 per channel, clamped at 1 (yellow's red is 0.95).
  branchgrpo::detail::shapes_jitter(s, 3, {0, 0, 0, 1, 1, 1, 1, 0});
  CHECK(s.background == Approx(0.95));
  CHECK(s.colour[0] == 1.0);
  CHECK(s.colour[2] == Approx(shapes_palette[3][2] + 0.06));
  CHECK(branchgrpo::detail::drawn_prompt({}, 0.999999, 12, "shapes") == 11);
  CHECK(branchgrpo::detail::drawn_prompt({}, 0.5, 48, "moving-shapes") == 24);
  CHECK(branchgrpo::detail::drawn_prompt(7, 0.0, 12, "shapes") == 7);
  CHECK_THROWS_WITH(branchgrpo::detail::drawn_prompt(-1, 0.0, 48, "moving-shapes"),
                    "moving-shapes prompt -1 is outside [0, 48)");
}

TEST_CASE("shapes_render: the doc example, value ranges and batches") {
  // A red circle of radius 4 at (8, 8), no jitter: the centre pixel is all shape, a corner all background.
  const shapes_sample circle{
      .prompt = 0, .radius = 4, .cx = 8, .cy = 8, .colour = shapes_palette[0], .background = 0.92};
  const torch::Tensor image = shapes_render(circle);
  REQUIRE(image.sizes() == c10::IntArrayRef({3, 16, 16}));
  CHECK(image[0][8][8].item<double>() == Approx(0.8).margin(1e-6));
  CHECK(image[1][8][8].item<double>() == Approx(-0.8).margin(1e-6));
  CHECK(image[2][8][8].item<double>() == Approx(-0.8).margin(1e-6));
  for (int k = 0; k < 3; ++k) CHECK(image[k][0][0].item<double>() == Approx(0.84).margin(1e-6));
  // Pixel (row 8, column 11): sub-pixel centres x 11.125 .. 11.875, y 8.125 .. 8.875, all inside
  // ((x - 8)^2 + (y - 8)^2 <= 3.875^2 + 0.875^2 = 15.78 <= 16): the colour. Column 12: x - 8 >= 4.125, none
  // inside: the background.
  CHECK(image[0][8][11].item<double>() == Approx(0.8).margin(1e-6));
  CHECK(image[0][8][12].item<double>() == Approx(0.84).margin(1e-6));
  // Pixel (11, 11): centres (11.125..11.875)^2 pairs; inside when dx^2 + dy^2 <= 16, dx, dy in {3.125, 3.375,
  // 3.625, 3.875}: 3.125^2 + 3.125^2 = 19.5 > 16, so no centre is inside.
  CHECK(image[0][11][11].item<double>() == Approx(0.84).margin(1e-6));
  // Pixel (10, 10): dx, dy in {2.125, ..., 2.875}; the largest 2.875^2 * 2 = 16.53 > 16 and 2.875^2 + 2.625^2 =
  // 15.16 <= 16: 15 of 16 inside -> red channel 2 (15/16 0.9 + 1/16 0.92) - 1 = 0.8025.
  CHECK(image[0][10][10].item<double>() == Approx(0.8025).margin(1e-6));

  const shapes_batch batch = make_shapes_batch(0, 10, 2);
  REQUIRE(batch.images.sizes() == c10::IntArrayRef({2, 3, 16, 16}));
  CHECK(torch::equal(batch.images[1], shapes_render(shapes_draw(0, 11))));
  CHECK(batch.prompts[1] == shapes_draw(0, 11).prompt);
  CHECK(make_shapes_batch(0, 0, 0).images.size(0) == 0);
  CHECK_THROWS_WITH(make_shapes_batch(0, 0, -1), "shapes batch size must be non-negative, got -1");

  const shapes_batch many = make_shapes_batch(5, 0, 64);
  CHECK(many.images.min().item<double>() >= -1.0);
  CHECK(many.images.max().item<double>() <= 1.0);
  CHECK(torch::equal(many.images, make_shapes_batch(5, 0, 64).images));  // deterministic
  // The border ring is background: every channel equal to the grey in [0.89, 0.95] -> [0.78, 0.90].
  const torch::Tensor top = many.images.select(2, 0);
  CHECK(top.min().item<double>() >= 0.78 - 1e-6);
  CHECK(top.max().item<double>() <= 0.90 + 1e-6);
}

TEST_CASE("word embeddings: fixed keyed vectors per word") {
  CHECK(fnv1a32("") == 0x811c9dc5u);
  CHECK(fnv1a32("a") == 0xe40c292cu);
  CHECK((prompt_words("  A Red\tcircle ") == std::vector<std::string>{"a", "red", "circle"}));
  const std::vector<std::string> prompts = shapes_prompts();
  const prompt_embeddings e = shapes_word_embeddings(prompts, 32, 16);
  REQUIRE(e.context.sizes() == c10::IntArrayRef({12, 3, 32}));
  REQUIRE(e.pooled.sizes() == c10::IntArrayRef({12, 16}));
  // "red" is word 1 of prompts 0, 1, 2: one vector, keyed_normal of its FNV hash, table 0.
  const std::vector<double> red = shapes_word_vector("red", 0, 32);
  CHECK(red[0] ==
        keyed_normal(
            {.seed = shapes_embedding_seed, .tree = fnv1a32("red"), .node = 0, .stream = noise_stream::auxiliary}, 0));
  for (int p = 0; p < 3; ++p)
    for (int j = 0; j < 32; ++j)
      REQUIRE(e.context[p][1][j].item<float>() == static_cast<float>(red[static_cast<std::size_t>(j)]));
  // pooled = (u_a + u_red + u_circle) / sqrt(3), table 1.
  const auto a = shapes_word_vector("a", 1, 16), r = shapes_word_vector("red", 1, 16),
             c = shapes_word_vector("circle", 1, 16);
  for (std::size_t j = 0; j < 16; ++j)
    CHECK(e.pooled[0][static_cast<std::int64_t>(j)].item<double>() ==
          Approx((a[j] + r[j] + c[j]) / std::sqrt(3.0)).margin(1e-6));
  // Padding: a one-word prompt next to a three-word one has zeros after its word.
  const std::vector<std::string> mixed = {"red", "a blue square"};
  const prompt_embeddings m = shapes_word_embeddings(mixed, 8, 8);
  CHECK(m.context.size(1) == 3);
  CHECK(m.context[0][1].abs().sum().item<double>() == 0.0);
  CHECK(shapes_word_embeddings(mixed, 8, 8, 5).context.size(1) == 5);
  CHECK_THROWS_WITH(shapes_word_embeddings(mixed, 8, 8, 2),
                    "word embedding length 2 is below the longest prompt's 3 words");
  CHECK_THROWS_WITH(shapes_word_embeddings(std::vector<std::string>{}, 8, 8),
                    "word embeddings need at least one prompt");
}

TEST_CASE("flux_config metadata text round-trips and rejects bad text") {
  const std::string text = format_flux_config(shapes_flux_config());
  CHECK(text ==
        "in_channels=12;hidden=64;heads=2;depth_double=2;depth_single=2;rope_axes=8,12,12;rope_theta=10000;vec_in=32;"
        "context_in=32;mlp_ratio=4;qkv_bias=1;guidance_embed=0");
  CHECK(parse_flux_config(text, "m") == shapes_flux_config());
  CHECK(parse_flux_config(format_flux_config(flux_config::dev()), "m") == flux_config::dev());
  flux_config odd = flux_config::tiny();
  odd.mlp_ratio = 2.5;
  odd.rope_theta = 1234.5;
  CHECK(parse_flux_config(format_flux_config(odd), "m") == odd);
  std::string bad = text;
  bad.replace(bad.find("hidden=64"), 9, "hidden=x");
  CHECK_THROWS_WITH(parse_flux_config(bad, "m"), "m: flux_config hidden = x: must be an integer in [0, 65536]");
  bad = text;
  bad.replace(bad.find("depth_double=2"), 14, "depth_double=100000000");  // a hostile file: refused before building
  CHECK_THROWS_WITH(parse_flux_config(bad, "m"),
                    "m: flux_config depth_double = 100000000: must be an integer in [0, 1024]");
  bad = text;
  bad.replace(bad.find("rope_theta=10000"), 16, "rope_theta=1e999");
  CHECK_THROWS_WITH(parse_flux_config(bad, "m"), "m: flux_config rope_theta = 1e999: must be a finite number");
  CHECK_THROWS_WITH(parse_flux_config(text + ";colour=1", "m"), "m: unknown flux_config key 'colour'");
  CHECK_THROWS_WITH(parse_flux_config(text + ";hidden=64", "m"), "m: flux_config key 'hidden' appears twice");
  CHECK_THROWS_WITH(parse_flux_config("hidden=64", "m"), "m: flux_config has no 'in_channels'");
  bad = text;
  bad.replace(bad.find("heads=2"), 7, "heads=5");
  CHECK_THROWS_WITH(parse_flux_config(bad, "m"), "m: flux_config: hidden 64 is not divisible by heads 5");
  bad = text;
  bad.replace(bad.find("qkv_bias=1"), 10, "qkv_bias=2");
  CHECK_THROWS_WITH(parse_flux_config(bad, "m"), "m: flux_config qkv_bias = 2: must be an integer in [0, 1]");
}

// ---- Prompt file ----------------------------------------------------------------------------------------------

TEST_CASE("prompt file: round trip") {
  const std::vector<std::string> prompts = {"a red circle", "a blue square"};
  const prompt_embeddings e = shapes_word_embeddings(prompts, 32, 16);
  const auto path = scratch("round_trip.safetensors");
  save_prompt_file(path, e, prompts);
  const prompt_file file = load_prompt_file(path);
  CHECK(file.prompts == prompts);
  CHECK(torch::equal(file.embeddings.context, e.context));
  CHECK(torch::equal(file.embeddings.pooled, e.pooled));
  const safetensors_file raw(path);
  CHECK(raw.metadata().at("prompts") == "a red circle\na blue square");
  CHECK(raw.metadata().at("context_in") == "32");
  CHECK(raw.metadata().at("vec_in") == "16");
  CHECK(raw.at("context").dtype == safetensors_dtype::f32);
  check_prompt_file(file, flux_config{.vec_in = 16, .context_in = 32}, "x");  // widths match
  CHECK_THROWS_WITH(check_prompt_file(file, flux_config::dev(), "p.safetensors"),
                    "p.safetensors: context width 32 does not match the model's context_in 4096");
  CHECK_THROWS_WITH(check_prompt_file(file, flux_config{.context_in = 32}, "p.safetensors"),
                    "p.safetensors: pooled width 16 does not match the model's vec_in 768");

  // BF16 tensors load as float32 (the layout's F32 is what save writes; other floats are accepted).
  const auto bf16 = scratch("bf16.safetensors");
  save_safetensors(bf16, {{"context", e.context.to(torch::kBFloat16)}, {"pooled", e.pooled.to(torch::kBFloat16)}},
                   {{"prompts", "a red circle\na blue square"}});
  const prompt_file loaded = load_prompt_file(bf16);
  CHECK(loaded.embeddings.context.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(loaded.embeddings.pooled, e.pooled.to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("prompt file: every rejection names the file") {
  const std::vector<std::string> prompts = {"a red circle", "a blue square"};
  const prompt_embeddings e = shapes_word_embeddings(prompts, 8, 4);
  const std::map<std::string, std::string> metadata = {{"prompts", "a red circle\na blue square"}};
  const auto path = scratch("bad.safetensors");
  const std::string name = path.string();
  const auto write_and_load = [&](const std::map<std::string, torch::Tensor>& tensors,
                                  const std::map<std::string, std::string>& meta) {
    save_safetensors(path, tensors, meta);
    return load_prompt_file(path);
  };
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled}}, {{"prompts", "a red circle"}}),
                    name + ": 1 prompt strings for 2 embedding rows");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled}}, {}),
                    name + ": no __metadata__ key 'prompts' (the prompt strings)");
  // A file without pooled vectors loads (Wan's); a FLUX model refuses it.
  CHECK_THROWS_WITH(check_prompt_file(write_and_load({{"context", e.context}}, metadata),
                                      flux_config{.vec_in = 4, .context_in = 8}, name),
                    name + ": tensor 'pooled' is missing (FLUX needs pooled vectors)");
  CHECK_THROWS_WITH(write_and_load({{"pooled", e.pooled}}, metadata), name + ": tensor 'context' is missing");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled}, {"extra", e.pooled}}, metadata),
                    name +
                        ": unexpected tensor 'extra' (a prompt file holds context, pooled, negative_context, "
                        "negative_pooled, negative_index)");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context[0]}, {"pooled", e.pooled}}, metadata),
                    name + ": tensor 'context' has shape [3, 8], expected [N, L, context_in]");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled[0]}}, metadata),
                    name + ": tensor 'pooled' has shape [4], expected [N, vec_in]");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled.slice(0, 0, 1)}}, metadata),
                    name + ": tensor 'context' holds 2 prompts, 'pooled' 1");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled.to(torch::kInt32)}}, metadata),
                    name + ": tensor 'pooled' has dtype I32, expected F32");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context.slice(1, 0, 0)}, {"pooled", e.pooled}}, metadata),
                    name + ": tensor 'context' has shape [2, 0, 8] with an empty dimension");
  torch::Tensor with_nan = e.context.clone();
  with_nan[1][2][5] = not_a_number;
  CHECK_THROWS_WITH(write_and_load({{"context", with_nan}, {"pooled", e.pooled}}, metadata),
                    name + ": tensor 'context' of prompt 1 holds nan at element 21");  // 2 * 8 + 5
  std::map<std::string, std::string> wrong_width = metadata;
  wrong_width["context_in"] = "4096";
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled}}, wrong_width),
                    name + ": __metadata__ context_in '4096' does not match the tensor's 8");
  std::filesystem::remove(path);
  CHECK_THROWS_WITH(load_prompt_file(path), Contains(name));

  const auto out = scratch("save.safetensors");
  const std::vector<std::string> newline = {"a red\ncircle", "x"};
  CHECK_THROWS_WITH(save_prompt_file(out, e, newline), out.string() + ": prompt 0 holds a newline");
  const std::vector<std::string> one = {"a red circle"};
  CHECK_THROWS_WITH(save_prompt_file(out, e, one), out.string() + ": 1 prompt strings for 2 embedding rows");
}

TEST_CASE("prompt file: negative prompts, family and encoder") {
  const std::vector<std::string> prompts = {"a red circle", "a blue square", "a green star"};
  const std::vector<std::string> negatives = {"blurry", ""};
  const prompt_embeddings e = shapes_word_embeddings(prompts, 8, 4);
  const std::vector<std::string> negative_words = {"a red square", "a blue circle"};
  const prompt_embeddings n = shapes_word_embeddings(negative_words, 8, 4);
  const prompt_file file{.embeddings = e,
                         .prompts = prompts,
                         .negative_embeddings = n,
                         .negative_prompts = negatives,
                         .negative_index = {1, 0, 1},
                         .family = "flux",
                         .encoder = "t5+clip"};
  const auto path = scratch("negatives.safetensors");
  const std::string name = path.string();
  save_prompt_file(path, file);
  const prompt_file loaded = load_prompt_file(path);
  CHECK(loaded.has_negatives());
  CHECK(loaded.negative_prompts == negatives);
  CHECK(loaded.negative_index == std::vector<std::int64_t>{1, 0, 1});
  CHECK(torch::equal(loaded.negative_embeddings.context, n.context));
  CHECK(torch::equal(loaded.negative_embeddings.pooled, n.pooled));
  CHECK(loaded.family == "flux");
  CHECK(loaded.encoder == "t5+clip");
  const safetensors_file raw(path);
  CHECK(raw.metadata().at("negative_prompts") == "blurry\n");
  CHECK(raw.metadata().at("text_len") == "3");
  CHECK(raw.at("negative_index").dtype == safetensors_dtype::i64);

  // The family and encoder a model needs: one line each.
  check_prompt_source(loaded, "flux", "t5+clip", name);
  check_prompt_source(loaded, "flux", "", name);  // test shapes take any encoder
  CHECK_THROWS_WITH(check_prompt_source(loaded, "wan", "umt5", name),
                    name + ": made for flux models (metadata family = 'flux'); the model is wan");
  prompt_file t5_for_wan = loaded;
  t5_for_wan.family = "";
  CHECK_THROWS_WITH(check_prompt_source(t5_for_wan, "wan", "umt5", name),
                    name +
                        ": features of encoder 't5+clip'; the model needs umt5 features "
                        "(scripts/export_prompt_embeddings.py --model wan)");
  t5_for_wan.encoder = "";
  CHECK_THROWS_WITH(check_prompt_source(t5_for_wan, "wan", "umt5", name),
                    name +
                        ": no 'encoder' metadata: the model needs umt5 features (write them with "
                        "scripts/export_prompt_embeddings.py --model wan)");
  check_prompt_source(t5_for_wan, "flux", "t5+clip", name);  // files of the T5 + CLIP exporter before the key

  // One negative for all needs no index; several do.
  const auto write_and_load = [&](const std::map<std::string, torch::Tensor>& tensors,
                                  const std::map<std::string, std::string>& meta) {
    save_safetensors(path, tensors, meta);
    return load_prompt_file(path);
  };
  const std::map<std::string, std::string> metadata = {{"prompts", "a red circle\na blue square\na green star"},
                                                       {"negative_prompts", "blurry"}};
  const prompt_file shared = write_and_load({{"context", e.context},
                                             {"pooled", e.pooled},
                                             {"negative_context", n.context.slice(0, 0, 1)},
                                             {"negative_pooled", n.pooled.slice(0, 0, 1)}},
                                            metadata);
  CHECK(shared.negative_index == std::vector<std::int64_t>{0, 0, 0});
  std::map<std::string, std::string> two = metadata;
  two["negative_prompts"] = "blurry\nugly";
  CHECK_THROWS_WITH(write_and_load({{"context", e.context},
                                    {"pooled", e.pooled},
                                    {"negative_context", n.context},
                                    {"negative_pooled", n.pooled}},
                                   two),
                    name + ": 2 negative prompts need tensor 'negative_index' (which prompt takes which)");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context},
                                    {"pooled", e.pooled},
                                    {"negative_context", n.context},
                                    {"negative_pooled", n.pooled},
                                    {"negative_index", torch::tensor({0, 2, 1}, torch::kInt64)}},
                                   two),
                    name + ": negative_index[1] = 2 is not a negative row in [0, 2)");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context},
                                    {"pooled", e.pooled},
                                    {"negative_context", n.context.slice(1, 0, 2)},
                                    {"negative_pooled", n.pooled},
                                    {"negative_index", torch::tensor({0, 1, 1}, torch::kInt64)}},
                                   two),
                    name +
                        ": tensor 'negative_context' has shape [2, 2, 8]: its tokens and width must be context's "
                        "[3, 8]");
  CHECK_THROWS_WITH(
      write_and_load({{"context", e.context}, {"pooled", e.pooled}, {"negative_context", n.context.slice(0, 0, 1)}},
                     metadata),
      name + ": tensor 'negative_pooled' is missing beside 'pooled'");
  CHECK_THROWS_WITH(write_and_load({{"context", e.context},
                                    {"pooled", e.pooled},
                                    {"negative_context", n.context.slice(0, 0, 1)},
                                    {"negative_pooled", n.pooled.slice(0, 0, 1)}},
                                   {{"prompts", metadata.at("prompts")}}),
                    name + ": no __metadata__ key 'negative_prompts' beside tensor 'negative_context'");
  std::map<std::string, std::string> other_family = metadata;
  other_family["family"] = "qwenimage";
  CHECK_THROWS_WITH(write_and_load({{"context", e.context}, {"pooled", e.pooled}}, other_family),
                    name + ": __metadata__ family 'qwenimage' is not one of flux, wan, sd3 or wan22");
}

TEST_CASE("prompt_table: rows in memory and in mapped files, in order, on demand") {
  const std::vector<std::string> words = {"a red circle", "a blue square", "a green star", "a red star",
                                          "a blue circle"};
  const prompt_embeddings e = shapes_word_embeddings(words, 8, 4);
  const auto path = scratch("table.safetensors");
  save_safetensors(path, {{"context", e.context.slice(0, 2, 5)}, {"pooled", e.pooled.slice(0, 2, 5)}}, {});
  auto file = std::make_shared<const safetensors_file>(path);
  // The doc example: 2 rows in memory, then a mapped file of 3.
  prompt_table table(prompt_embeddings{.context = e.context.slice(0, 0, 2), .pooled = e.pooled.slice(0, 0, 2)});
  table.append(prompt_table::mapped(file, file->at("context"), file->find("pooled")));
  CHECK(table.size() == 5);
  CHECK((table.tokens() == 3 && table.width() == 8 && table.pooled_width() == 4));
  CHECK_FALSE(table.in_memory());
  const std::vector<std::int64_t> rows = {4, 0, 2, 4};
  const prompt_embeddings got = table.rows(rows, torch::kCPU);
  const torch::Tensor index = torch::tensor(rows, torch::kInt64);
  CHECK(torch::equal(got.context, e.context.index_select(0, index)));
  CHECK(torch::equal(got.pooled, e.pooled.index_select(0, index)));
  const std::vector<std::int64_t> outside = {1, 5};
  CHECK_THROWS_WITH(table.rows(outside, torch::kCPU), "row 1 has prompt 5, the table has 5");
  CHECK_THROWS_WITH(table.append(prompt_table(torch::zeros({1, 3, 7}), torch::zeros({1, 4}))),
                    "prompt rows of 3 x 7 features appended to a table of 3 x 8");
  CHECK_THROWS_WITH(table.append(prompt_table(torch::zeros({1, 3, 8}), torch::Tensor())),
                    "prompt rows with pooled width 0 appended to a table with pooled width 4 (0: none)");
  // A NaN in a mapped row is found when the row is read, naming the file and the row.
  torch::Tensor with_nan = e.context.slice(0, 2, 5).clone();
  with_nan[1][0][3] = not_a_number;
  const auto bad = scratch("table_nan.safetensors");
  save_safetensors(bad, {{"context", with_nan}}, {});
  auto bad_file = std::make_shared<const safetensors_file>(bad);
  const prompt_table mapped = prompt_table::mapped(bad_file, bad_file->at("context"), nullptr);
  const std::vector<std::int64_t> fine = {0, 2}, one = {1};
  CHECK(torch::equal(mapped.rows(fine, torch::kCPU).context, with_nan.index_select(0, torch::tensor({0, 2}))));
  CHECK_THROWS_WITH(mapped.rows(one, torch::kCPU),
                    bad.string() + ": prompt 1: tensor 'context' holds a non-finite value (nan) at element 3");
}

TEST_CASE("prompt dataset: shards read by row, negatives kept once, every rejection names the file") {
  const std::vector<std::string> prompts = {"a red circle", "a blue square", "a green star", "a red star",
                                            "a blue circle"};
  const prompt_embeddings e = shapes_word_embeddings(prompts, 8, 4);
  const std::vector<std::string> negative_words = {"a red square", "a green circle"};
  const prompt_embeddings n = shapes_word_embeddings(negative_words, 8, 4);
  const auto dir = scratch("dataset");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto shard = [&](std::int64_t from, std::int64_t to, std::vector<std::string> negatives,
                         std::vector<std::int64_t> index, torch::Tensor negative_rows) {
    return prompt_file{.embeddings = {.context = e.context.slice(0, from, to), .pooled = e.pooled.slice(0, from, to)},
                       .prompts = std::vector<std::string>(prompts.begin() + from, prompts.begin() + to),
                       .negative_embeddings = {.context = n.context.index_select(0, negative_rows),
                                               .pooled = n.pooled.index_select(0, negative_rows)},
                       .negative_prompts = std::move(negatives),
                       .negative_index = std::move(index),
                       .family = "flux",
                       .encoder = "t5+clip"};
  };
  // Shard 1: negatives {"blurry"}, shard 2: {"ugly", "blurry"}; "blurry" has the same features in both.
  save_prompt_file(dir / "p-00001-of-00002.safetensors", shard(0, 3, {"blurry"}, {0, 0, 0}, torch::tensor({0})));
  save_prompt_file(dir / "p-00002-of-00002.safetensors",
                   shard(3, 5, {"ugly", "blurry"}, {0, 1}, torch::tensor({1, 0})));
  const prompt_dataset data = open_prompt_dataset(dir);
  CHECK(data.prompts == prompts);
  CHECK(data.rows.size() == 5);
  CHECK(data.files.size() == 2);
  CHECK(data.negative_prompts == std::vector<std::string>{"blurry", "ugly"});
  CHECK(data.negative_index == std::vector<std::int64_t>{0, 0, 0, 1, 0});
  CHECK(torch::equal(data.negative_embeddings.context, n.context));
  CHECK((data.family == "flux" && data.encoder == "t5+clip"));
  const std::vector<std::int64_t> rows = {3, 1};
  CHECK(torch::equal(data.rows.rows(rows, torch::kCPU).context, e.context.index_select(0, torch::tensor({3, 1}))));
  check_prompt_dataset(data, flux_config{.vec_in = 4, .context_in = 8}, "x");
  CHECK_THROWS_WITH(check_prompt_dataset(data, flux_config::dev(), "d"),
                    "d: context width 8 does not match the model's context_in 4096");
  CHECK_THROWS_WITH(check_prompt_dataset(data, wan_config{.text_dim = 8, .text_len = 2}, "d"),
                    "d: text features [5, 3, 8] do not fit the model's text_dim 8 and text_len 2");
  // One file is a dataset of one shard, the same rows as load_prompt_file's.
  const prompt_dataset single = open_prompt_dataset(dir / "p-00002-of-00002.safetensors");
  CHECK(single.prompts == std::vector<std::string>{"a red star", "a blue circle"});
  const std::vector<std::int64_t> both = {0, 1};
  CHECK(torch::equal(single.rows.rows(both, torch::kCPU).context,
                     load_prompt_file(dir / "p-00002-of-00002.safetensors").embeddings.context));

  // "blurry" with other features in shard 2.
  save_prompt_file(dir / "p-00002-of-00002.safetensors",
                   shard(3, 5, {"ugly", "blurry"}, {0, 1}, torch::tensor({1, 1})));
  CHECK_THROWS_WITH(open_prompt_dataset(dir), (dir / "p-00002-of-00002.safetensors").string() +
                                                  ": negative prompt \"blurry\" has other features than in an "
                                                  "earlier shard");
  // Missing, stray and mismatched shards.
  std::filesystem::remove(dir / "p-00001-of-00002.safetensors");
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    dir.string() + ": shard 1 of 2 (p-00001-of-00002.safetensors) is missing");
  save_prompt_file(dir / "p-00001-of-00002.safetensors", shard(0, 3, {"blurry"}, {0, 0, 0}, torch::tensor({0})));
  std::filesystem::rename(dir / "p-00002-of-00002.safetensors", dir / "p-00003-of-00003.safetensors");
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    dir.string() + ": shard 'p-00003-of-00003.safetensors' is not one of p-*-of-00002.safetensors");
  std::filesystem::remove(dir / "p-00003-of-00003.safetensors");
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    dir.string() + ": shard 2 of 2 (p-00002-of-00002.safetensors) is missing");
  save_safetensors(dir / "extra.safetensors", {{"context", e.context}}, {{"prompts", "a\nb\nc\nd\ne"}});
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    dir.string() +
                        ": shard 'extra.safetensors' is not named NAME-00001-of-00004.safetensors (a "
                        "dataset directory holds only its shards)");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    dir.string() + ": a prompt dataset directory holds no *.safetensors shards");
  // Shards that disagree: another width, or no negatives beside a shard with them.
  save_prompt_file(dir / "p-00001-of-00002.safetensors", shard(0, 3, {"blurry"}, {0, 0, 0}, torch::tensor({0})));
  save_prompt_file(dir / "p-00002-of-00002.safetensors",
                   prompt_file{.embeddings = {.context = e.context.slice(0, 3, 5), .pooled = e.pooled.slice(0, 3, 5)},
                               .prompts = {"a red star", "a blue circle"},
                               .negative_embeddings = {},
                               .negative_prompts = {},
                               .negative_index = {},
                               .family = "flux",
                               .encoder = "t5+clip"});
  CHECK_THROWS_WITH(open_prompt_dataset(dir),
                    (dir / "p-00002-of-00002.safetensors").string() + ": has no negative prompts, shard 1 has");
  save_prompt_file(dir / "p-00002-of-00002.safetensors",
                   prompt_file{.embeddings = shapes_word_embeddings(std::vector<std::string>{"a red star"}, 16, 4),
                               .prompts = {"a red star"},
                               .negative_embeddings = {},
                               .negative_prompts = {},
                               .negative_index = {},
                               .family = "flux",
                               .encoder = "t5+clip"});
  CHECK_THROWS_WITH(open_prompt_dataset(dir), (dir / "p-00002-of-00002.safetensors").string() +
                                                  ": rows of 3 x 16 features (pooled width 4), shard 1 has 3 x 8 (4)");
  std::filesystem::remove_all(dir);
}

// ---- JPEG rewards ---------------------------------------------------------------------------------------------

TEST_CASE("JPEG rewards equal TurboJPEG's sizes computed by hand") {
  CHECK((image_to_rgb8(torch::tensor({-1.0, 0.0, 1.0}).view({3, 1, 1})) == std::vector<std::uint8_t>{0, 128, 255}));
  // A constant mid-grey image (x = 0 -> byte 128) and a keyed-noise image, 16 x 16.
  const torch::Tensor flat = torch::zeros({3, 16, 16});
  std::vector<double> noise_values(3 * 16 * 16);
  fill_keyed_normal({.seed = 42}, noise_values);
  const torch::Tensor noise =
      torch::from_blob(noise_values.data(), {3, 16, 16}, torch::kFloat64).to(torch::kFloat32).clamp(-1, 1);
  const torch::Tensor both = torch::stack({flat, noise});
  const std::vector<std::int64_t> prompts = zeros(2);

  const std::vector<unsigned char> grey(16 * 16 * 3, 128);
  const unsigned long flat_bytes = reference_jpeg_size(grey, 16, 16, 95);
  const unsigned long noise_bytes = reference_jpeg_size(image_to_rgb8(noise), 16, 16, 95);
  CHECK(flat_bytes == 629);  // regression value: libjpeg-turbo 2.1, quality 95, 4:2:0, islow DCT
  CHECK(noise_bytes > flat_bytes + 200);
  CHECK(jpeg_size(grey, 16, 16, 95) == flat_bytes);

  const std::vector<double> compressibility = jpeg_compressibility{}(both, prompts);
  CHECK(compressibility[0] == Approx(-static_cast<double>(flat_bytes) / 1000.0).margin(1e-12));
  CHECK(compressibility[1] == Approx(-static_cast<double>(noise_bytes) / 1000.0).margin(1e-12));
  CHECK(compressibility[0] > compressibility[1]);  // the flat image compresses better
  const std::vector<double> incompressibility = jpeg_incompressibility{}(both, prompts);
  CHECK(incompressibility[0] == Approx(flat_bytes / 1000.0).margin(1e-12));
  CHECK(incompressibility[1] == Approx(noise_bytes / 1000.0).margin(1e-12));

  // Quality changes the size; the reward follows TurboJPEG at that quality.
  const unsigned long low = reference_jpeg_size(image_to_rgb8(noise), 16, 16, 50);
  CHECK(low < noise_bytes);
  CHECK(jpeg_compressibility{.quality = 50}(noise.unsqueeze(0), zeros(1))[0] ==
        Approx(-static_cast<double>(low) / 1000.0).margin(1e-12));

  // A non-finite row scores NaN; the others are unaffected.
  torch::Tensor broken = both.clone();
  broken[0][1][3][4] = not_a_number;
  const std::vector<double> scores = jpeg_compressibility{}(broken, prompts);
  CHECK(std::isnan(scores[0]));
  CHECK(scores[1] == compressibility[1]);

  CHECK_THROWS_WITH(jpeg_compressibility{.quality = 0}(both, prompts),
                    "jpeg_compressibility quality must be in [1, 100], got 0");
  CHECK_THROWS_WITH(jpeg_compressibility{}(both, zeros(3)), "jpeg_compressibility got 3 prompts for 2 rows");
  CHECK_THROWS_WITH(jpeg_incompressibility{}(torch::zeros({2, 4, 8, 8}), prompts),
                    "jpeg_incompressibility expects images [rows, 3, H, W], got [2, 4, 8, 8]");
  CHECK_THROWS_WITH(jpeg_size(grey, 16, 15, 95), "jpeg_size: 768 bytes for a 16 x 15 RGB image");
}

// ---- Shape alignment -------------------------------------------------------------------------------------------

TEST_CASE("shape_alignment: the doc examples on a hand-made square") {
  // Red (0.9, 0.1, 0.1) square rows and columns 5..10 on grey 0.92.
  const torch::Tensor square = rectangle({0.9, 0.1, 0.1}, 5, 11, 5, 11);
  const shape_features f = measure_shape(square);
  REQUIRE(f.object);
  CHECK(f.foreground[0] == Approx(0.9).margin(1e-6));
  CHECK(f.foreground[1] == Approx(0.1).margin(1e-6));
  CHECK(f.background[0] == Approx(0.92).margin(1e-6));
  CHECK(f.area == Approx(36).margin(1e-4));
  CHECK(f.fill == Approx(1).margin(1e-6));
  const torch::Tensor images = square.unsqueeze(0);
  // prompts 1 "a red square", 0 "a red circle", 7 "a blue square"
  CHECK(shape_alignment{}(images, std::vector<std::int64_t>{1})[0] == Approx(1.0).margin(1e-6));
  // 0.5 + 0.5 exp(-(1 - pi/4)^2 / (2 0.08^2)) = 0.5 + 0.5 exp(-3.598) = 0.51370
  CHECK(shape_alignment{}(images, std::vector<std::int64_t>{0})[0] ==
        Approx(0.5 + 0.5 * std::exp(-std::pow(1 - std::numbers::pi / 4, 2) / 0.0128)).margin(1e-6));
  CHECK(shape_alignment{}(images, std::vector<std::int64_t>{0})[0] == Approx(0.5137).margin(1e-4));
  // |f - c_blue|^2 = 1.3075 -> s_colour = exp(-16.34) ~ 8e-8; s_shape 1 -> 0.5.
  CHECK(shape_alignment{}(images, std::vector<std::int64_t>{7})[0] == Approx(0.5).margin(1e-6));
  // colour_weight 1: only the colour counts.
  CHECK(shape_alignment{.colour_weight = 1.0}(images, std::vector<std::int64_t>{0})[0] == Approx(1.0).margin(1e-6));
}

TEST_CASE("shape_alignment: a perfect red circle beats a blue square for 'a red circle'") {
  const torch::Tensor circle =
      shapes_render({.prompt = 0, .radius = 4.5, .cx = 8, .cy = 8, .colour = shapes_palette[0], .background = 0.92});
  const torch::Tensor blue_square =
      shapes_render({.prompt = 7, .radius = 4.5, .cx = 8, .cy = 8, .colour = shapes_palette[2], .background = 0.92});
  const torch::Tensor red_square =
      shapes_render({.prompt = 1, .radius = 4.5, .cx = 8, .cy = 8, .colour = shapes_palette[0], .background = 0.92});
  const torch::Tensor blue_circle =
      shapes_render({.prompt = 6, .radius = 4.5, .cx = 8, .cy = 8, .colour = shapes_palette[2], .background = 0.92});
  const torch::Tensor images = torch::stack({circle, blue_square, red_square, blue_circle});
  const std::vector<double> r = shape_alignment{}(images, zeros(4));  // all "a red circle"
  CHECK(r[0] > 0.95);  // measured fill 0.79 vs pi/4: s_shape ~ 1, colour exact
  CHECK(r[1] < 0.05);  // wrong colour and shape: 0.5 s_shape(fill 1 vs 0.785) ~ 0.014
  CHECK(r[0] - r[1] > 0.9);
  CHECK(r[2] ==
        Approx(0.5 + 0.5 * std::exp(-std::pow(measure_shape(red_square).fill - std::numbers::pi / 4, 2) / 0.0128))
            .margin(1e-9));
  CHECK(r[2] < 0.6);   // right colour only
  CHECK(r[3] > 0.45);  // right shape only
  CHECK(r[3] < 0.55);

  // The data set agrees with its own prompts far more than with a wrong colour or a wrong shape.
  const shapes_batch data = make_shapes_batch(9, 0, 120);
  std::vector<std::int64_t> wrong_colour = data.prompts, wrong_shape = data.prompts;
  for (auto& p : wrong_colour) p = ((p / 3 + 1) % 4) * 3 + p % 3;
  for (auto& p : wrong_shape) p = (p / 3) * 3 + (p % 3 + 1) % 3;
  const auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (const double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  const double own = mean(shape_alignment{}(data.images, data.prompts));
  CHECK(own > 0.93);
  CHECK(mean(shape_alignment{}(data.images, wrong_colour)) < own - 0.4);
  CHECK(mean(shape_alignment{}(data.images, wrong_shape)) < own - 0.4);
}

TEST_CASE("shape_alignment: no object, NaN rows, custom prompt lists and bad input") {
  const torch::Tensor blank = torch::full({3, 16, 16}, 0.84);
  const torch::Tensor square = rectangle({0.15, 0.25, 0.95}, 4, 12, 4, 12);
  torch::Tensor images = torch::stack({blank, square, square});
  images[2][0][7][7] = not_a_number;
  const std::vector<double> r = shape_alignment{}(images, std::vector<std::int64_t>{7, 7, 7});
  CHECK(r[0] == 0.0);  // no pixel 0.25 away from the background
  CHECK(r[1] == Approx(1.0).margin(1e-6));
  CHECK(std::isnan(r[2]));

  const shape_alignment custom{.prompts = {"Blue SQUARE on grey"}};
  CHECK(custom(images.slice(0, 1, 2), zeros(1))[0] == Approx(1.0).margin(1e-6));
  CHECK_THROWS_WITH(custom(images, std::vector<std::int64_t>{0, 1, 0}),
                    "shape_alignment row 1 has prompt 1, the prompt list has 1");
  CHECK_THROWS_WITH((shape_alignment{.prompts = {"a dog"}}(images.slice(0, 0, 1), zeros(1))),
                    Contains("names no colour"));
  CHECK_THROWS_WITH((shape_alignment{.colour_weight = 1.5}(images, zeros(3))),
                    "shape_alignment colour_weight must be in [0, 1], got 1.5");
  CHECK_THROWS_WITH((shape_alignment{.fill_width = 0}(images, zeros(3))),
                    "shape_alignment fill_width must be positive, got 0");
}

// ---- Weighted sum --------------------------------------------------------------------------------------------

TEST_CASE("weighted_sum: total, components, NaN and validation") {
  const torch::Tensor images = torch::zeros({3, 3, 4, 4});
  const std::vector<std::int64_t> prompts = zeros(3);
  const auto constant = [](std::vector<double> values) {
    return [values](const torch::Tensor&, std::span<const std::int64_t>) { return values; };
  };
  weighted_sum total({{"a", 1.0, constant({1, 2, 3})}, {"b", 0.5, constant({10, not_a_number, 30})}});
  const std::vector<double> r = total(images, prompts);
  CHECK(r[0] == 6.0);  // 1 + 0.5 * 10
  CHECK(std::isnan(r[1]));
  CHECK(r[2] == 18.0);                             // 3 + 0.5 * 30
  CHECK(total.last_components().at("a") == 2.0);   // (1 + 2 + 3) / 3
  CHECK(total.last_components().at("b") == 20.0);  // (10 + 30) / 2, the NaN row left out
  CHECK((total.last_rows().at("a") == std::vector<double>{1, 2, 3}));
  CHECK(total.terms().size() == 2);

  // The doc example: alignment 1 plus 0.1 compressibility on the red square.
  const torch::Tensor square = rectangle({0.9, 0.1, 0.1}, 5, 11, 5, 11).unsqueeze(0);
  weighted_sum demo({{"align", 1.0, shape_alignment{}}, {"jpeg", 0.1, jpeg_compressibility{}}});
  const std::vector<std::int64_t> square_prompt = {1};
  const double jpeg = jpeg_compressibility{}(square, square_prompt)[0];
  CHECK(demo(square, square_prompt)[0] == Approx(1.0 + 0.1 * jpeg).margin(1e-6));
  CHECK(demo.last_components().at("jpeg") == jpeg);
  CHECK(demo.last_components().at("align") == Approx(1.0).margin(1e-6));

  weighted_sum all_nan({{"a", 1.0, constant({not_a_number, not_a_number, not_a_number})}});
  all_nan(images, prompts);
  CHECK(std::isnan(all_nan.last_components().at("a")));

  CHECK_THROWS_WITH(weighted_sum(std::vector<named_reward>{}), "weighted_sum needs at least one reward");
  CHECK_THROWS_WITH((weighted_sum({{"a", 1.0, constant({1})}, {"a", 2.0, constant({1})}})),
                    "weighted_sum reward name 'a' appears twice");
  CHECK_THROWS_WITH((weighted_sum({{"", 1.0, constant({1})}})), "weighted_sum reward 0 has no name");
  CHECK_THROWS_WITH((weighted_sum({{"a", not_a_number, constant({1})}})), "weighted_sum reward 'a' has weight nan");
  CHECK_THROWS_WITH((weighted_sum({{"a", 1.0, {}}})),
                    "weighted_sum reward 'a' needs exactly one scoring function (pointwise or groupwise)");
  weighted_sum short_output({{"a", 1.0, constant({1, 2})}});
  CHECK_THROWS_WITH(short_output(images, prompts), "weighted_sum reward 'a' returned 2 scores for 3 rows");
}

TEST_CASE("weighted_sum: its parts for per-reward advantages, and a groupwise win-rate term") {
  const torch::Tensor images = torch::zeros({4, 3, 4, 4});
  const std::vector<std::int64_t> prompts = zeros(4);
  const auto constant = [](std::vector<double> values) {
    return [values](const torch::Tensor&, std::span<const std::int64_t>) { return values; };
  };
  static_assert(GroupwiseReward<weighted_sum, torch_backend> && ComponentReward<weighted_sum>);
  // Two trees of 2 leaves; "wins" is the win rate of {0.2, 0.9 | 0.5, 0.5} within each tree: {0, 1 | 0.5, 0.5}.
  weighted_sum reward({{.name = "a", .weight = 1.0, .score = constant({1, 2, 3, 4})},
                       {.name = "wins",
                        .weight = 2.0,
                        .score_groups = win_rate<named_reward::pointwise>{.score = constant({0.2, 0.9, 0.5, 0.5})}}});
  const std::vector<std::uint32_t> keys = {0, 1};
  const leaf_groups groups{.leaves_per_tree = 2, .keys = keys};
  CHECK(reward(images, prompts, groups) == std::vector<double>{1, 4, 4, 5});
  REQUIRE(reward.last_component_rows().size() == 2);
  CHECK(reward.last_component_rows()[1].name == "wins");
  CHECK(reward.last_component_rows()[1].weight == 2.0);
  CHECK(reward.last_component_rows()[1].rows == std::vector<double>{0, 1, 0.5, 0.5});
  CHECK(reward.last_components().at("wins") == 0.5);
  CHECK_THROWS_WITH(reward(images, prompts),
                    "weighted_sum reward 'wins' is groupwise: it scores a leaf against its tree's, and this call gave "
                    "no groups");
  const std::vector<std::uint32_t> one = {0};
  CHECK_THROWS_WITH(reward(images, prompts, leaf_groups{.leaves_per_tree = 2, .keys = one}),
                    "weighted_sum: 4 rows in 1 groups of 2");
}

// ---- The shipped model -----------------------------------------------------------------------------------------

TEST_CASE("the shipped model loads and its ODE samples align with their prompts") {
  const shapes_model model = load_shapes_model(models_dir() / "shapes-tiny");
  CHECK(model.config == shapes_flux_config());
  CHECK(model.prompts == shapes_prompts());
  const prompt_embeddings words = shapes_word_embeddings(model.prompts, 32, 32);
  CHECK(torch::equal(model.embeddings.context, words.context));
  CHECK(torch::equal(model.embeddings.pooled, words.pooled));
  CHECK(model.metadata.contains("branchgrpo.pretrain"));
  const auto transformer = make_shapes_transformer(model);

  std::vector<std::int64_t> prompts;
  for (std::int64_t p = 0; p < 12; ++p)
    for (int s = 0; s < 4; ++s) prompts.push_back(p);
  const torch::Tensor samples = shapes_sample_ode(*transformer, model.embeddings, prompts, 0);
  REQUIRE(samples.sizes() == c10::IntArrayRef({48, 3, 16, 16}));
  REQUIRE(torch::isfinite(samples).all().item<bool>());
  CHECK(torch::equal(samples, shapes_sample_ode(*transformer, model.embeddings, prompts, 0)));  // deterministic
  double mean = 0;
  for (const double r : shape_alignment{}(samples, prompts)) mean += r / 48.0;
  // Measured 0.711 (docs/model.md); an untrained model scores below 0.15, a model trained 20 steps 0.12.
  CAPTURE(mean);
  CHECK(mean > 0.55);
  CHECK(mean < 0.97);  // room for alignment to improve

  CHECK_THROWS_WITH(load_shapes_model(scratch("no_such_model")),
                    (scratch("no_such_model") / "model.safetensors").string() + ": no such file");
  const auto dir = scratch("no_metadata");
  std::filesystem::create_directories(dir);
  save_safetensors(dir / "model.safetensors", model.weights);
  CHECK_THROWS_WITH(load_shapes_model(dir),
                    (dir / "model.safetensors").string() + ": no __metadata__ key 'branchgrpo.flux_config'");
}

TEST_CASE("model files: integer or NaN weights and both families' metadata are refused, naming the file",
          "[reliability][model_files]") {
  // The shipped model with one change each; `compare --model shapes` and `train` read model directories this way.
  const std::filesystem::path shipped = models_dir() / "shapes-tiny";
  const shapes_model model = load_shapes_model(shipped);
  const auto write_model = [&](const std::string& name, std::map<std::string, torch::Tensor> weights,
                               std::map<std::string, std::string> metadata) {
    const std::filesystem::path dir = scratch("model_files") / name;
    std::filesystem::create_directories(dir);
    save_safetensors(dir / "model.safetensors", weights, metadata);
    std::filesystem::copy_file(shipped / "prompts.safetensors", dir / "prompts.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    return dir;
  };
  std::map<std::string, torch::Tensor> integers = model.weights;
  integers["img_in.weight"] = integers["img_in.weight"].to(torch::kInt32);  // trained with gradient norm 0 before
  const auto i32 = write_model("i32", integers, model.metadata);
  CHECK(error_of([&] { load_shapes_model(i32); }) ==
        (i32 / "model.safetensors").string() +
            ": tensor 'img_in.weight' is I32: model weights must be F32, BF16, F16 or F8_E4M3");

  std::map<std::string, torch::Tensor> poisoned = model.weights;
  poisoned["img_in.weight"] = poisoned["img_in.weight"].clone();
  poisoned["img_in.weight"].view(-1)[5] = not_a_number;
  const auto nan = write_model("nan", poisoned, model.metadata);
  CHECK(error_of([&] { load_shapes_model(nan); }) ==
        (nan / "model.safetensors").string() + ": tensor 'img_in.weight' holds a non-finite value (nan) at element 5");

  std::map<std::string, std::string> both = model.metadata;
  both[std::string(wan_config_metadata_key)] = format_wan_config(moving_shapes_wan_config());
  const auto two = write_model("both", model.weights, both);
  const std::string refused = (two / "model.safetensors").string() +
                              ": __metadata__ holds both 'branchgrpo.flux_config' and 'branchgrpo.wan_config'; a "
                              "model file declares one family";
  CHECK(error_of([&] { load_shapes_model(two); }) == refused);
  CHECK(error_of([&] { is_video_model_dir(two); }) == refused);
  run_config config = parse_run_config("", "run.toml", models_dir().parent_path());
  config.model.dir = two.string();
  CHECK(error_of([&] { run_transformer_config(config); }) == refused);  // read before the run's memory is estimated
  config.model.dir = shipped.string();
  CHECK(std::holds_alternative<flux_config>(run_transformer_config(config)));
}

// ---- Run memory (app/run_memory.hpp) ---------------------------------------------------------------------------

TEST_CASE("run memory: the documented estimate and a one-line refusal naming the keys", "[reliability]") {
  run_config config = parse_run_config("", "run.toml", models_dir().parent_path());
  config.model.dir = (models_dir() / "shapes-tiny").string();
  const flux_config flux = run_flux_config(config);
  CHECK(flux == shapes_flux_config());
  CHECK(run_text_tokens(config) == 3);
  const run_memory_estimate e = estimate_run_memory(config, flux, 3);
  CHECK(e.nodes_per_tree == 219);
  CHECK(e.rollout == 2.0 * 219 * 768 * 4);  // the doc comment's example
  CHECK(byte_text(e.rollout) == "1.35 MB");
  CHECK_NOTHROW(check_run_memory(config, {.bytes = 1e9, .source = "test"}));

  // Sharded over N ranks, each rank's training state: the gradient in full, AdamW's two moments divided by N (full
  // fine-tuning in float32, no EMA: 3 times the weights' bytes alone, 1 + 2 / 4 = 1.5 times on 4 ranks).
  run_config full = config;
  full.lora.enabled = false;
  const double weights = estimate_run_memory(full, flux, 3).weights;
  CHECK(estimate_run_memory(full, flux, 3).training == 3 * weights);
  CHECK(estimate_run_memory(full, flux, 3, 4).training == 3 * weights);  // unsharded: every rank holds it all
  full.sharding.mode = sharding_mode::gradients;
  CHECK(estimate_run_memory(full, flux, 3, 1).training == 3 * weights);
  CHECK(estimate_run_memory(full, flux, 3, 4).training == 1.5 * weights);

  // The example: branching 4096 at two split steps is 2^24 leaves per tree for 19 steps, about 2 TB.
  config = parse_run_config("[topology]\nsplit_steps = [0, 1]\nbranching = [4096]\n", "run.toml");
  config.model.dir = (models_dir() / "shapes-tiny").string();
  const std::string message =
      error_of([&] { check_run_memory(config, {.bytes = 23.4e9, .source = "physical memory"}); });
  CHECK_THAT(message, Contains("run.toml: the run needs about 1.96 TB, over the memory budget of 23.4 GB (physical "
                               "memory): rollout latents 1.96 TB") &&
                          Contains("data.prompts_per_iteration = 2 trees of 318771201 nodes") &&
                          Contains("each [3, 16, 16] in model.dtype = float32"));
  CHECK(message.find('\n') == std::string::npos);

  // On a CUDA device: the device's parts against its free memory, the host buffers against the host's budget.
  config.model.device = "cuda:0";
  const memory_budget device{.bytes = 80e9, .source = "cudaMemGetInfo on cuda:0"};
  CHECK_THAT(error_of([&] { check_run_memory(config, {.bytes = 23.4e9, .source = "physical memory"}, device); }),
             Contains("run.toml: the run needs about 1.96 TB on cuda:0, over its 80 GB free (cudaMemGetInfo on "
                      "cuda:0): rollout latents 1.96 TB"));
  config = parse_run_config("", "run.toml");
  config.model.dir = (models_dir() / "shapes-tiny").string();
  config.model.device = "cuda:0";
  const run_memory_estimate small = estimate_run_memory(config, flux, 3);
  CHECK(small.decoded == 16 * 768 * 4);  // 16 decoded [3, 16, 16] images at a time (the latents are the pixels)
  CHECK_NOTHROW(check_run_memory(config, {.bytes = 1e6, .source = "test"}, device));  // host buffers fit in 1 MB
  CHECK_THAT(error_of([&] { check_run_memory(config, {.bytes = 1e3, .source = "test"}, device); }),
             Contains("run.toml: the run's host buffers need about ") &&
                 Contains(", over the memory budget of 1 kB (test): decoded samples 49.2 kB (rollout.decode_batch = "
                          "16 at a time), prompt rows "));
}
