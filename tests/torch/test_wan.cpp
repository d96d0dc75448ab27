// The native Wan2.1 T2V transformer: config, both weight layouts, RoPE split, forward shapes, agreement with the
// independent numpy reference (tests/reference/wan_reference.py), checkpoint loading, LoRA, gradient
// checkpointing.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "branchgrpo/model_specs/wan/config.hpp"
#include "branchgrpo/model_specs/wan/layout.hpp"
#include "branchgrpo/torch/lora.hpp"
#include "branchgrpo/torch/wan/transformer.hpp"
#include "error_text.hpp"
#include "numpy_reference.hpp"

// Debian's LibTorch 1.13 pulls in glog, whose CHECK macro would replace Catch's: drop it before Catch.
#undef CHECK
#include <catch2/catch.hpp>

using namespace branchgrpo;
using branchgrpo::testing::error_of;

namespace {

/// Random weights that all matter: linear weights and biases N(0, 0.2^2); norm weights 1 + N(0, 0.2^2) and
/// norm3's bias N(0, 0.2^2); modulation tables N(0, 0.5^2) (far from identity: scales and gates of order 1).
void randomize(wan_transformer& model, std::uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const bool norm_weight = name.find("norm") != std::string::npos && name.ends_with(".weight");
    const double spread = name.ends_with("modulation") ? 0.5 : 0.2;
    item.value().copy_(torch::randn(item.value().sizes()) * spread + (norm_weight ? 1.0 : 0.0));
  }
}

struct case_inputs {
  torch::Tensor x, t, text;
};

case_inputs make_inputs(const wan_config& c, std::int64_t b, std::int64_t f, std::int64_t h, std::int64_t w,
                        std::int64_t l, std::uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({b, c.in_dim, f, h, w}), torch::rand({b}) * 1000, torch::randn({b, l, c.text_dim})};
}

torch::Tensor run(wan_transformer& model, const case_inputs& in) {
  torch::NoGradGuard no_grad;
  return model.forward(in.x, in.t, in.text);
}

/// Runs wan_reference.py on the model's weights and `in`; returns its output as a float64 tensor.
torch::Tensor numpy_reference(wan_transformer& model, const case_inputs& in, const std::string& tag) {
  const wan_config& c = model.config();
  std::ostringstream config;
  config << "dim " << c.dim << "\nheads " << c.heads << "\nlayers " << c.layers << "\nfreq_dim " << c.freq_dim
         << "\ntext_len " << c.text_len << "\nout_dim " << c.out_dim << "\npatch " << c.patch[0] << " " << c.patch[1]
         << " " << c.patch[2] << "\neps " << c.eps << "\ntheta " << c.rope_theta << "\n";
  std::map<std::string, torch::Tensor> tensors = wan_state(model);
  tensors["input.x"] = in.x;
  tensors["input.t"] = in.t;
  tensors["input.text"] = in.text;
  std::vector<std::int64_t> shape = in.x.sizes().vec();
  shape[1] = c.out_dim;
  return testing::run_numpy_reference("wan_reference.py", "wan_" + tag, config.str(), tensors, shape);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

std::vector<std::int64_t> shape_of(const std::vector<wan_tensor_spec>& specs, const std::string& name) {
  for (const auto& spec : specs)
    if (spec.name == name) return spec.shape;
  return {};
}

}  // namespace

TEST_CASE("wan_config presets, the RoPE split and validation") {
  const wan_config small = wan_config::t2v_1_3b();
  CHECK(small.head_dim() == 128);
  CHECK(small.rope_axes() == std::array<std::int64_t, 3>{44, 42, 42});  // official: d - 4 (d // 6), 2 (d // 6) x 2
  CHECK(small.patch_volume() == 4);
  CHECK(small.ffn_dim == 8960);
  CHECK(small.layers == 30);
  const wan_config large = wan_config::t2v_14b();
  CHECK(large.dim == 5120);
  CHECK(large.heads == 40);
  CHECK(large.layers == 40);
  CHECK(large.ffn_dim == 13824);
  CHECK(large.head_dim() == 128);
  const wan_config tiny = wan_config::tiny();
  CHECK(tiny.head_dim() == 20);
  CHECK(tiny.rope_axes() == std::array<std::int64_t, 3>{8, 6, 6});  // uneven, as the real 44 / 42 / 42
  CHECK(tiny.in_dim != tiny.out_dim);
  CHECK_NOTHROW(validate(small));
  CHECK_NOTHROW(validate(large));
  CHECK_NOTHROW(validate(tiny));
  CHECK(error_of([] { validate(wan_config{.heads = 7}); }) == "wan_config: dim 1536 is not divisible by heads 7");
  CHECK(error_of([] { validate(wan_config{.layers = 100000000}); }) ==
        "wan_config: layers 100000000 exceeds the limit 1024");
  CHECK(error_of([] { validate(wan_config{.ffn_dim = 0}); }) == "wan_config: ffn_dim 0 must be positive");
  CHECK(error_of([] { validate(wan_config{.dim = 12, .heads = 4}); }) ==
        "wan_config: head dim 3 must be even and at least 6 (three RoPE axes of whole pairs)");
  CHECK(error_of([] { validate(wan_config{.freq_dim = 255}); }) ==
        "wan_config: freq_dim 255 must be even (cos and sin halves)");
  CHECK(error_of([] {
          validate(wan_config{.patch = {1, 0, 2}});
        }) == "wan_config: patch side 1 is 0, expected 1 to 16");
  CHECK(error_of([] { validate(wan_config{.eps = -1}); }) == "wan_config: eps -1 must be finite and positive");
  CHECK(error_of([] { validate(wan_config{.rope_theta = 1}); }) ==
        "wan_config: rope_theta 1 must be finite and above 1");
}

TEST_CASE("wan layouts: expected tensors, detection, key report, diffusers mapping") {
  // 12 embedding tensors + 27 per block + 3 in the head, in either layout.
  CHECK(wan_expected_tensors(wan_config::t2v_1_3b(), wan_layout::official).size() == 12 + 30 * 27 + 3);
  CHECK(wan_expected_tensors(wan_config::t2v_14b(), wan_layout::diffusers).size() == 12 + 40 * 27 + 3);

  const wan_config tiny = wan_config::tiny();
  const auto official = wan_expected_tensors(tiny, wan_layout::official);
  const auto diffusers = wan_expected_tensors(tiny, wan_layout::diffusers);
  using shape = std::vector<std::int64_t>;
  CHECK(official.front() == wan_tensor_spec{"patch_embedding.weight", {40, 4, 1, 2, 2}});
  CHECK(shape_of(official, "text_embedding.0.weight") == shape{40, 24});
  CHECK(shape_of(official, "time_embedding.0.weight") == shape{40, 32});
  CHECK(shape_of(official, "time_projection.1.weight") == shape{240, 40});
  CHECK(shape_of(official, "blocks.1.self_attn.norm_q.weight") == shape{40});  // over the whole dim
  CHECK(shape_of(official, "blocks.0.cross_attn.o.bias") == shape{40});
  CHECK(shape_of(official, "blocks.0.norm3.bias") == shape{40});
  CHECK(shape_of(official, "blocks.0.ffn.0.weight") == shape{56, 40});
  CHECK(shape_of(official, "blocks.1.ffn.2.weight") == shape{40, 56});
  CHECK(shape_of(official, "blocks.1.modulation") == shape{1, 6, 40});
  CHECK(shape_of(official, "head.head.weight") == shape{12, 40});
  CHECK(shape_of(official, "head.modulation") == shape{1, 2, 40});
  CHECK(shape_of(diffusers, "condition_embedder.time_proj.weight") == shape{240, 40});
  CHECK(shape_of(diffusers, "condition_embedder.text_embedder.linear_1.weight") == shape{40, 24});
  CHECK(shape_of(diffusers, "blocks.0.attn1.to_out.0.weight") == shape{40, 40});
  CHECK(shape_of(diffusers, "blocks.0.attn2.norm_k.weight") == shape{40});
  CHECK(shape_of(diffusers, "blocks.0.norm2.weight") == shape{40});
  CHECK(shape_of(diffusers, "blocks.0.ffn.net.0.proj.weight") == shape{56, 40});
  CHECK(shape_of(diffusers, "blocks.1.scale_shift_table") == shape{1, 6, 40});
  CHECK(shape_of(diffusers, "scale_shift_table") == shape{1, 2, 40});
  CHECK(shape_of(diffusers, "proj_out.bias") == shape{12});

  std::vector<std::string> official_names, diffusers_names;
  for (const auto& spec : official) official_names.push_back(spec.name);
  for (const auto& spec : diffusers) diffusers_names.push_back(spec.name);
  CHECK(detect_wan_layout(official_names) == wan_layout::official);
  CHECK(detect_wan_layout(diffusers_names) == wan_layout::diffusers);
  CHECK(detect_wan_layout(std::vector<std::string>{"blocks.0.self_attn.q.weight"}) == wan_layout::official);
  CHECK(detect_wan_layout(std::vector<std::string>{"condition_embedder.time_proj.bias"}) == wan_layout::diffusers);
  CHECK_FALSE(detect_wan_layout(std::vector<std::string>{"patch_embedding.weight"}).has_value());
  CHECK(parse_wan_layout("official") == wan_layout::official);
  CHECK(error_of([] { parse_wan_layout("bfl"); }) == "unknown Wan layout 'bfl' (expected official or diffusers)");

  // The documented report example.
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& spec : official) shapes[spec.name] = spec.shape;
  shapes.erase("head.head.bias");
  shapes["head.modulation"] = {2, 40};
  const wan_key_report report = check_wan_tensors(tiny, wan_layout::official, shapes);
  CHECK(report.missing == std::vector<std::string>{"head.head.bias"});
  CHECK(report.mismatched == std::vector<std::string>{"head.modulation [2, 40] (expected [1, 2, 40])"});
  CHECK(report.unexpected.empty());

  // The mapping: one entry per official tensor (same order), every diffusers tensor a source exactly once.
  const auto mapping = wan_diffusers_to_official(tiny);
  REQUIRE(mapping.size() == official.size());
  std::multiset<std::string> sources;
  for (std::size_t i = 0; i < mapping.size(); ++i) {
    CHECK(mapping[i].target == official[i].name);
    CHECK(shape_of(diffusers, mapping[i].source) == official[i].shape);
    sources.insert(mapping[i].source);
  }
  CHECK(sources.size() == diffusers.size());
  for (const auto& spec : diffusers) CHECK(sources.count(spec.name) == 1);
  const auto has = [&](const wan_key_mapping& entry) { return std::ranges::find(mapping, entry) != mapping.end(); };
  CHECK(has({"blocks.0.norm3.weight", "blocks.0.norm2.weight"}));
  CHECK(has({"blocks.1.modulation", "blocks.1.scale_shift_table"}));
  CHECK(has({"head.modulation", "scale_shift_table"}));
  CHECK(has({"blocks.1.cross_attn.o.weight", "blocks.1.attn2.to_out.0.weight"}));
  CHECK(has({"time_projection.1.bias", "condition_embedder.time_proj.bias"}));
}

TEST_CASE("the model's parameters are exactly the official layout") {
  wan_transformer model(wan_config::tiny());
  const auto params = model.named_parameters();
  const auto expected = wan_expected_tensors(model.config(), wan_layout::official);
  REQUIRE(params.size() == expected.size());
  for (const auto& spec : expected) {
    const torch::Tensor* found = params.find(spec.name);
    REQUIRE(found != nullptr);
    CHECK(found->sizes().vec() == spec.shape);
  }
}

TEST_CASE("wan grid ids, RoPE split and forward shapes") {
  CHECK(torch::equal(wan_grid_ids(2, 1, 2),
                     torch::tensor({0., 0., 0., 0., 0., 1., 1., 0., 0., 1., 0., 1.}, torch::kFloat64).reshape({4, 3})));
  wan_transformer model(wan_config::tiny());
  for (const auto& [f, h, w] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{3, 4, 6}, {1, 2, 2}, {2, 3, 5}, {1, 1, 1}}) {
    const case_inputs in = make_inputs(model.config(), 2, f, h, w, 5, 1);
    const torch::Tensor v = run(model, in);
    CHECK(v.sizes() == torch::IntArrayRef({2, 3, f, h, w}));
    CHECK(torch::isfinite(v).all().item<bool>());
  }
  const case_inputs in = make_inputs(model.config(), 2, 1, 2, 2, 5, 1);
  CHECK(error_of([&] {
          model.forward(torch::zeros({2, 3, 1, 2, 2}), in.t, in.text);
        }) == "wan latents must be [B, 4, F, H, W], got [2, 3, 1, 2, 2]");
  CHECK(error_of([&] {
          model.forward(in.x, in.t, torch::zeros({2, 9, 24}));
        }) == "wan text must be [2, L <= 8, 24], got [2, 9, 24]");
  CHECK(error_of([&] { model.forward(in.x, torch::zeros({3}), in.text); }) ==
        "wan needs one timestep per row: 3 for 2");
}

TEST_CASE("wan forward agrees with the independent numpy reference to 1e-4") {
  wan_transformer model(wan_config::tiny());
  randomize(model, 7);
  for (const auto& [f, h, w, l, tag] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::string>>{
           {3, 4, 6, 5, "even"}, {2, 3, 5, 8, "odd"}}) {
    const case_inputs in = make_inputs(model.config(), 2, f, h, w, l, 11);
    const torch::Tensor ours = run(model, in);
    const torch::Tensor reference = numpy_reference(model, in, tag);
    const double scale = reference.abs().max().item<double>();
    INFO(tag << " max |diff| " << max_abs_diff(ours, reference) << ", max |v| " << scale);
    CHECK(scale > 0.1);  // not a degenerate output
    CHECK(max_abs_diff(ours, reference) / scale < 1e-4);
  }
}

TEST_CASE("one checkpoint in each layout loads into the same module with identical outputs") {
  const wan_config config = wan_config::tiny();
  wan_transformer source(config);
  randomize(source, 3);
  const auto official = wan_state(source);
  const auto diffusers = convert_wan_weights(official, config, wan_layout::official, wan_layout::diffusers);
  CHECK(diffusers.size() == official.size());
  CHECK(torch::equal(diffusers.at("blocks.1.norm2.bias"), official.at("blocks.1.norm3.bias")));
  CHECK(torch::equal(diffusers.at("scale_shift_table"), official.at("head.modulation")));

  const case_inputs in = make_inputs(config, 2, 2, 4, 4, 3, 5);
  wan_transformer from_official(config), from_diffusers(config);
  load_wan_weights(from_official, official);
  load_wan_weights(from_diffusers, diffusers);  // layout detected from the names
  const torch::Tensor expected = run(source, in);
  CHECK(torch::equal(run(from_official, in), expected));
  CHECK(torch::equal(run(from_diffusers, in), expected));
  const auto round_trip = convert_wan_weights(diffusers, config, wan_layout::diffusers, wan_layout::official);
  for (const auto& [name, tensor] : official) CHECK(torch::equal(round_trip.at(name), tensor));

  // bf16 weights load into an fp32 model as their bf16-rounded values.
  std::map<std::string, torch::Tensor> half;
  for (const auto& [name, tensor] : diffusers) half[name] = tensor.to(torch::kBFloat16);
  wan_transformer from_bf16(config);
  load_wan_weights(from_bf16, half);
  CHECK(from_bf16.head->head->weight.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(from_bf16.head->head->weight,
                     official.at("head.head.weight").to(torch::kBFloat16).to(torch::kFloat32)));
  // A bf16 model runs (float32 norms, modulation and residual stream inside) and stays close to fp32.
  from_bf16.to(torch::kBFloat16);
  const torch::Tensor low = run(from_bf16, in);
  CHECK(low.scalar_type() == torch::kBFloat16);
  CHECK(max_abs_diff(low, expected) / expected.abs().max().item<double>() < 0.1);

  auto broken = diffusers;
  broken.erase("proj_out.bias");
  broken["blocks.0.attn1.bogus.weight"] = torch::zeros({2});
  CHECK(error_of([&] { load_wan_weights(from_official, broken); }) ==
        "Wan checkpoint (diffusers layout) does not match the config: missing proj_out.bias, unexpected "
        "blocks.0.attn1.bogus.weight");
  CHECK(error_of([&] {
          load_wan_weights(from_official, std::map<std::string, torch::Tensor>{{"x.weight", torch::zeros({1})}});
        }) == "cannot tell the Wan layout of a checkpoint of 1 tensors (neither official nor diffusers names)");
}

TEST_CASE("LoRA on attention and FFN: zero B equals the base, a trained B changes the output") {
  const wan_config config = wan_config::tiny();
  wan_transformer model(config);
  randomize(model, 4);
  const case_inputs in = make_inputs(config, 1, 1, 2, 4, 3, 6);
  const torch::Tensor base = run(model, in);
  // Per block: self q, k, v, o + cross q, k, v, o + ffn 0, 2 = 10 adapted layers; embeddings and head frozen.
  CHECK(add_lora(model, lora_options{.rank = 2, .alpha = 4}) == 10 * config.layers);
  CHECK(torch::equal(run(model, in), base));
  {
    torch::NoGradGuard no_grad;
    model.blocks[0]->cross_attn->v->lora_B.fill_(0.1);
    model.blocks[1]->ffn->fc1->lora_B.fill_(0.1);
  }
  CHECK(max_abs_diff(run(model, in), base) > 1e-3);
  set_lora_enabled(model, false);
  CHECK(torch::allclose(run(model, in), base, 1e-5, 1e-5));
}

TEST_CASE("gradient checkpointing gives the same loss and gradients") {
  const wan_config config = wan_config::tiny();
  wan_transformer model(config);
  randomize(model, 9);
  const case_inputs in = make_inputs(config, 2, 2, 2, 4, 3, 2);
  const auto gradients = [&](bool checkpoint) {
    model.set_gradient_checkpointing(checkpoint);
    model.zero_grad();
    const torch::Tensor loss = model.forward(in.x, in.t, in.text).pow(2).sum();
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach()};
    for (const auto& p : model.parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = gradients(false);
  const auto checkpointed = gradients(true);
  REQUIRE(plain.size() == checkpointed.size());
  CHECK(torch::allclose(plain[0], checkpointed[0]));
  double worst = 0;
  for (std::size_t i = 1; i < plain.size(); ++i)  // relative to the gradient's size (fp32 rounding only)
    worst =
        std::max(worst, max_abs_diff(plain[i], checkpointed[i]) / std::max(1.0, plain[i].abs().max().item<double>()));
  CHECK(worst < 1e-5);
  for (const auto& block : model.blocks)  // every block's weights get a gradient through the checkpoint
    CHECK(block->self_attn->q->weight.grad().abs().sum().item<double>() > 0);
}
