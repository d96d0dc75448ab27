// The native FLUX autoencoder decoder (config, ae.safetensors names and shapes, agreement with the independent
// numpy reference tests/reference/ae_reference.py, safetensors round trip, key reports) and the TorchScript
// decoder / reward (modules scripted here from TorchScript source, saved, loaded back). Also syntax-checks
// scripts/export_prompt_embeddings.py.
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "branchgrpo/torch/backend.hpp"
#include "branchgrpo/torch/flux/autoencoder.hpp"
#include "branchgrpo/torch/flux/prompt_embeddings.hpp"
#include "branchgrpo/torch/safetensors.hpp"
#include "branchgrpo/torch/torchscript.hpp"
#include "branchgrpo/training/concepts.hpp"
#include "error_text.hpp"
#include "numpy_reference.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;
using branchgrpo::testing::source_root;

static_assert(Reward<torchscript_reward, torch_backend>);

namespace {

std::filesystem::path fresh_dir(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / ("branchgrpo_ae_" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// Random weights: conv weights and all biases N(0, 0.2^2), GroupNorm scales 1 + N(0, 0.2^2).
void randomize(flux_autoencoder& model, std::uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const bool norm_scale =
        item.value().dim() == 1 && item.key().find("norm") != std::string::npos && item.key().ends_with(".weight");
    item.value().copy_(torch::randn(item.value().sizes()) * 0.2 + (norm_scale ? 1.0 : 0.0));
  }
}

torch::Tensor decode(flux_autoencoder& model, const torch::Tensor& latents) {
  torch::NoGradGuard no_grad;
  return model.decode(latents);
}

/// Runs ae_reference.py on the model's weights and `latents`; returns its output as a float64 tensor.
torch::Tensor numpy_reference(flux_autoencoder& model, const torch::Tensor& latents, std::vector<std::int64_t> shape) {
  const flux_autoencoder_config& c = model.config();
  std::ostringstream config;
  config << "z_channels " << c.z_channels << "\nch " << c.ch << "\nch_mult";
  for (auto m : c.ch_mult) config << " " << m;
  config << "\nnum_res_blocks " << c.num_res_blocks << "\nout_ch " << c.out_ch << "\ngroups " << c.groups << "\neps "
         << c.eps << "\nscale_factor " << c.scale_factor << "\nshift_factor " << c.shift_factor << "\n";
  std::map<std::string, torch::Tensor> tensors = flux_autoencoder_state(model);
  tensors["input.latents"] = latents;
  return testing::run_numpy_reference("ae_reference.py", "ae", config.str(), tensors, shape);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

std::vector<std::int64_t> find_shape(const std::vector<flux_tensor_spec>& specs, const std::string& name) {
  for (const auto& spec : specs)
    if (spec.name == name) return spec.shape;
  return {};
}

}  // namespace

TEST_CASE("flux_autoencoder_config presets and validation") {
  const auto dev = flux_autoencoder_config::dev();
  CHECK(dev.z_channels == 16);
  CHECK(dev.ch == 128);
  CHECK(dev.ch_mult == std::vector<std::int64_t>{1, 2, 4, 4});
  CHECK(dev.num_res_blocks == 2);
  CHECK(dev.groups == 32);
  CHECK(dev.scale_factor == 0.3611);
  CHECK(dev.shift_factor == 0.1159);
  CHECK(dev.upscale() == 8);
  CHECK(flux_autoencoder_config::tiny().upscale() == 2);
  CHECK_NOTHROW(validate(dev));
  CHECK_NOTHROW(validate(flux_autoencoder_config::tiny()));
  auto bad = flux_autoencoder_config::tiny();
  bad.groups = 12;
  CHECK(error_of([&] { validate(bad); }) == "flux_autoencoder_config: groups 12 do not divide level 0's width 32");
  CHECK(error_of([] { validate(flux_autoencoder_config{.ch_mult = {}}); }) ==
        "flux_autoencoder_config: ch_mult needs 1 to 8 levels, got 0");
  CHECK(error_of([] { validate(flux_autoencoder_config{.scale_factor = 0}); }) ==
        "flux_autoencoder_config: scale_factor 0 must be finite and non-zero");
  CHECK(error_of([] {
          flux_autoencoder model(flux_autoencoder_config{.ch_mult = {1, -2}});
        }) == "flux_autoencoder_config: ch_mult[1] -2 must be positive");
}

TEST_CASE("ae.safetensors decoder names and shapes") {
  const auto dev = flux_decoder_expected_tensors(flux_autoencoder_config::dev());
  // conv_in 2 + mid (2 x 8 + attention 10) 26 + up 4 levels x 3 blocks x 8 = 96 + 2 shortcuts x 2 + 3 upsample
  // convs x 2 + norm_out 2 + conv_out 2 = 138.
  CHECK(dev.size() == 138);
  CHECK(dev.front() == flux_tensor_spec{"decoder.conv_in.weight", {512, 16, 3, 3}});
  CHECK(dev.back() == flux_tensor_spec{"decoder.conv_out.bias", {3}});
  CHECK(find_shape(dev, "decoder.mid.attn_1.q.weight") == std::vector<std::int64_t>{512, 512, 1, 1});
  CHECK(find_shape(dev, "decoder.mid.attn_1.norm.bias") == std::vector<std::int64_t>{512});
  CHECK(find_shape(dev, "decoder.up.3.block.2.conv2.weight") == std::vector<std::int64_t>{512, 512, 3, 3});
  CHECK(find_shape(dev, "decoder.up.3.upsample.conv.weight") == std::vector<std::int64_t>{512, 512, 3, 3});
  CHECK(find_shape(dev, "decoder.up.1.block.0.nin_shortcut.weight") == std::vector<std::int64_t>{256, 512, 1, 1});
  CHECK(find_shape(dev, "decoder.up.1.block.0.norm1.weight") == std::vector<std::int64_t>{512});
  CHECK(find_shape(dev, "decoder.up.0.block.0.nin_shortcut.weight") == std::vector<std::int64_t>{128, 256, 1, 1});
  CHECK(find_shape(dev, "decoder.up.0.block.2.conv1.weight") == std::vector<std::int64_t>{128, 128, 3, 3});
  CHECK(find_shape(dev, "decoder.norm_out.weight") == std::vector<std::int64_t>{128});
  CHECK(find_shape(dev, "decoder.conv_out.weight") == std::vector<std::int64_t>{3, 128, 3, 3});
  CHECK(find_shape(dev, "decoder.up.0.upsample.conv.weight").empty());         // the highest level does not upsample
  CHECK(find_shape(dev, "decoder.up.2.block.0.nin_shortcut.weight").empty());  // 512 -> 512

  // The module's parameters are exactly the expected list (names and shapes), for the tiny config.
  flux_autoencoder model(flux_autoencoder_config::tiny());
  std::map<std::string, std::vector<std::int64_t>> expected, actual;
  for (const auto& spec : flux_decoder_expected_tensors(model.config())) expected[spec.name] = spec.shape;
  for (const auto& item : model.named_parameters()) actual[item.key()] = item.value().sizes().vec();
  CHECK(actual == expected);
  // tiny: conv_in 2 + mid 26 + up.1 (2 blocks x 8) + upsample 2 + up.0 (2 x 8 + shortcut 2) + 4 = 68.
  CHECK(expected.size() == 68);

  // The documented report example: encoder.* names are skipped, other extras are unexpected.
  std::map<std::string, std::vector<std::int64_t>> shapes = expected;
  shapes.erase("decoder.conv_in.bias");
  shapes["encoder.conv_in.weight"] = {32, 3, 3, 3};
  shapes["extra"] = {1};
  const flux_key_report report = check_flux_decoder_tensors(model.config(), shapes);
  CHECK(report.missing == std::vector<std::string>{"decoder.conv_in.bias"});
  CHECK(report.unexpected == std::vector<std::string>{"extra"});
  CHECK(report.mismatched.empty());
}

TEST_CASE("flux_autoencoder decode: shapes, clamp, unit images") {
  flux_autoencoder model(flux_autoencoder_config::tiny());
  randomize(model, 1);
  torch::manual_seed(2);
  const torch::Tensor latents = torch::randn({2, 4, 4, 6});
  const torch::Tensor images = decode(model, latents);
  CHECK(images.sizes() == torch::IntArrayRef({2, 3, 8, 12}));
  torch::NoGradGuard no_grad;
  const torch::Tensor clamped = model.decode(latents, /*clamp=*/true);
  CHECK(clamped.min().item<double>() >= -1.0);
  CHECK(clamped.max().item<double>() <= 1.0);
  CHECK(torch::equal(clamped, images.clamp(-1, 1)));
  CHECK(torch::allclose(model.decode_images(latents), (images.clamp(-1, 1) + 1) / 2));
  // The documented unit_images example; NaN propagates.
  const torch::Tensor unit = unit_images(torch::tensor({-2.0, -1.0, 0.0, 0.5, 3.0}, torch::kFloat64));
  CHECK(torch::equal(unit, torch::tensor({0.0, 0.0, 0.5, 0.75, 1.0}, torch::kFloat64)));
  CHECK(std::isnan(unit_images(torch::tensor({std::nan("")})).item<double>()));
  CHECK(error_of([&] {
          model.decode(torch::zeros({1, 3, 4, 4}));
        }) == "flux_autoencoder::decode expects latents [B, 4, h, w], got [1, 3, 4, 4]");
}

TEST_CASE("flux_autoencoder decode agrees with the numpy reference") {
  SECTION("tiny config (shortcut, upsample, non-square)") {
    flux_autoencoder model(flux_autoencoder_config::tiny());
    randomize(model, 3);
    torch::manual_seed(4);
    const torch::Tensor latents = torch::randn({2, 4, 4, 6});
    const torch::Tensor ours = decode(model, latents);
    const torch::Tensor reference = numpy_reference(model, latents, {2, 3, 8, 12});
    CHECK(ours.abs().max().item<double>() > 0.1);  // not a degenerate all-zero comparison
    CHECK(max_abs_diff(ours, reference) < 1e-4);
  }
  SECTION("three levels, two blocks, 16 latent channels, other latent normalization") {
    const flux_autoencoder_config config{.z_channels = 16,
                                         .ch = 16,
                                         .ch_mult = {1, 2, 2},
                                         .num_res_blocks = 2,
                                         .groups = 4,
                                         .scale_factor = 0.5,
                                         .shift_factor = -0.25};
    flux_autoencoder model(config);
    randomize(model, 5);
    torch::manual_seed(6);
    const torch::Tensor latents = torch::randn({1, 16, 3, 2});
    const torch::Tensor ours = decode(model, latents);
    CHECK(ours.sizes() == torch::IntArrayRef({1, 3, 12, 8}));
    CHECK(max_abs_diff(ours, numpy_reference(model, latents, {1, 3, 12, 8})) < 1e-4);
  }
}

TEST_CASE("flux_autoencoder weights: safetensors round trip and key reports") {
  const auto dir = fresh_dir("weights");
  flux_autoencoder model(flux_autoencoder_config::tiny());
  randomize(model, 7);
  torch::manual_seed(8);
  const torch::Tensor latents = torch::randn({2, 4, 3, 3});
  const torch::Tensor before = decode(model, latents);

  // A full ae file: the decoder's tensors plus encoder ones (ignored on load).
  std::map<std::string, torch::Tensor> file = flux_autoencoder_state(model);
  file["encoder.conv_in.weight"] = torch::zeros({32, 3, 3, 3});
  file["encoder.mid.attn_1.q.bias"] = torch::zeros({64});
  save_safetensors(dir / "ae.safetensors", file);

  flux_autoencoder loaded(flux_autoencoder_config::tiny());
  load_flux_autoencoder_weights(loaded, dir / "ae.safetensors");
  CHECK(torch::equal(decode(loaded, latents), before));

  // A float64 file converts into the float32 model.
  std::map<std::string, torch::Tensor> doubles;
  for (const auto& [name, tensor] : flux_autoencoder_state(model)) doubles[name] = tensor.to(torch::kFloat64);
  flux_autoencoder from_doubles(flux_autoencoder_config::tiny());
  load_flux_autoencoder_weights(from_doubles, doubles);
  CHECK(torch::equal(decode(from_doubles, latents), before));

  // Missing, unexpected and mismatched names in one line.
  std::map<std::string, torch::Tensor> broken = flux_autoencoder_state(model);
  broken.erase("decoder.conv_in.bias");
  broken["extra"] = torch::zeros({1});
  broken["decoder.conv_out.weight"] = torch::zeros({3, 32, 1, 1});
  flux_autoencoder target(flux_autoencoder_config::tiny());
  CHECK(error_of([&] { load_flux_autoencoder_weights(target, broken); }) ==
        "FLUX autoencoder weights do not match the config: missing decoder.conv_in.bias, unexpected extra, "
        "shape mismatch decoder.conv_out.weight [3, 32, 1, 1] (expected [3, 32, 3, 3])");
  save_safetensors(dir / "broken.safetensors", broken);
  CHECK(error_of([&] { load_flux_autoencoder_weights(target, dir / "broken.safetensors"); }) ==
        (dir / "broken.safetensors").string() +
            ": FLUX autoencoder weights do not match the config: missing decoder.conv_in.bias, unexpected extra, "
            "shape mismatch decoder.conv_out.weight [3, 32, 1, 1] (expected [3, 32, 3, 3])");
  // A dev checkpoint into the tiny model: the list is cut after 10 problems with a count.
  std::map<std::string, std::vector<std::int64_t>> dev_shapes;
  for (const auto& spec : flux_decoder_expected_tensors(flux_autoencoder_config::dev()))
    dev_shapes[spec.name] = spec.shape;
  const flux_key_report report = check_flux_decoder_tensors(flux_autoencoder_config::tiny(), dev_shapes);
  CHECK(report.unexpected.size() == 138 - 68);  // the dev checkpoint's extra blocks and levels
  CHECK(report.message().find("... and ") != std::string::npos);
  std::filesystem::remove_all(dir);
}

namespace {

/// A scripted reward: weighted channel means (weights 1, 2, 3) plus the prompt index.
torch::jit::Module scripted_reward() {
  torch::jit::Module module("test_reward");
  module.register_buffer("weights", torch::tensor({1.0F, 2.0F, 3.0F}));
  module.define(R"(
def forward(self, images: Tensor, prompts: Tensor) -> Tensor:
    means = images.mean(dim=[2, 3])
    return (means * self.weights).sum(dim=1) + prompts.to(images.dtype)
)");
  return module;
}

/// A scripted decoder: tanh of the first three channels, upsampled 2x by repetition.
torch::jit::Module scripted_decoder() {
  torch::jit::Module module("test_decoder");
  module.define(R"(
def forward(self, z: Tensor) -> Tensor:
    x = torch.tanh(z[:, 0:3])
    return x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
)");
  return module;
}

}  // namespace

TEST_CASE("TorchScript reward: save, load, score, NaN rows, chunks, errors") {
  const auto dir = fresh_dir("torchscript_reward");
  const auto path = dir / "reward.pt";
  scripted_reward().save(path.string());
  torchscript_reward reward = load_torchscript_reward(path);

  // The documented example: a grey 0.5 image with prompt 2 scores 0.5 * (1 + 2 + 3) + 2 = 5; the same image
  // with one NaN pixel scores NaN. Row 1: channel values 0.1, 0.2, 0.3 -> 0.1 + 0.4 + 0.9 + 0 = 1.4.
  torch::Tensor images = torch::full({3, 3, 4, 4}, 0.5);
  images[1][0].fill_(0.1);
  images[1][1].fill_(0.2);
  images[1][2].fill_(0.3);
  images[2][1][2][3] = std::nan("");
  const std::vector<std::int64_t> prompts = {2, 0, 2};
  const std::vector<double> scores = reward(images, prompts);
  REQUIRE(scores.size() == 3);
  CHECK(scores[0] == Approx(5.0).margin(1e-6));
  CHECK(scores[1] == Approx(1.4).margin(1e-6));
  CHECK(std::isnan(scores[2]));

  // Chunked calls give the same scores.
  reward.batch = 2;
  const std::vector<double> chunked = reward(images, prompts);
  CHECK(chunked[0] == scores[0]);
  CHECK(chunked[1] == scores[1]);
  CHECK(std::isnan(chunked[2]));

  // Composed with the native decoder: leaves are latents, the reward sees decode_images(leaves).
  auto ae = std::make_shared<flux_autoencoder>(flux_autoencoder_config::tiny());
  randomize(*ae, 9);
  reward.decode = [ae](const torch::Tensor& z) { return ae->decode_images(z); };
  torch::manual_seed(10);
  torch::Tensor leaves = torch::randn({2, 4, 2, 2});
  const std::vector<double> decoded = reward(leaves, std::vector<std::int64_t>{0, 1});
  torch::Tensor expected_images;
  {
    torch::NoGradGuard no_grad;
    expected_images = ae->decode_images(leaves);
  }
  const torch::Tensor means = expected_images.mean({2, 3});
  for (std::int64_t r = 0; r < 2; ++r) {
    const double want = means[r][0].item<double>() + 2 * means[r][1].item<double>() + 3 * means[r][2].item<double>() +
                        static_cast<double>(r);
    CHECK(decoded[static_cast<std::size_t>(r)] == Approx(want).margin(1e-5));
  }
  leaves[1][0][0][0] = std::nan("");  // a NaN latent decodes to a NaN image: that leaf's score is NaN
  const std::vector<double> with_nan = reward(leaves, std::vector<std::int64_t>{0, 1});
  CHECK(with_nan[0] == Approx(decoded[0]).margin(1e-6));
  CHECK(std::isnan(with_nan[1]));

  // Errors are one line naming the file.
  reward.decode = {};
  const std::string name = path.string();
  CHECK(error_of([&] {
          reward(images, std::vector<std::int64_t>{0, 1});
        }) == "torchscript_reward '" + name + "': 2 prompts for 3 leaves");
  CHECK(error_of([&] {
          reward(images, std::vector<std::int64_t>{0, -1, 0});
        }) == "torchscript_reward '" + name + "': prompt index -1 at row 1 is negative");
  CHECK(error_of([&] {
          reward(torch::zeros({2, 1, 4, 4}), std::vector<std::int64_t>{0, 0});
        }) == "torchscript_reward '" + name + "': images must be [2, 3, H, W], got [2, 1, 4, 4]");
  reward.batch = 0;
  CHECK(error_of([&] { reward(images, prompts); }) == "torchscript_reward: batch 0 must be at least 1");

  // A module returning the wrong thing.
  torch::jit::Module wrong_count("wrong_count");
  wrong_count.define(R"(
def forward(self, images: Tensor, prompts: Tensor) -> Tensor:
    return images.mean()
)");
  wrong_count.save((dir / "wrong_count.pt").string());
  torchscript_reward bad = load_torchscript_reward(dir / "wrong_count.pt");
  CHECK(error_of([&] { bad(images, prompts); }) ==
        "TorchScript reward '" + (dir / "wrong_count.pt").string() + "' returned [] for 3 images (expected [3])");
  torch::jit::Module tuple("returns_tuple");
  tuple.define(R"(
def forward(self, images: Tensor, prompts: Tensor) -> Tuple[Tensor, Tensor]:
    return images, prompts
)");
  tuple.save((dir / "tuple.pt").string());
  torchscript_reward tuple_reward = load_torchscript_reward(dir / "tuple.pt");
  CHECK(error_of([&] { tuple_reward(images, prompts); }) ==
        "TorchScript reward '" + (dir / "tuple.pt").string() + "' returned a Tuple instead of a tensor");
  torch::jit::Module throws("throws");
  throws.define(R"(
def forward(self, images: Tensor, prompts: Tensor) -> Tensor:
    return images.view(7)
)");
  throws.save((dir / "throws.pt").string());
  torchscript_reward throwing = load_torchscript_reward(dir / "throws.pt");
  const std::string thrown = error_of([&] { throwing(images, prompts); });
  CHECK(thrown == "TorchScript reward '" + (dir / "throws.pt").string() +
                      "' failed: RuntimeError: shape '[7]' is invalid for input of size 144");
  torch::jit::Module one_input("one_input");
  one_input.define(R"(
def forward(self, images: Tensor) -> Tensor:
    return images.mean(dim=[1, 2, 3])
)");
  one_input.save((dir / "one_input.pt").string());
  torchscript_reward one_input_reward = load_torchscript_reward(dir / "one_input.pt");
  // LibTorch's wording (1.13: "Expected at most 2 argument(s) for operator 'forward', but received 3
  // argument(s). Declaration: ...") varies between versions: check the prefix and the single line.
  const std::string arity = error_of([&] { one_input_reward(images, prompts); });
  CHECK(arity.starts_with("TorchScript reward '" + (dir / "one_input.pt").string() + "' failed: "));
  CHECK(arity.find("argument") != std::string::npos);
  CHECK(arity.find('\n') == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("TorchScript reward: the embedded prompt list is checked against the run's") {
  const auto dir = fresh_dir("torchscript_prompts");
  torch::jit::Module listed = scripted_reward();
  c10::impl::GenericList exported(c10::StringType::get());
  exported.push_back("a cat");
  exported.push_back("a dog");
  listed.register_attribute(torchscript_prompts_attribute, c10::ListType::ofStrings(), exported);
  listed.save((dir / "listed.pt").string());
  const torchscript_reward reward = load_torchscript_reward(dir / "listed.pt");
  const std::string name = (dir / "listed.pt").string();
  REQUIRE(torchscript_prompts(reward.module, reward.path) == std::vector<std::string>{"a cat", "a dog"});

  std::ostringstream log;
  const std::vector<std::string> same = {"a cat", "a dog"};
  check_torchscript_prompts(reward.module, reward.path, same, "p.safetensors", log);
  CHECK(log.str().empty());
  const std::vector<std::string> changed = {"a cat", "a bird"};
  CHECK(error_of([&] { check_torchscript_prompts(reward.module, reward.path, changed, "p.safetensors", log); }) ==
        "TorchScript reward '" + name +
            "' was exported for another prompt list than p.safetensors: prompt 1 is 'a dog' there, 'a bird' here (2 "
            "prompts there, 2 here); re-export it with scripts/export_reward.py --prompts p.safetensors");
  const std::vector<std::string> longer = {"a cat", "a dog", "a cow"};
  CHECK(error_of([&] { check_torchscript_prompts(reward.module, reward.path, longer, "p/", log); }) ==
        "TorchScript reward '" + name +
            "' was exported for another prompt list than p/: the first 2 prompts are the same (2 prompts there, 3 "
            "here); re-export it with scripts/export_reward.py --prompts p/");

  // A module without the list (exported by hand): accepted, with one warning line.
  scripted_reward().save((dir / "unlisted.pt").string());
  const torchscript_reward unlisted = load_torchscript_reward(dir / "unlisted.pt");
  CHECK_FALSE(torchscript_prompts(unlisted.module, unlisted.path).has_value());
  check_torchscript_prompts(unlisted.module, unlisted.path, changed, "p.safetensors", log);
  CHECK(log.str().starts_with("warning: TorchScript reward '" + (dir / "unlisted.pt").string() +
                              "' holds no prompt list"));
  CHECK(log.str().find('\n') == log.str().size() - 1);

  // An attribute of that name that is not a list of strings.
  torch::jit::Module odd = scripted_reward();
  odd.register_attribute(torchscript_prompts_attribute, c10::IntType::get(), 3);
  odd.save((dir / "odd.pt").string());
  const torchscript_reward odd_reward = load_torchscript_reward(dir / "odd.pt");
  CHECK(error_of([&] { torchscript_prompts(odd_reward.module, odd_reward.path); }) ==
        "TorchScript reward '" + (dir / "odd.pt").string() +
            "': attribute training_prompts is a Int, not a list of prompts");
  std::filesystem::remove_all(dir);
}

// scripts/export_reward.py's modules against their Python scores: run by ctest as test_export_reward_cpp after
// tests/reference/test_export_reward.py has written, into $BRANCHGRPO_EXPORTED_REWARDS, prompts.safetensors (the
// run's prompt file) and per model NAME.pt with NAME.check.safetensors (images, prompt ids, the Python scores).
TEST_CASE("Exported reward modules score as in Python", "[.exported_reward]") {
  const char* root = std::getenv("BRANCHGRPO_EXPORTED_REWARDS");
  REQUIRE(root != nullptr);
  const std::filesystem::path dir(root);
  const std::vector<std::string> prompts = open_prompt_dataset(dir / "prompts.safetensors").prompts;
  std::vector<std::string> other = prompts;
  other.back() += " (edited)";
  int modules = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pt") continue;
    ++modules;
    const std::string stem = entry.path().stem().string();
    INFO(stem);
    torchscript_reward reward = load_torchscript_reward(entry.path());
    std::ostringstream log;
    check_torchscript_prompts(reward.module, reward.path, prompts, "prompts.safetensors", log);
    CHECK(log.str().empty());
    CHECK(error_of([&] {
            check_torchscript_prompts(reward.module, reward.path, other, "prompts.safetensors");
          }).find("prompt " + std::to_string(prompts.size() - 1) + " is '" + prompts.back() + "' there") !=
          std::string::npos);
    const auto check = load_safetensors(dir / (stem + ".check.safetensors"));
    const torch::Tensor ids = check.at("prompts").to(torch::kInt64).contiguous();
    const std::vector<std::int64_t> prompt_ids(ids.data_ptr<std::int64_t>(),
                                               ids.data_ptr<std::int64_t>() + ids.numel());
    reward.batch = 3;  // chunks: the module sees batches of another size than at export
    const std::vector<double> scores = reward(check.at("images"), prompt_ids);
    const torch::Tensor expected = check.at("scores").to(torch::kFloat64);
    REQUIRE(scores.size() == static_cast<std::size_t>(expected.numel()));
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const double want = expected[static_cast<std::int64_t>(i)].item<double>();
      CHECK(scores[i] == Approx(want).epsilon(1e-5).margin(1e-6));
    }
  }
  CHECK(modules >= 2);
}

TEST_CASE("TorchScript decoder and loading errors") {
  const auto dir = fresh_dir("torchscript_decoder");
  const auto path = dir / "decoder.pt";
  scripted_decoder().save(path.string());
  torchscript_decoder decoder = load_torchscript_decoder(path);
  torch::manual_seed(11);
  const torch::Tensor z = torch::randn({2, 4, 3, 5});
  const torch::Tensor images = decoder(z);
  CHECK(images.sizes() == torch::IntArrayRef({2, 3, 6, 10}));
  CHECK(torch::allclose(images.index({torch::indexing::Slice(), torch::indexing::Slice(), 4, 7}),
                        torch::tanh(z.index({torch::indexing::Slice(), torch::indexing::Slice(0, 3), 2, 3}))));

  // Composed into a reward: decoder output in [-1, 1] -> unit images -> scores.
  scripted_reward().save((dir / "reward.pt").string());
  torchscript_reward reward = load_torchscript_reward(
      dir / "reward.pt", [&decoder](const torch::Tensor& leaves) { return unit_images(decoder(leaves)); });
  const std::vector<double> scores = reward(torch::zeros({1, 4, 2, 2}), std::vector<std::int64_t>{3});
  CHECK(scores[0] == Approx(0.5 * 6 + 3).margin(1e-6));  // tanh(0) = 0 -> 0.5 everywhere

  // A decoder returning a wrong batch.
  torch::jit::Module wrong("wrong_decoder");
  wrong.define(R"(
def forward(self, z: Tensor) -> Tensor:
    return z[0:1]
)");
  wrong.save((dir / "wrong.pt").string());
  torchscript_decoder bad = load_torchscript_decoder(dir / "wrong.pt");
  CHECK(error_of([&] { bad(z); }) == "TorchScript decoder '" + (dir / "wrong.pt").string() +
                                         "' returned [1, 4, 3, 5] for 2 rows (expected [B, C, H, W])");

  // Files that are missing or not TorchScript.
  CHECK(error_of([&] { load_torchscript(dir / "missing.pt"); }) ==
        (dir / "missing.pt").string() + ": cannot open the TorchScript file: No such file or directory");
  std::ofstream(dir / "garbage.pt") << "not a zip archive";
  const std::string garbage = error_of([&] { load_torchscript(dir / "garbage.pt"); });
  // 1.13: "...': PytorchStreamReader failed reading zip archive: not a ZIP archive" (wording varies by version).
  CHECK(garbage.starts_with("cannot load TorchScript file '" + (dir / "garbage.pt").string() +
                            "': PytorchStreamReader failed reading zip archive"));
  CHECK(garbage.find('\n') == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("scripts/export_prompt_embeddings.py is valid Python") {
  const auto script = source_root() / "scripts" / "export_prompt_embeddings.py";
  REQUIRE(std::filesystem::exists(script));
  const auto dir = fresh_dir("py_compile");
  const std::string command =
      "python3 -c \"import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], "
      "doraise=True)\" " +
      script.string() + " " + (dir / "out.pyc").string();
  CHECK(std::system(command.c_str()) == 0);
  std::filesystem::remove_all(dir);
}
