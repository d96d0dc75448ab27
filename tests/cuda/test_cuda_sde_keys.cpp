// sde_step_keys_of (cuda/sde_keys.hpp): the host half of the fused SDE step, by hand. The engine-level check that
// these keys give the host engine's rollout bit for bit is test_cuda_engine_hook.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "branchgrpo/cuda/sde_keys.hpp"

using namespace branchgrpo;

namespace {

noise_key key(std::uint32_t node) { return {.seed = 5, .iteration = 1, .tree = 2, .node = node, .step = 3}; }

}  // namespace

TEST_CASE("independent children keep their own keys and no shared ones") {
  const std::vector<noise_key> keys = {key(1), key(2)};
  const std::vector<double> stds = {0.5, 0.5};
  const cuda::sde_step_keys out = cuda::sde_step_keys_of({.branching = 2, .keys = keys, .stds = stds}, /*parents=*/1);
  CHECK(out.own == keys);
  CHECK(out.shared.empty());
  const noise_key device[2] = {};
  const cuda::noise_rows rows = out.rows(device, device);
  CHECK(rows.own == device);
  CHECK(rows.shared == nullptr);
  CHECK(rows.norm == 1.0);
}

TEST_CASE("correlated siblings: own keys on stream edge, each child's parent key on stream shared") {
  // The file comment's example: 1 parent, branching 2, keys {k1, k2}, parent key p, s = 4.
  std::vector<noise_key> keys = {key(1), key(2)};
  keys[0].stream = keys[1].stream = noise_stream::shared;  // the input's stream is replaced
  const std::vector<noise_key> parent = {key(0)};
  const std::vector<double> stds = {0.5, 0.5};
  const cuda::sde_step_keys out = cuda::sde_step_keys_of(
      {.branching = 2, .keys = keys, .stds = stds, .parent_keys = parent, .s = 4.0}, /*parents=*/1);
  REQUIRE(out.own.size() == 2);
  CHECK(out.own[0].node == 1);
  CHECK(out.own[0].stream == noise_stream::edge);
  CHECK(out.own[1].stream == noise_stream::edge);
  REQUIRE(out.shared.size() == 2);
  CHECK(out.shared[0].node == 0);
  CHECK(out.shared[1] == out.shared[0]);
  CHECK(out.shared[0].stream == noise_stream::shared);
  const cuda::noise_rows rows = out.rows(out.own.data(), out.shared.data());
  CHECK(rows.s == 4.0);
  CHECK(rows.norm == Approx(std::sqrt(17.0)).epsilon(1e-15));
}

TEST_CASE("a transition the kernel cannot take is one line naming it") {
  const std::vector<noise_key> keys = {key(1), key(2)};
  const std::vector<double> stds = {0.5, 0.5}, bad = {0.5, -1.0};
  CHECK_THROWS_WITH(cuda::sde_step_keys_of({.branching = 2, .keys = keys, .stds = stds}, 2),
                    "an SDE transition of 2 rows x 2 children got 2 keys and 2 stds");
  CHECK_THROWS_WITH(cuda::sde_step_keys_of({.branching = 2, .keys = keys, .stds = bad}, 1),
                    "row_log_prob std[1] = -1 must be positive and finite");
  CHECK_THROWS_WITH(cuda::sde_step_keys_of({.branching = 2, .keys = keys, .stds = stds, .log_prob_stds = stds}, 1),
                    "the fused SDE kernel scores rows with their drawing stds; got 2 log-prob stds");
  const std::vector<noise_key> parent = {key(0)};
  CHECK_THROWS_WITH(
      cuda::sde_step_keys_of({.branching = 2, .keys = keys, .stds = stds, .parent_keys = parent, .s = 0.0}, 1),
      "correlated s must be positive and finite, got 0");
}
