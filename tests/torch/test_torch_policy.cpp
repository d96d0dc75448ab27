// The autograd policy (adapters/torch/branchgrpo/torch/policy.hpp), its optimizer pieces (optim.hpp) and the
// compatibility header (compat.hpp), on a tiny MLP velocity model written here: v(x) = W2 tanh(W1 x + b1 +
// sigma + prompt / 4 + B A x) + b2, with a LoRA-like pair (A, B) as the only trainable weights.
#include <branchgrpo/torch/guidance.hpp>
#include <branchgrpo/torch/policy.hpp>  // before Catch2 on purpose: compat.hpp keeps Catch2's CHECK either way
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "branchgrpo/schedule/sigma_schedule.hpp"
#include "branchgrpo/schedule/steppers.hpp"
#include "branchgrpo/training/methods.hpp"
#include "branchgrpo/training/trainer.hpp"
#include "thread_group.hpp"

using namespace branchgrpo;

namespace {

/// A 2-layer MLP over the flattened latent with a rank-r adapter on the first layer. Rows are evaluated one
/// by one, so a row's velocity does not depend on the batch (the first update's log-prob gap is then 0).
struct tiny_velocity_model {
  torch::Tensor w1, b1, w2, b2;  // frozen base
  torch::Tensor lora_a, lora_b;  // trainable
  bool adapters = true;

  static tiny_velocity_model make(std::int64_t dims, std::int64_t hidden, std::int64_t rank, torch::Dtype dtype,
                                  bool zero_b, std::uint64_t seed) {
    torch::manual_seed(seed);
    const auto options = torch::TensorOptions().dtype(dtype);
    tiny_velocity_model m{
        .w1 = torch::randn({hidden, dims}, options) * 0.5,
        .b1 = torch::randn({hidden}, options) * 0.1,
        .w2 = torch::randn({dims, hidden}, options) * 0.3,
        .b2 = torch::randn({dims}, options) * 0.1,
        .lora_a = torch::randn({rank, dims}, options) * 0.3,
        .lora_b = zero_b ? torch::zeros({hidden, rank}, options) : torch::randn({hidden, rank}, options) * 0.3,
        .adapters = true};
    m.lora_a.set_requires_grad(true);
    m.lora_b.set_requires_grad(true);
    return m;
  }

  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    std::vector<torch::Tensor> rows;
    for (std::int64_t r = 0; r < x.size(0); ++r) {
      const torch::Tensor row = x[r].flatten().to(w1.scalar_type()).unsqueeze(0);
      const double condition = batch.sigma + 0.25 * static_cast<double>(batch.prompts[static_cast<std::size_t>(r)]);
      torch::Tensor pre = torch::matmul(row, w1.t()) + b1 + condition;
      if (adapters) pre = pre + torch::matmul(torch::matmul(row, lora_a.t()), lora_b.t());
      rows.push_back((torch::matmul(torch::tanh(pre), w2.t()) + b2).reshape(x[r].sizes()));
    }
    return torch::stack(rows);
  }
  std::vector<torch::Tensor> trainable_parameters() { return {lora_a, lora_b}; }
  void set_adapters_enabled(bool enabled) { adapters = enabled; }
};

/// Without the adapter switch: a model that cannot give a KL reference.
struct plain_model {
  torch::Tensor weight = torch::ones({1}).set_requires_grad(true);
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch&) { return x * weight; }
  std::vector<torch::Tensor> trainable_parameters() { return {weight}; }
};

struct no_parameters_model {
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch&) { return x; }
};

static_assert(TorchVelocityModel<tiny_velocity_model>);
static_assert(TorchVelocityModel<plain_model>);
static_assert(!TorchVelocityModel<no_parameters_model>);
// The frozen base is the KL reference only for a model whose adapters can be switched off.
static_assert(ReferencePolicy<autograd_policy<tiny_velocity_model>, torch_backend>);
static_assert(Policy<autograd_policy<plain_model>, torch_backend> &&
              !ReferencePolicy<autograd_policy<plain_model>, torch_backend>);
static_assert(!TorchVelocityModel<int>);
static_assert(AdapterSwitch<tiny_velocity_model>);
static_assert(!AdapterSwitch<plain_model>);
static_assert(Policy<autograd_policy<tiny_velocity_model>, torch_backend>);
static_assert(Denoiser<autograd_policy<plain_model>, torch_backend>);
static_assert(Backend<torch_backend>);

/// Latent-space reward: -mean over elements of (x - target)^2, target +1 for prompt 0 and -1 otherwise.
struct target_reward {
  torch_backend backend;
  std::vector<double> operator()(const torch::Tensor& leaves, std::span<const std::int64_t> prompts) {
    const std::vector<double> values = backend.to_host(leaves);
    const std::size_t elements = values.size() / prompts.size();
    std::vector<double> out(prompts.size());
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      const double target = prompts[r] == 0 ? 1.0 : -1.0;
      double squares = 0;
      for (std::size_t i = 0; i < elements; ++i)
        squares += (values[r * elements + i] - target) * (values[r * elements + i] - target);
      out[r] = -squares / static_cast<double>(elements);
    }
    return out;
  }
};
static_assert(Reward<target_reward, torch_backend>);

/// An edge batch of `rows` rows of shape {4}: x, next from keyed draws, dance_sde-like coefficients.
edge_batch<torch::Tensor> make_edges(const torch_backend& backend, std::int64_t rows) {
  edge_batch<torch::Tensor> edges;
  edges.step = 2;
  edges.sigma = 0.8;
  edges.coeffs = affine_step{.x_coeff = 0.98, .velocity_coeff = -0.05, .noise_std = 0.3};
  std::vector<double> x(static_cast<std::size_t>(rows * 4)), noise(x.size());
  fill_keyed_normal({.seed = 5, .iteration = 0, .tree = 0, .node = 0, .step = 0, .stream = noise_stream::edge}, x);
  fill_keyed_normal({.seed = 5, .iteration = 0, .tree = 1, .node = 0, .step = 0, .stream = noise_stream::edge}, noise);
  std::vector<double> next(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) next[i] = x[i] + 0.3 * noise[i];
  edges.x = backend.from_host(x, rows, latent_shape{{4}});
  edges.next = backend.from_host(next, rows, latent_shape{{4}});
  for (std::int64_t r = 0; r < rows; ++r) {
    edges.std.push_back(0.2 + 0.1 * static_cast<double>(r));
    edges.trees.push_back(static_cast<std::uint32_t>(r));
    edges.prompts.push_back(r % 2);
  }
  return edges;
}

/// sum_r w_r logp_r under the model's current weights, through the rollout's path (no autograd).
double objective(torch_backend& backend, tiny_velocity_model& model, const edge_batch<torch::Tensor>& edges,
                 const std::vector<double>& w) {
  torch::NoGradGuard no_grad;
  const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
  const torch::Tensor mean =
      backend.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, model.velocity(edges.x, batch));
  const std::vector<double> log_probs = backend.row_log_prob(edges.next, mean, edges.std);
  double sum = 0;
  for (std::size_t r = 0; r < w.size(); ++r) sum += w[r] * log_probs[r];
  return sum;
}

void swap_without_ema(plain_model& model, const torch_backend& backend) {
  autograd_policy policy(model, backend);
  policy.swap_ema();
}

std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) out.push_back(t.detach().clone());
  return out;
}

}  // namespace

TEST_CASE("compat: attention is softmax(q k^T / sqrt(d)) v", "[torch][compat]") {
  // The doc example: one key takes all the weight.
  const torch::Tensor q = torch::tensor({1.0, 0.0}, torch::kFloat64).reshape({1, 1, 1, 2});
  const torch::Tensor v = torch::tensor({2.0, 4.0}, torch::kFloat64).reshape({1, 1, 1, 2});
  const torch::Tensor one = attention(q, q, v);
  CHECK(one[0][0][0][0].item<double>() == Approx(2.0));
  CHECK(one[0][0][0][1].item<double>() == Approx(4.0));
  // Two keys k1 = (1, 0), k2 = (0, 1), query (1, 0), d = 2: scores 1/sqrt 2 and 0, weights
  // p = 1 / (1 + exp(-1/sqrt 2)) = 0.66976..., 1 - p; values 2 and 4 -> 2 p + 4 (1 - p) = 2.66048...
  const torch::Tensor keys = torch::tensor({1.0, 0.0, 0.0, 1.0}, torch::kFloat64).reshape({1, 1, 2, 2});
  const torch::Tensor values = torch::tensor({2.0, 2.0, 4.0, 4.0}, torch::kFloat64).reshape({1, 1, 2, 2});
  const double p = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  CHECK(attention(q, keys, values)[0][0][0][0].item<double>() == Approx(2 * p + 4 * (1 - p)).epsilon(1e-12));
  // bfloat16 inputs keep their dtype.
  CHECK(attention(q.to(torch::kBFloat16), keys.to(torch::kBFloat16), values.to(torch::kBFloat16)).scalar_type() ==
        torch::kBFloat16);
}

TEST_CASE("compat: autocast is a no-op off CUDA; float8 exists from 2.1", "[torch][compat]") {
  const autocast_guard off(true, torch::kCPU);
  CHECK_FALSE(off.active());
  CHECK(float8_e4m3fn_dtype().has_value() == torch_at_least(2, 1));
}

TEST_CASE("optim: clip_gradient_norm and ema_weights doc examples", "[torch][optim]") {
  // Gradients {3, 4} and {0}, max_norm 1 -> returns 5, gradients scaled by 1 / (5 + 1e-6).
  torch::Tensor a = torch::zeros({2}, torch::kFloat64).set_requires_grad(true);
  torch::Tensor b = torch::zeros({1}, torch::kFloat64).set_requires_grad(true);
  a.mutable_grad() = torch::tensor({3.0, 4.0}, torch::kFloat64);
  b.mutable_grad() = torch::tensor({0.0}, torch::kFloat64);
  const std::vector<torch::Tensor> params{a, b};
  CHECK(clip_gradient_norm(params, 1.0) == 5.0);
  CHECK(a.grad()[0].item<double>() == Approx(3.0 / (5.0 + 1e-6)).epsilon(1e-14));
  CHECK(a.grad()[1].item<double>() == Approx(4.0 / (5.0 + 1e-6)).epsilon(1e-14));
  CHECK(clip_gradient_norm(params, 0.0) == Approx(1.0).epsilon(1e-6));  // measure only: ~1 after clipping
  CHECK_THROWS_AS(clip_gradient_norm(params, -1.0), invalid_input);

  // decay 0.9, weight 0 -> 1: shadow 0.1; swap exchanges, swap again restores.
  torch::Tensor w = torch::zeros({1}, torch::kFloat64);
  const std::vector<torch::Tensor> weights{w};
  ema_weights ema{.decay = 0.9, .shadow = {}};
  ema.reset(weights);
  w.fill_(1.0);
  ema.update(weights);
  CHECK(ema.shadow[0].item<double>() == Approx(0.1).epsilon(1e-15));
  ema.swap(weights);
  CHECK(w.item<double>() == Approx(0.1).epsilon(1e-15));
  CHECK(ema.shadow[0].item<double>() == 1.0);
  ema.swap(weights);
  CHECK(w.item<double>() == 1.0);
  ema_weights bad{.decay = 1.0, .shadow = {}};
  CHECK_THROWS_AS(bad.reset(weights), invalid_input);
}

TEST_CASE("policy: log-probs are torch_backend::row_log_prob of the rollout's mean, bit for bit", "[torch][policy]") {
  torch_backend backend;  // float32
  auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat32, false, 1);
  autograd_policy policy(model, backend);
  const auto edges = make_edges(backend, 5);

  const denoise_batch batch{.step = edges.step, .sigma = edges.sigma, .trees = edges.trees, .prompts = edges.prompts};
  const torch::Tensor mean =
      backend.affine(edges.coeffs.x_coeff, edges.x, edges.coeffs.velocity_coeff, policy(edges.x, batch));
  const std::vector<double> expected = backend.row_log_prob(edges.next, mean, edges.std);
  std::vector<double> seen;
  const std::vector<double> got = policy.accumulate(edges, [&](std::span<const double> log_probs) {
    seen.assign(log_probs.begin(), log_probs.end());
    return std::vector<double>(log_probs.size(), 0.0);
  });
  CHECK(got == expected);
  CHECK(seen == expected);
  // The rollout ran without autograd; the update's log-probs are the same as a batch of one row each.
  CHECK_FALSE(policy(edges.x, batch).requires_grad());
  for (std::int64_t r = 0; r < 5; ++r) {
    edge_batch<torch::Tensor> one = edges;
    one.x = backend.slice_rows(edges.x, r, r + 1);
    one.next = backend.slice_rows(edges.next, r, r + 1);
    one.std = {edges.std[static_cast<std::size_t>(r)]};
    one.trees = {edges.trees[static_cast<std::size_t>(r)]};
    one.prompts = {edges.prompts[static_cast<std::size_t>(r)]};
    const auto single =
        policy.accumulate(one, [](std::span<const double> lp) { return std::vector<double>(lp.size()); });
    CHECK(single[0] == expected[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("policy: the gradient of sum w logp matches central finite differences (float64)", "[torch][policy]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kFloat64};
  auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 2);
  autograd_policy policy(model, backend, {.optimizer = {.max_grad_norm = 0.0}});
  const auto edges = make_edges(backend, 3);
  const std::vector<double> w{0.7, -1.3, 0.4};
  policy.accumulate(edges, [&](std::span<const double>) { return w; });

  const double h = 1e-6;
  int checked = 0;
  for (torch::Tensor parameter : model.trainable_parameters()) {
    REQUIRE(parameter.grad().defined());
    const torch::Tensor flat = parameter.detach().view({-1});  // shares storage with the parameter
    for (std::int64_t j = 0; j < flat.numel(); ++j) {
      const double original = flat[j].item<double>();
      flat[j].fill_(original + h);
      const double up = objective(backend, model, edges, w);
      flat[j].fill_(original - h);
      const double down = objective(backend, model, edges, w);
      flat[j].fill_(original);
      const double numeric = (up - down) / (2 * h);
      const double analytic = parameter.grad().view({-1})[j].item<double>();
      INFO("element " << j << ": analytic " << analytic << ", numeric " << numeric);
      CHECK(analytic == Approx(numeric).epsilon(1e-6).margin(1e-8));
      ++checked;
    }
  }
  CHECK(checked == 2 * 4 + 8 * 2);  // A [2, 4] and B [8, 2]
  // The gradient is not trivially zero.
  CHECK(model.lora_b.grad().abs().max().item<double>() > 1e-3);
}

TEST_CASE("policy: a BranchGRPO iteration on torch_backend: ratio exactly 1, only trainable weights change",
          "[torch][policy][trainer]") {
  torch_backend backend;                                                      // float32
  auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat32, true, 3);  // B = 0: starts at the base
  autograd_policy policy(model, backend, {.optimizer = {.lr = 1e-2}});
  target_reward reward{backend};
  auto recipe = branch_method();
  const sigma_schedule schedule = shifted_linear_schedule(20);
  const std::vector<std::int64_t> prompts{0, 1};
  const latent_shape shape{{4}};
  const std::vector<torch::Tensor> frozen_before = snapshot({model.w1, model.b1, model.w2, model.b2});
  const std::vector<torch::Tensor> trainable_before = snapshot(model.trainable_parameters());
  const auto edges = make_edges(backend, 4);
  CHECK(policy.kl_divergence(edges) == 0.0);  // B = 0: the adapters add exactly nothing

  // The loss's KL term (the trainer's, through accumulate and reference_velocity): one more pass per batch.
  const training_options options{
      .max_batch = 16, .seed = 9, .updates_per_iteration = 1, .total_iterations = 2, .loss = {.kl_beta = 0.5}};
  const iteration_stats first = train_iteration(backend, policy, reward, recipe, schedule, shape, prompts, 0, options);
  CHECK(first.edges_trained == 2 * 218);
  CHECK(first.update_evaluations == 2 * 2 * 218);
  CHECK(first.first_update_log_prob_gap == 0.0);  // batch-invariant model: bit-identical log-probs
  CHECK(first.clip_fraction == 0.0);              // ratio exactly 1 in the first update
  CHECK(policy.last_update().steps == 1);
  CHECK(policy.last_update().rows == 2 * 2 * 218);
  CHECK(first.kl == Approx(0.0).margin(1e-12));  // measured before the step, at the base
  CHECK(policy.last_update().grad_norm > 0.0);

  const std::vector<torch::Tensor> frozen_after{model.w1, model.b1, model.w2, model.b2};
  for (std::size_t i = 0; i < frozen_after.size(); ++i) CHECK(torch::equal(frozen_before[i], frozen_after[i]));
  const std::vector<torch::Tensor> trainable_after = model.trainable_parameters();
  for (std::size_t i = 0; i < trainable_after.size(); ++i)
    CHECK_FALSE(torch::equal(trainable_before[i], trainable_after[i].detach()));
  CHECK(policy.kl_divergence(edges) > 0.0);  // the adapters moved away from the base

  const iteration_stats second = train_iteration(backend, policy, reward, recipe, schedule, shape, prompts, 1, options);
  CHECK(second.first_update_log_prob_gap == 0.0);
  CHECK(second.kl > 0.0);
  CHECK(policy.last_update().steps == 2);
}

TEST_CASE("policy: EMA of the trainable weights, swappable for evaluation", "[torch][policy]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kFloat64};
  auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 4);
  autograd_policy policy(model, backend, {.optimizer = {.lr = 1e-2, .ema_decay = 0.5}});
  const std::vector<torch::Tensor> before = snapshot(model.trainable_parameters());
  const auto edges = make_edges(backend, 3);
  policy.accumulate(edges, [](std::span<const double> lp) { return std::vector<double>(lp.size(), 1.0); });
  const policy_update_report report = policy.apply_update();
  CHECK(report.rows == 3);
  CHECK(report.steps == 1);
  // shadow = 0.5 before + 0.5 after.
  const std::vector<torch::Tensor> after = snapshot(model.trainable_parameters());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK_FALSE(torch::equal(before[i], after[i]));
    CHECK(torch::allclose(policy.ema_parameters()[i], 0.5 * before[i] + 0.5 * after[i], 0.0, 1e-15));
  }
  policy.swap_ema();
  CHECK(torch::allclose(model.lora_b.detach(), 0.5 * before[1] + 0.5 * after[1], 0.0, 1e-15));
  policy.swap_ema();
  CHECK(torch::equal(model.lora_b.detach(), after[1]));
  // Nothing accumulated: no step.
  CHECK(policy.apply_update().rows == 0);
  CHECK(policy.last_update().steps == 1);
}

TEST_CASE("policy: invalid options and inputs are one-line invalid_input errors", "[torch][policy]") {
  torch_backend backend;
  plain_model plain;
  {
    // A model without adapters has no reference: a KL weight is refused by the trainer, in one line.
    autograd_policy policy(plain, backend);
    target_reward reward{backend};
    auto recipe = branch_method();
    CHECK_THROWS_WITH(train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20), latent_shape{{1}},
                                      std::vector<std::int64_t>{0}, 0, training_options{.loss = {.kl_beta = 0.1}}),
                      "kl_beta = 0.1 needs a policy with a reference model (reference_velocity); this policy has none");
  }
  // The optimizer's rules are optimizer_options' (the same words as a config's [optimizer] errors).
  CHECK_THROWS_WITH(autograd_policy(plain, backend, {.optimizer = {.lr = -1.0}}),
                    "optimizer.lr = -1.0: must be in [1e-12, 1]");
  CHECK_THROWS_WITH(autograd_policy(plain, backend, {.optimizer = {.ema_decay = 1.0}}),
                    "optimizer.ema_decay = 1.0: must be in [0, 1)");
  CHECK_THROWS_WITH(autograd_policy(plain, backend, {.optimizer = {.max_grad_norm = -2.0}}),
                    "optimizer.max_grad_norm = -2.0: must be in [0, 1000000]");
  plain_model frozen;
  frozen.weight.set_requires_grad(false);
  CHECK_THROWS_WITH(autograd_policy(frozen, backend), "trainable parameter 0 is not a leaf tensor that requires grad");
  CHECK_THROWS_WITH(swap_without_ema(plain, backend), "swap_ema needs optimizer.ema_decay > 0");

  autograd_policy policy(plain, backend);
  auto edges = make_edges(backend, 2);
  CHECK_THROWS_WITH(policy.accumulate(edges, [](std::span<const double>) { return std::vector<double>{1.0}; }),
                    "loss gradient returned 1 weights for 2 rows");
  CHECK_THROWS_WITH(policy.accumulate(edges,
                                      [](std::span<const double>) {
                                        return std::vector<double>{1.0, std::numeric_limits<double>::quiet_NaN()};
                                      }),
                    "loss gradient weight[1] = nan at step 2");
  edges.std.pop_back();
  CHECK_THROWS_WITH(policy.accumulate(edges, [](std::span<const double> lp) { return std::vector<double>(lp.size()); }),
                    "edge batch at step 2 is inconsistent: 2 parents, 2 children, 1 stds, 2 trees, 2 prompts");
}

TEST_CASE("policy: all_reduce_gradients sums the ranks' gradients and rows, so every rank steps alike",
          "[torch][policy][distributed]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kFloat64};
  const auto edges = make_edges(backend, 3);
  const std::vector<double> w0{0.7, -1.3, 0.4}, w1{-0.2, 0.5, 0.9};
  // One process accumulates both batches, then steps.
  auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 2);
  autograd_policy alone(model, backend);
  alone.accumulate(edges, [&](std::span<const double>) { return w0; });
  alone.accumulate(edges, [&](std::span<const double>) { return w1; });
  const std::vector<torch::Tensor> summed = {model.lora_a.grad().clone(), model.lora_b.grad().clone()};
  alone.apply_update();
  // Two ranks (threads) accumulate one batch each; rank 1's second run accumulates nothing and still steps.
  for (const bool idle : {false, true}) {
    std::vector<tiny_velocity_model> models = {tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 2),
                                               tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 2)};
    branchgrpo::testing::thread_group(2).run([&](branchgrpo::testing::thread_group::member& member) {
      auto& mine = models[static_cast<std::size_t>(member.rank())];
      autograd_policy policy(mine, backend);
      if (member.rank() == 0) policy.accumulate(edges, [&](std::span<const double>) { return w0; });
      if (member.rank() == 0 && idle) policy.accumulate(edges, [&](std::span<const double>) { return w1; });
      if (member.rank() == 1 && !idle) policy.accumulate(edges, [&](std::span<const double>) { return w1; });
      policy.all_reduce_gradients(member);
      CHECK(torch::equal(mine.lora_a.grad(), summed[0]));
      CHECK(torch::equal(mine.lora_b.grad(), summed[1]));
      CHECK(policy.apply_update().rows == 6);
    });
    CHECK(torch::equal(models[0].lora_a, model.lora_a));
    CHECK(torch::equal(models[1].lora_b, model.lora_b));
  }
}

namespace {

/// v(x | p) = weight[p] x, counting its calls and remembering the last batch's prompts.
struct per_prompt_scale_model {
  torch::Tensor weight;
  int calls = 0;
  std::vector<std::int64_t> last_prompts = {};
  torch::Tensor velocity(const torch::Tensor& x, const denoise_batch& batch) {
    ++calls;
    last_prompts.assign(batch.prompts.begin(), batch.prompts.end());
    const torch::Tensor index = torch::tensor(last_prompts, torch::kInt64);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
    shape[0] = x.size(0);
    return weight.index_select(0, index).view(shape) * x;
  }
  std::vector<torch::Tensor> trainable_parameters() { return {weight}; }
};

}  // namespace

TEST_CASE("guidance: the doc example, one batched call, v_u + s (v_c - v_u)", "[torch][guidance]") {
  per_prompt_scale_model inner{.weight = torch::tensor({1.0, 2.0, 3.0}, torch::kFloat64).set_requires_grad(true)};
  classifier_free_guidance guided(inner, {.scale = 5.0, .negative_rows = {2, 2}});
  const torch::Tensor x = torch::ones({2, 1}, torch::kFloat64);
  const std::vector<std::int64_t> prompts{0, 1};
  const std::vector<std::uint32_t> trees{0, 1};
  const denoise_batch batch{.step = 0, .sigma = 0.5, .trees = trees, .prompts = prompts};
  const torch::Tensor v = guided.velocity(x, batch);
  CHECK(guided.model().calls == 1);
  CHECK(guided.model().last_prompts == std::vector<std::int64_t>{0, 1, 2, 2});
  CHECK(v.scalar_type() == torch::kFloat64);
  CHECK(v.flatten()[0].item<double>() == -7.0);
  CHECK(v.flatten()[1].item<double>() == -2.0);

  // Gradients reach both branches: v = (1 - s) w[neg] x + s w[p] x, so d(sum v)/dw = {5, 5, 2 (1 - 5)}.
  v.sum().backward();
  const torch::Tensor grad = guided.model().weight.grad();
  CHECK(grad[0].item<double>() == 5.0);
  CHECK(grad[1].item<double>() == 5.0);
  CHECK(grad[2].item<double>() == -8.0);

  // Scale 1 is the wrapped model: one pass over the rows as given, no negatives needed.
  classifier_free_guidance off(per_prompt_scale_model{.weight = torch::tensor({1.0, 2.0}, torch::kFloat64)},
                               {.scale = 1.0, .negative_rows = {}});
  CHECK(torch::equal(off.velocity(x, batch), torch::tensor({1.0, 2.0}, torch::kFloat64).view({2, 1})));
  CHECK(off.model().calls == 1);
  CHECK(off.model().last_prompts == prompts);

  // bfloat16 rows come back in bfloat16 (combined in float32 in between): 3 + 5 (1.5 - 3) = -4.5.
  classifier_free_guidance half(per_prompt_scale_model{.weight = torch::tensor({1.5, 3.0}, torch::kBFloat16)},
                                {.scale = 5.0, .negative_rows = {1}});
  const std::vector<std::int64_t> one{0};
  const std::vector<std::uint32_t> tree{0};
  const torch::Tensor h =
      half.velocity(torch::ones({1, 1}, torch::kBFloat16), {.step = 0, .sigma = 0.5, .trees = tree, .prompts = one});
  CHECK(h.scalar_type() == torch::kBFloat16);
  CHECK(h.item<double>() == -4.5);
}

TEST_CASE("guidance: a second expert's scale at its noise levels (Wan2.2's guidance_scale_2)", "[torch][guidance]") {
  // The doc example's model with scale 5 above sigma 0.875 and 3 below (scale_at's example).
  const auto below = [](double sigma) { return sigma < 0.875; };
  classifier_free_guidance guided(per_prompt_scale_model{.weight = torch::tensor({1.0, 2.0, 3.0}, torch::kFloat64)},
                                  {.scale = 5.0, .negative_rows = {2, 2}, .second_scale = 3.0, .second_at = below});
  CHECK(guided.options().scale_at(0.9) == 5.0);
  CHECK(guided.options().scale_at(0.5) == 3.0);
  const torch::Tensor x = torch::ones({2, 1}, torch::kFloat64);
  const std::vector<std::int64_t> prompts{0, 1};
  const std::vector<std::uint32_t> trees{0, 1};
  // v_c = {1, 2}, v_u = {3, 3}: at sigma 0.9 {3 + 5 (1 - 3), 3 + 5 (2 - 3)} = {-7, -2}; at 0.5 with 3: {-3, 0}.
  const torch::Tensor high = guided.velocity(x, {.step = 0, .sigma = 0.9, .trees = trees, .prompts = prompts});
  const torch::Tensor low = guided.velocity(x, {.step = 1, .sigma = 0.5, .trees = trees, .prompts = prompts});
  CHECK(torch::equal(high, torch::tensor({-7.0, -2.0}, torch::kFloat64).view({2, 1})));
  CHECK(torch::equal(low, torch::tensor({-3.0, 0.0}, torch::kFloat64).view({2, 1})));
  // Guidance off above the boundary, on below: a single pass where the scale is 1; negatives still needed.
  classifier_free_guidance half_on(per_prompt_scale_model{.weight = torch::tensor({1.0, 2.0, 3.0}, torch::kFloat64)},
                                   {.scale = 1.0, .negative_rows = {2, 2}, .second_scale = 3.0, .second_at = below});
  CHECK(half_on.enabled());
  CHECK(torch::equal(half_on.velocity(x, {.step = 0, .sigma = 0.9, .trees = trees, .prompts = prompts}),
                     torch::tensor({1.0, 2.0}, torch::kFloat64).view({2, 1})));
  CHECK(half_on.model().last_prompts == prompts);
  const auto make = [&](classifier_free_guidance_options options) {
    return classifier_free_guidance(per_prompt_scale_model{.weight = torch::ones({3}, torch::kFloat64)},
                                    std::move(options));
  };
  CHECK_THROWS_WITH(make({.scale = 1.0, .negative_rows = {}, .second_scale = 3.0, .second_at = below}),
                    "guidance scale 1 (second expert 3) needs negative prompts (no negative rows were given)");
  CHECK_THROWS_WITH(
      make({.scale = 1.0, .negative_rows = {2}, .second_scale = 3.0}),
      "second guidance scale must be 0 or positive and finite with the noise levels it applies at, got 3");
}

TEST_CASE("guidance: bad scales and missing negatives are one-line errors", "[torch][guidance]") {
  const auto make = [](double scale, std::vector<std::int64_t> negatives) {
    return classifier_free_guidance(per_prompt_scale_model{.weight = torch::ones({3}, torch::kFloat64)},
                                    {.scale = scale, .negative_rows = std::move(negatives)});
  };
  using Catch::Matchers::Equals;
  CHECK_THROWS_WITH(make(0.0, {2}), Equals("guidance scale must be positive and finite, got 0"));
  CHECK_THROWS_WITH(make(std::nan(""), {2}), Equals("guidance scale must be positive and finite, got nan"));
  CHECK_THROWS_WITH(make(5.0, {}), Equals("guidance scale 5 needs negative prompts (no negative rows were given)"));
  auto guided = make(5.0, {2});
  const std::vector<std::int64_t> prompts{0, 1};
  const std::vector<std::uint32_t> trees{0, 1};
  CHECK_THROWS_WITH(guided.velocity(torch::ones({2, 1}, torch::kFloat64),
                                    {.step = 0, .sigma = 0.5, .trees = trees, .prompts = prompts}),
                    Equals("row 1 has prompt 1, which has no negative prompt (1 prompts have one)"));
}

TEST_CASE("guidance: a BranchGRPO iteration under CFG keeps the first update's ratio exactly 1",
          "[torch][guidance][trainer]") {
  torch_backend backend;
  // Prompts 0 and 1; the model's table row 2 stands for the shared negative prompt.
  classifier_free_guidance guided(tiny_velocity_model::make(4, 8, 2, torch::kFloat32, true, 3),
                                  {.scale = 4.0, .negative_rows = {2, 2}});
  autograd_policy policy(guided, backend, {.optimizer = {.lr = 1e-2}});
  target_reward reward{backend};
  auto recipe = branch_method();
  const training_options options{
      .max_batch = 16, .seed = 9, .updates_per_iteration = 1, .total_iterations = 1, .loss = {.kl_beta = 0.5}};
  const iteration_stats first = train_iteration(backend, policy, reward, recipe, shifted_linear_schedule(20),
                                                latent_shape{{4}}, std::vector<std::int64_t>{0, 1}, 0, options);
  CHECK(first.first_update_log_prob_gap == 0.0);  // batch-invariant rows stay so when doubled
  CHECK(first.clip_fraction == 0.0);
  CHECK(first.kl == Approx(0.0).margin(1e-12));
  CHECK(policy.last_update().grad_norm > 0.0);
  CHECK(policy.kl_divergence(make_edges(backend, 4)) > 0.0);
}

TEST_CASE("policy: float32 master weights keep updates that bfloat16 weights lose", "[torch][policy][precision]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kBFloat16};
  const auto edges = make_edges(backend, 4);
  const auto unit = [](std::span<const double> lp) { return std::vector<double>(lp.size(), 1.0); };
  // lr 1e-5 with Adam's unit-sized first steps: far below half a bfloat16 ulp (2^-9 relative) of weights ~0.3.
  const optimizer_options tiny_steps{.lr = 1e-5, .weight_decay = 0, .max_grad_norm = 0, .ema_decay = 0.9};

  auto plain = tiny_velocity_model::make(4, 8, 2, torch::kBFloat16, false, 4);
  const std::vector<torch::Tensor> plain_before = snapshot(plain.trainable_parameters());
  autograd_policy all_bf16(plain, backend, {.optimizer = tiny_steps, .master_weights = false});
  CHECK_FALSE(all_bf16.has_master_copies());
  for (int step = 0; step < 3; ++step) {
    all_bf16.accumulate(edges, unit);
    all_bf16.apply_update();
  }
  // Every update rounded away (weights away from 0, where a bfloat16 ulp is far above 1e-5).
  const torch::Tensor large = plain_before[1].abs() > 0.02;
  REQUIRE(large.sum().item<std::int64_t>() > 8);
  CHECK(torch::equal(plain.lora_b.detach().masked_select(large), plain_before[1].masked_select(large)));
  CHECK(all_bf16.ema_parameters()[1].scalar_type() == torch::kBFloat16);

  auto mixed = tiny_velocity_model::make(4, 8, 2, torch::kBFloat16, false, 4);
  autograd_policy masters(mixed, backend, {.optimizer = tiny_steps, .master_weights = true});
  REQUIRE(masters.has_master_copies());
  const torch::Tensor master = masters.master_parameters()[1];
  CHECK(master.scalar_type() == torch::kFloat32);
  CHECK(torch::equal(master.to(torch::kBFloat16), mixed.lora_b.detach()));
  masters.accumulate(edges, unit);
  CHECK_FALSE(mixed.lora_b.grad().defined());  // moved to the master's float32 sum
  CHECK(master.grad().scalar_type() == torch::kFloat32);
  masters.accumulate(edges, unit);  // two batches: the master's gradient is their float32 sum
  masters.apply_update();
  for (int step = 0; step < 2; ++step) {
    masters.accumulate(edges, unit);
    masters.apply_update();
  }
  const torch::Tensor moved = (master - plain_before[1].to(torch::kFloat32)).abs();
  CHECK(moved.max().item<double>() > 2e-5);  // three steps of ~lr each
  CHECK(moved.max().item<double>() < 1e-4);
  CHECK(torch::equal(mixed.lora_b.detach(), master.to(torch::kBFloat16)));  // the model holds the rounded master
  CHECK(masters.ema_parameters()[1].scalar_type() == torch::kFloat32);
  masters.swap_ema();
  CHECK(torch::equal(mixed.lora_b.detach(), masters.master_parameters()[1].to(torch::kBFloat16)));
  masters.swap_ema();
  masters.load_weights(plain_before);
  CHECK(torch::equal(mixed.lora_b.detach(), plain_before[1]));
  CHECK(torch::equal(masters.master_parameters()[1], plain_before[1].to(torch::kFloat32)));
}

static_assert(gradient_modes::GradientMode<gradient_modes::replicated>);
static_assert(gradient_modes::ShardedGradientMode<gradient_modes::zero1<single_process>, single_process> &&
              gradient_modes::ShardedGradientMode<gradient_modes::zero2<single_process>, single_process>);
static_assert(!gradient_modes::ShardedGradientMode<gradient_modes::replicated, single_process>);

TEST_CASE("policy: the gradient mode is chosen once, from options.sharding; one rank steps alike in every mode",
          "[torch][policy][sharding]") {
  torch_backend backend{.device = torch::kCPU, .dtype = torch::kFloat64};
  const auto edges = make_edges(backend, 3);
  const std::vector<double> w{0.7, -1.3, 0.4};
  std::vector<torch::Tensor> stepped;
  for (const sharding_mode mode : {sharding_mode::none, sharding_mode::optimizer, sharding_mode::gradients}) {
    auto model = tiny_velocity_model::make(4, 8, 2, torch::kFloat64, false, 2);
    autograd_policy policy(model, backend, {.optimizer = {.lr = 1e-2}, .sharding = {.mode = mode}});
    CHECK(policy.mode().index() == static_cast<std::size_t>(mode));  // replicated, zero1, zero2
    CHECK(policy.sharded() == (mode != sharding_mode::none));
    policy.accumulate(edges, [&](std::span<const double>) { return w; });
    CHECK(policy.apply_update().rows == 3);
    if (stepped.empty()) stepped = {model.lora_a.detach().clone(), model.lora_b.detach().clone()};
    CHECK(torch::equal(model.lora_a, stepped[0]));
    CHECK(torch::equal(model.lora_b, stepped[1]));
  }
}
