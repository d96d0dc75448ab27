#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "branchgrpo/correlator.hpp"

using namespace branchgrpo;

namespace {

/// The keys of the doc comment examples: parent {seed 7, node 0}, children {seed 7, node 1 .. K}.
struct split {
  noise_key parent;
  std::vector<noise_key> children;
  std::size_t elements = 0;

  split(std::size_t k, std::size_t n, std::uint64_t seed = 7, std::uint32_t step = 0) : elements(n) {
    parent = {.seed = seed, .node = 0, .step = step};
    for (std::uint32_t b = 0; b < k; ++b) children.push_back({.seed = seed, .node = b + 1, .step = step});
  }
  [[nodiscard]] sibling_group group() const { return {.parent = parent, .children = children, .elements = elements}; }
};

template <class C>
std::vector<double> draw(const C& correlator, const split& s, double* factor = nullptr) {
  std::vector<double> out(s.children.size() * s.elements);
  const double f = correlator(s.group(), out);
  if (factor != nullptr) *factor = f;
  return out;
}

std::span<const double> row(const std::vector<double>& out, std::size_t b, std::size_t n) {
  return std::span<const double>(out).subspan(b * n, n);
}

double mean(std::span<const double> x) {
  double sum = 0.0;
  for (double v : x) sum += v;
  return sum / static_cast<double>(x.size());
}

double covariance(std::span<const double> x, std::span<const double> y) {
  const double mx = mean(x);
  const double my = mean(y);
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += (x[i] - mx) * (y[i] - my);
  return sum / static_cast<double>(x.size());
}

double correlation(std::span<const double> x, std::span<const double> y) {
  return covariance(x, y) / std::sqrt(covariance(x, x) * covariance(y, y));
}

double dot(std::span<const double> x, std::span<const double> y) {
  double sum = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += x[i] * y[i];
  return sum;
}

constexpr std::size_t big = 100000;

}  // namespace

TEST_CASE("independent: doc example, each row its own keyed draw", "[correlator][independent]") {
  const split s(2, 2);
  double factor = 0.0;
  const auto out = draw(independent{}, s, &factor);
  CHECK(factor == 1.0);
  // Exactly the child's keyed normal with stream edge.
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 2; ++i) CHECK(out[b * 2 + i] == keyed_normal(s.children[b], i));
  const std::vector<double> doc = {-1.057266, -1.515668, 0.867662, 0.734200};
  for (std::size_t i = 0; i < doc.size(); ++i) CHECK(out[i] == Approx(doc[i]).margin(1e-6));
}

TEST_CASE("independent: the child's stream is forced to edge", "[correlator][independent]") {
  split s(2, 3);
  const auto reference = draw(independent{}, s);
  s.children[0].stream = noise_stream::shared;  // a caller's mistake must not change the draw
  CHECK(draw(independent{}, s) == reference);
}

TEST_CASE("independent: marginals N(0, 1), siblings uncorrelated", "[correlator][independent]") {
  const split s(2, big);
  const auto out = draw(independent{}, s);
  for (std::size_t b = 0; b < 2; ++b) {
    CHECK(mean(row(out, b, big)) == Approx(0.0).margin(0.02));
    CHECK(covariance(row(out, b, big), row(out, b, big)) == Approx(1.0).margin(0.03));
  }
  CHECK(correlation(row(out, 0, big), row(out, 1, big)) == Approx(0.0).margin(0.01));
}

TEST_CASE("scaled: doc example, the independent draw with factor scale", "[correlator][scaled]") {
  const split s(2, 2);
  double factor = 0.0;
  const auto out = draw(scaled{}, s, &factor);
  CHECK(factor == 4.0);
  const auto base = draw(independent{}, s);
  for (std::size_t i = 0; i < out.size(); ++i) CHECK(out[i] == base[i]);
  const std::vector<double> doc = {-1.057266, -1.515668, 0.867662, 0.734200};
  for (std::size_t i = 0; i < doc.size(); ++i) CHECK(out[i] == Approx(doc[i]).margin(1e-6));

  double other = 0.0;
  draw(scaled{.scale = 2.5}, s, &other);
  CHECK(other == 2.5);
}

TEST_CASE("scaled: standardized rows (the engine applies the factor)", "[correlator][scaled]") {
  const split s(2, big);
  const auto out = draw(scaled{.scale = 4.0}, s);
  for (std::size_t b = 0; b < 2; ++b) {
    CHECK(mean(row(out, b, big)) == Approx(0.0).margin(0.02));
    // var 1, standard error sqrt(2 / 1e5) = 0.0045.
    CHECK(covariance(row(out, b, big), row(out, b, big)) == Approx(1.0).margin(0.03));
  }
}

TEST_CASE("correlated: doc example with s = 1", "[correlator][correlated]") {
  const split s(2, 2);
  double factor = 0.0;
  const auto out = draw(correlated{.s = 1.0}, s, &factor);
  CHECK(factor == 1.0);
  // xi_0 is the parent's key with stream shared, eta_b the child's key with stream edge.
  noise_key shared = s.parent;
  shared.stream = noise_stream::shared;
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t i = 0; i < 2; ++i) {
      const double expected = (keyed_normal(shared, i) + keyed_normal(s.children[b], i)) / std::sqrt(2.0);
      CHECK(out[b * 2 + i] == Approx(expected).margin(1e-15));
    }
  CHECK(keyed_normal(shared, 0) == Approx(-0.729930).margin(1e-6));
  CHECK(keyed_normal(shared, 1) == Approx(-0.329199).margin(1e-6));
  // (-0.729930 - 1.057266) / sqrt 2 = -1.263738, (-0.329199 - 1.515668) / sqrt 2 = -1.304518,
  // (-0.729930 + 0.867662) / sqrt 2 = 0.097391, (-0.329199 + 0.734200) / sqrt 2 = 0.286379.
  const std::vector<double> doc = {-1.263738, -1.304518, 0.097391, 0.286379};
  for (std::size_t i = 0; i < doc.size(); ++i) CHECK(out[i] == Approx(doc[i]).margin(1e-6));
}

TEST_CASE("correlated: general s matches Eq. 2 across the chunk boundary", "[correlator][correlated]") {
  // 600 elements cross the 256-element chunks of the shared draw at 256 and 512.
  const split s(3, 600, 11, 5);
  const auto out = draw(correlated{.s = 2.0}, s);
  noise_key shared = s.parent;
  shared.stream = noise_stream::shared;
  for (std::size_t b = 0; b < 3; ++b)
    for (std::size_t i : {0u, 255u, 256u, 257u, 511u, 512u, 599u}) {
      const double expected = (keyed_normal(shared, i) + 2.0 * keyed_normal(s.children[b], i)) / std::sqrt(5.0);
      CHECK(out[b * 600 + i] == Approx(expected).margin(1e-15));
    }
}

TEST_CASE("correlated{4}: marginal N(0, 1), sibling correlation 1/17", "[correlator][correlated]") {
  const split s(4, big);
  const auto out = draw(correlated{}, s);
  for (std::size_t b = 0; b < 4; ++b) {
    // Standard errors over 1e5 draws: mean 0.0032, variance 0.0045.
    CHECK(mean(row(out, b, big)) == Approx(0.0).margin(0.02));
    CHECK(covariance(row(out, b, big), row(out, b, big)) == Approx(1.0).margin(0.03));
    for (std::size_t c = b + 1; c < 4; ++c)
      CHECK(correlation(row(out, b, big), row(out, c, big)) == Approx(1.0 / 17.0).margin(0.01));
  }
}

TEST_CASE("correlated{1}: sibling correlation 1/2", "[correlator][correlated]") {
  const split s(2, big);
  const auto out = draw(correlated{.s = 1.0}, s);
  CHECK(correlation(row(out, 0, big), row(out, 1, big)) == Approx(0.5).margin(0.01));
}

TEST_CASE("antithetic: doc example, exact negation and an independent odd child", "[correlator][antithetic]") {
  const split s(3, 2);
  double factor = 0.0;
  const auto out = draw(antithetic{}, s, &factor);
  CHECK(factor == 1.0);
  const auto base = draw(independent{}, s);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(out[i] == base[i]);          // child 0: its own draw
    CHECK(out[2 + i] == -out[i]);      // child 1: exactly -child 0
    CHECK(out[4 + i] == base[4 + i]);  // child 2 (odd K): its own draw
  }
  const std::vector<double> doc = {-1.057266, -1.515668, 1.057266, 1.515668, -0.324166, -1.848057};
  for (std::size_t i = 0; i < doc.size(); ++i) CHECK(out[i] == Approx(doc[i]).margin(1e-6));
}

TEST_CASE("antithetic: K = 4 gives two independent pairs", "[correlator][antithetic]") {
  const split s(4, big);
  const auto out = draw(antithetic{}, s);
  const auto base = draw(independent{}, s);
  for (std::size_t i = 0; i < big; ++i) {
    REQUIRE(out[big + i] == -out[i]);
    REQUIRE(out[3 * big + i] == -out[2 * big + i]);
  }
  CHECK(std::vector<double>(out.begin() + 2 * big, out.begin() + 3 * big) ==
        std::vector<double>(base.begin() + 2 * big, base.begin() + 3 * big));
  CHECK(correlation(row(out, 0, big), row(out, 2, big)) == Approx(0.0).margin(0.01));
  CHECK(covariance(row(out, 1, big), row(out, 1, big)) == Approx(1.0).margin(0.03));
}

TEST_CASE("orthogonal: doc example", "[correlator][orthogonal]") {
  const split s(2, 2);
  double factor = 0.0;
  const auto out = draw(orthogonal{}, s, &factor);
  CHECK(factor == 1.0);
  const auto base = draw(independent{}, s);
  CHECK(out[0] == base[0]);  // row 0 is its own draw, untouched
  CHECK(out[1] == base[1]);
  // x_0.x_1 / x_0.x_0 = -0.594470; v_1 = {0.239149, -0.166820}; |x_1| / |v_1| = 1.136612 / 0.291584.
  const std::vector<double> doc = {-1.057266, -1.515668, 0.932217, -0.650275};
  for (std::size_t i = 0; i < doc.size(); ++i) CHECK(out[i] == Approx(doc[i]).margin(1e-6));
}

TEST_CASE("orthogonal: rows orthogonal, norms of the own draws kept", "[correlator][orthogonal]") {
  for (const std::size_t n : {std::size_t{4}, std::size_t{5}, std::size_t{64}, std::size_t{4096}}) {
    const std::size_t k = 4;
    const split s(k, n, 3, 2);
    const auto out = draw(orthogonal{}, s);
    const auto base = draw(independent{}, s);
    for (std::size_t b = 0; b < k; ++b) {
      const double norm = std::sqrt(dot(row(out, b, n), row(out, b, n)));
      const double own = std::sqrt(dot(row(base, b, n), row(base, b, n)));
      CHECK(norm == Approx(own).epsilon(1e-12));
      for (std::size_t c = b + 1; c < k; ++c) {
        const double other = std::sqrt(dot(row(out, c, n), row(out, c, n)));
        CHECK(std::abs(dot(row(out, b, n), row(out, c, n))) <= 1e-12 * norm * other);
      }
    }
  }
}

TEST_CASE("orthogonal: K > elements orthogonalizes the first `elements` rows", "[correlator][orthogonal]") {
  const split s(3, 2);
  const auto out = draw(orthogonal{}, s);
  const auto base = draw(independent{}, s);
  CHECK(std::abs(dot(row(out, 0, 2), row(out, 1, 2))) <=
        1e-12 * std::sqrt(dot(row(out, 0, 2), row(out, 0, 2)) * dot(row(out, 1, 2), row(out, 1, 2))));
  CHECK(out[4] == base[4]);  // the third row stays its own independent draw
  CHECK(out[5] == base[5]);

  // One element: nothing to orthogonalize, every row its own draw.
  const split single(3, 1);
  CHECK(draw(orthogonal{}, single) == draw(independent{}, single));
}

TEST_CASE("orthogonal: each row's marginal stays N(0, 1)", "[correlator][orthogonal]") {
  const split s(4, big);
  const auto out = draw(orthogonal{}, s);
  for (std::size_t b = 0; b < 4; ++b) {
    CHECK(mean(row(out, b, big)) == Approx(0.0).margin(0.02));
    CHECK(covariance(row(out, b, big), row(out, b, big)) == Approx(1.0).margin(0.03));
  }
}

TEMPLATE_TEST_CASE("correlators are deterministic in their keys", "[correlator][determinism]", independent, scaled,
                   correlated, antithetic, orthogonal) {
  const TestType correlator{};
  const split s(3, 37, 5, 4);
  const auto first = draw(correlator, s);
  CHECK(draw(correlator, s) == first);  // bit-identical

  split moved = s;
  moved.children[0].node = 99;  // a different child key changes that child's row
  const auto changed = draw(correlator, moved);
  CHECK(std::vector<double>(changed.begin(), changed.begin() + 37) !=
        std::vector<double>(first.begin(), first.begin() + 37));

  split other_seed = s;
  other_seed.parent.seed = other_seed.children[0].seed = other_seed.children[1].seed = other_seed.children[2].seed = 6;
  CHECK(draw(correlator, other_seed) != first);
}

TEST_CASE("correlated: the parent key drives the shared draw only", "[correlator][correlated]") {
  const split s(2, 16);
  split moved = s;
  moved.parent.node = 42;
  CHECK(draw(correlated{}, moved) != draw(correlated{}, s));
  CHECK(draw(independent{}, moved) == draw(independent{}, s));  // independent never reads the parent
}

TEMPLATE_TEST_CASE("correlators reject bad groups", "[correlator][invalid]", independent, scaled, correlated,
                   antithetic, orthogonal) {
  const TestType correlator{};
  const split s(2, 3);
  std::vector<double> out(6);

  std::vector<double> wrong(5);
  CHECK_THROWS_AS(correlator(s.group(), wrong), invalid_input);
  std::vector<double> too_long(7);
  CHECK_THROWS_AS(correlator(s.group(), too_long), invalid_input);

  const split lonely(1, 3);
  std::vector<double> one_row(3);
  CHECK_THROWS_AS(correlator(lonely.group(), one_row), invalid_input);

  const split none(0, 3);
  std::vector<double> empty;
  CHECK_THROWS_AS(correlator(none.group(), empty), invalid_input);

  const split no_elements(2, 0);
  CHECK_THROWS_AS(correlator(no_elements.group(), empty), invalid_input);

  split bad_key = s;
  bad_key.children[1].step = max_noise_step + 1;
  CHECK_THROWS_AS(correlator(bad_key.group(), out), invalid_input);  // antithetic never reads it, still checked

  split bad_parent = s;
  bad_parent.parent.iteration = max_noise_iteration + 1;
  CHECK_THROWS_AS(correlator(bad_parent.group(), out), invalid_input);

  CHECK_NOTHROW(correlator(s.group(), out));
}

TEST_CASE("correlator messages name the value", "[correlator][invalid]") {
  const split s(2, 3);
  std::vector<double> wrong(5);
  CHECK_THROWS_WITH(independent{}(s.group(), wrong), "independent output holds 5 values, expected 2 rows of 3");
  const split lonely(1, 3);
  std::vector<double> one_row(3);
  CHECK_THROWS_WITH(correlated{}(lonely.group(), one_row), "correlated needs a split of at least 2 children, got 1");
}

TEST_CASE("scaled and correlated reject non-positive or non-finite parameters", "[correlator][invalid]") {
  const split s(2, 3);
  std::vector<double> out(6);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {0.0, -1.0, nan, inf, -inf}) {
    CHECK_THROWS_AS(scaled{.scale = bad}(s.group(), out), invalid_input);
    CHECK_THROWS_AS(correlated{.s = bad}(s.group(), out), invalid_input);
  }
  CHECK_THROWS_WITH(scaled{.scale = nan}(s.group(), out), "scaled scale must be positive and finite, got nan");
  CHECK_THROWS_WITH(correlated{.s = 0.0}(s.group(), out), "correlated s must be positive and finite, got 0");
  CHECK_NOTHROW(scaled{.scale = 0.5}(s.group(), out));
  CHECK_NOTHROW(correlated{.s = 0.5}(s.group(), out));
}

TEST_CASE("correlator policies compare by their parameters", "[correlator]") {
  CHECK(scaled{} == scaled{.scale = 4.0});
  CHECK_FALSE(scaled{} == scaled{.scale = 2.0});
  CHECK(correlated{} == correlated{.s = 4.0});
  CHECK_FALSE(correlated{} == correlated{.s = 1.0});
}
