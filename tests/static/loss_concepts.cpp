// Static tier: the loss formulas are generic over the value type. A stand-in "tensor" that offers only
// arithmetic operators and ADL-found exp / clamp / max (as at::Tensor does) must instantiate them all.
#include <concepts>

#include "branchgrpo/loss.hpp"

namespace fake {

struct tensor {
  double value = 0.0;
};
tensor operator-(tensor a) { return {-a.value}; }
tensor operator-(tensor a, tensor b) { return {a.value - b.value}; }
tensor operator+(tensor a, tensor b) { return {a.value + b.value}; }
tensor operator*(tensor a, tensor b) { return {a.value * b.value}; }
tensor operator*(double a, tensor b) { return {a * b.value}; }
tensor operator/(tensor a, double b) { return {a.value / b}; }
tensor exp(tensor a);
tensor clamp(tensor a, double low, double high);
tensor max(tensor a, tensor b);

}  // namespace fake

namespace {

using namespace branchgrpo;

static_assert(std::same_as<decltype(clip_advantage(fake::tensor{}, 5.0)), fake::tensor>);
static_assert(std::same_as<decltype(importance_ratio(fake::tensor{}, fake::tensor{})), fake::tensor>);
static_assert(
    std::same_as<decltype(ppo_clipped_loss(fake::tensor{}, fake::tensor{}, fake::tensor{}, 1e-3)), fake::tensor>);
static_assert(std::same_as<decltype(kl_flow_element(fake::tensor{}, fake::tensor{}, 0.5)), fake::tensor>);
static_assert(
    std::same_as<decltype(edge_loss(fake::tensor{}, fake::tensor{}, fake::tensor{}, fake::tensor{}, ppo_options{})),
                 fake::tensor>);
static_assert(std::same_as<decltype(ppo_clipped_loss(1.0f, 0.0f, 1.0f, 1e-3)), float>);
static_assert(std::same_as<decltype(ppo_clipped_loss_gradient(0.0, 0.0, 1.0, 1e-3)), double>);
static_assert(std::same_as<decltype(kl_flow(std::span<const double>{}, std::span<const double>{}, 1.0)), double>);

// Instantiate the generic bodies (decltype of an auto-free signature does not).
[[maybe_unused]] fake::tensor instantiate_all() {
  const fake::tensor x{};
  return edge_loss(x, x, x, kl_flow_element(x, x, 0.5), ppo_options{}) + clip_advantage(x, 1.0);
}

}  // namespace
