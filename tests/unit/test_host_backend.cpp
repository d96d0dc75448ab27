#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "branchgrpo/rollout/host_backend.hpp"

using namespace branchgrpo;

namespace {

// Rows {1, 2}, {3, 4}, {5, 6} of shape {2}: the doc comment's example tensor.
host_tensor three_rows(host_backend& backend) {
  const std::vector<double> values{1, 2, 3, 4, 5, 6};
  return backend.from_host(values, 3, latent_shape{{2}});
}

}  // namespace

TEST_CASE("host_backend from_host and to_host round-trip row-major values", "[host_backend]") {
  host_backend backend;
  const std::vector<double> values{1, 2, 3, 4, 5, 6};
  const host_tensor x = backend.from_host(values, 2, latent_shape{{1, 3}});
  CHECK(x.rows == 2);
  CHECK(x.shape == latent_shape{{1, 3}});
  CHECK(backend.rows(x) == 2);
  CHECK(backend.to_host(x) == values);
  // Zero rows are a valid (empty) batch.
  const host_tensor empty = backend.from_host({}, 0, latent_shape{{4}});
  CHECK(backend.rows(empty) == 0);
  CHECK(backend.to_host(empty).empty());
}

TEST_CASE("host_backend from_host rejects wrong counts, rows and shapes", "[host_backend]") {
  host_backend backend;
  const std::vector<double> five{1, 2, 3, 4, 5};
  CHECK_THROWS_AS(backend.from_host(five, 2, latent_shape{{3}}), invalid_input);
  CHECK_THROWS_WITH(backend.from_host(five, 2, latent_shape{{3}}), "from_host got 5 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.from_host(five, -1, latent_shape{{3}}), "from_host row count must be non-negative, got -1");
  CHECK_THROWS_WITH(backend.from_host(five, 5, latent_shape{{1, 0}}), "latent dimension 1 is 0, must be at least 1");
  CHECK_THROWS_WITH(backend.from_host(five, 5, latent_shape{}), "a latent shape needs at least one dimension");
}

TEST_CASE("host_backend gather_rows repeats and reorders rows", "[host_backend]") {
  host_backend backend;
  const host_tensor x = three_rows(backend);
  const std::vector<std::int64_t> index{2, 0, 2};
  const host_tensor g = backend.gather_rows(x, index);
  CHECK(g.rows == 3);
  CHECK(g.shape == x.shape);
  CHECK(g.values == std::vector<double>{5, 6, 1, 2, 5, 6});
  CHECK(backend.gather_rows(x, std::vector<std::int64_t>{}).rows == 0);

  CHECK_THROWS_WITH(backend.gather_rows(x, std::vector<std::int64_t>{0, 3}),
                    "gather_rows index[1] = 3 is outside [0, 3)");
  CHECK_THROWS_WITH(backend.gather_rows(x, std::vector<std::int64_t>{-1}),
                    "gather_rows index[0] = -1 is outside [0, 3)");
}

TEST_CASE("host_backend slice_rows takes [begin, end)", "[host_backend]") {
  host_backend backend;
  const host_tensor x = three_rows(backend);
  CHECK(backend.slice_rows(x, 1, 3).values == std::vector<double>{3, 4, 5, 6});
  CHECK(backend.slice_rows(x, 1, 3).rows == 2);
  CHECK(backend.slice_rows(x, 0, 3) == x);
  CHECK(backend.slice_rows(x, 2, 2).rows == 0);

  CHECK_THROWS_WITH(backend.slice_rows(x, 2, 4), "slice_rows [2, 4) is not a range inside [0, 3)");
  CHECK_THROWS_WITH(backend.slice_rows(x, 2, 1), "slice_rows [2, 1) is not a range inside [0, 3)");
  CHECK_THROWS_WITH(backend.slice_rows(x, -1, 1), "slice_rows [-1, 1) is not a range inside [0, 3)");
}

TEST_CASE("host_backend concat_rows appends parts in order", "[host_backend]") {
  host_backend backend;
  const host_tensor x = three_rows(backend);
  const std::vector<host_tensor> parts{backend.slice_rows(x, 2, 3), backend.slice_rows(x, 0, 2)};
  const host_tensor c = backend.concat_rows(parts);
  CHECK(c.rows == 3);
  CHECK(c.values == std::vector<double>{5, 6, 1, 2, 3, 4});

  CHECK_THROWS_WITH(backend.concat_rows(std::vector<host_tensor>{}), "concat_rows needs at least one part");
  const std::vector<host_tensor> mixed{x, backend.from_host(std::vector<double>{1, 2}, 1, latent_shape{{1, 2}})};
  CHECK_THROWS_WITH(backend.concat_rows(mixed), "concat_rows part 1 has rows of shape {1, 2}, part 0 has {2}");
}

TEST_CASE("host_backend affine computes a x + c v", "[host_backend]") {
  host_backend backend;
  const host_tensor x = three_rows(backend);
  // 2 x - x = x;  0.5 x + 3 v with v = {1, 1, ...}: {3.5, 4, 4.5, 5, 5.5, 6}.
  CHECK(backend.affine(2.0, x, -1.0, x).values == std::vector<double>{1, 2, 3, 4, 5, 6});
  const host_tensor ones = backend.from_host(std::vector<double>(6, 1.0), 3, latent_shape{{2}});
  CHECK(backend.affine(0.5, x, 3.0, ones).values == std::vector<double>{3.5, 4, 4.5, 5, 5.5, 6});

  const host_tensor two_rows = backend.slice_rows(x, 0, 2);
  CHECK_THROWS_WITH(backend.affine(1.0, x, 1.0, two_rows), "affine operands differ: 3 rows of {2} vs 2 rows of {2}");
  const host_tensor reshaped = backend.from_host(std::vector<double>{1, 2, 3, 4, 5, 6}, 3, latent_shape{{2, 1}});
  CHECK_THROWS_WITH(backend.affine(1.0, x, 1.0, reshaped),
                    "affine operands differ: 3 rows of {2} vs 3 rows of {2, 1}");
}

TEST_CASE("host_backend row_log_prob is the per-row mean Gaussian log density", "[host_backend]") {
  host_backend backend;
  const double log_sqrt_2pi = 0.5 * std::log(2.0 * std::numbers::pi);
  // Row 0: next {1, 3}, mean {1, 1}, std 2: squares 0 + 4 over 2 std^2 * 2 elements = 4 / 16 = 0.25
  //   -> -0.25 - log 2 - log sqrt(2 pi)   (the doc example).
  // Row 1: next {0, 0}, mean {1, -1}, std 0.5: squares 2 over 2 * 0.25 * 2 = 1 -> 2 / 1 = 2
  //   -> -2 - log 0.5 - log sqrt(2 pi).
  const host_tensor next = backend.from_host(std::vector<double>{1, 3, 0, 0}, 2, latent_shape{{2}});
  const host_tensor mean = backend.from_host(std::vector<double>{1, 1, 1, -1}, 2, latent_shape{{2}});
  const std::vector<double> std_dev{2.0, 0.5};
  const std::vector<double> lp = backend.row_log_prob(next, mean, std_dev);
  REQUIRE(lp.size() == 2);
  CHECK(lp[0] == Approx(-0.25 - std::log(2.0) - log_sqrt_2pi).margin(1e-14));
  CHECK(lp[1] == Approx(-2.0 - std::log(0.5) - log_sqrt_2pi).margin(1e-14));
  // Identical to gaussian_log_prob_mean row by row (it is the same function).
  CHECK(lp[0] == gaussian_log_prob_mean(std::vector<double>{1, 3}, std::vector<double>{1, 1}, 2.0));

  CHECK_THROWS_WITH(backend.row_log_prob(next, mean, std::vector<double>{1.0}),
                    "row_log_prob got 1 standard deviations for 2 rows");
  CHECK_THROWS_WITH(backend.row_log_prob(next, mean, std::vector<double>{1.0, 0.0}),
                    "row_log_prob std[1] = 0 must be positive and finite");
  CHECK_THROWS_WITH(backend.row_log_prob(next, mean, std::vector<double>{-1.0, 1.0}),
                    "row_log_prob std[0] = -1 must be positive and finite");
  CHECK_THROWS_AS(backend.row_log_prob(next, mean, std::vector<double>{std::nan(""), 1.0}), invalid_input);
  CHECK_THROWS_WITH(backend.row_log_prob(next, backend.slice_rows(mean, 0, 1), std::vector<double>{1.0, 1.0}),
                    "row_log_prob operands differ: 2 rows of {2} vs 1 rows of {2}");
}

TEST_CASE("host_backend rejects hand-assembled inconsistent tensors", "[host_backend]") {
  host_backend backend;
  const host_tensor broken{.rows = 2, .shape = latent_shape{{3}}, .values = {1, 2, 3}};
  CHECK_THROWS_WITH(backend.to_host(broken), "to_host: tensor holds 3 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.gather_rows(broken, std::vector<std::int64_t>{0}),
                    "gather_rows: tensor holds 3 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.slice_rows(broken, 0, 1), "slice_rows: tensor holds 3 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.concat_rows(std::vector<host_tensor>{broken}),
                    "concat_rows: tensor holds 3 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.affine(1.0, broken, 1.0, broken), "affine: tensor holds 3 values for 2 rows of 3 elements");
  CHECK_THROWS_WITH(backend.row_log_prob(broken, broken, std::vector<double>{1.0, 1.0}),
                    "row_log_prob: tensor holds 3 values for 2 rows of 3 elements");
  const host_tensor no_shape{.rows = 0, .shape = {}, .values = {}};
  CHECK_THROWS_WITH(backend.to_host(no_shape), "a latent shape needs at least one dimension");
}

TEST_CASE("host_backend results do not alias their inputs", "[host_backend]") {
  host_backend backend;
  host_tensor x = three_rows(backend);
  const host_tensor copy = backend.gather_rows(x, std::vector<std::int64_t>{0, 1, 2});
  x.values[0] = 100.0;
  CHECK(copy.values[0] == 1.0);
  CHECK(copy != x);
}
