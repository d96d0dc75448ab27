// The torch-free part of `branchgrpo bench iteration --model sd3-tiny | sd3` (tools/cli/bench/sd3.hpp): the analytic
// FLOP count of an SD3 forward, checked term by term by hand.
#include <catch2/catch.hpp>

#include "branchgrpo/model_specs/sd3/config.hpp"
#include "cli/bench/sd3.hpp"

namespace {

using namespace branchgrpo;
using namespace branchgrpo::cli;

// hidden 8, 2 blocks (block 0 with dual attention; block 1 the last, its context stream pre only), 4 channels in
// 2 x 2 patches (P = 16), context 6, pooled 5.
sd3_config small() {
  sd3_config c;
  c.in_channels = c.out_channels = 4;
  c.patch = 2;
  c.hidden = 8;
  c.heads = 2;
  c.depth = 2;
  c.dual_attention_layers = 1;
  c.context_in = 6;
  c.pooled_in = 5;
  return c;
}

TEST_CASE("sd3_forward_flops: 2 blocks at 1 image and 1 text token, every term by hand") {
  const double embedders = 2.0 * 16 * 8 + 2.0 * 6 * 8 + 2.0 * (256 * 8 + 64) + 2.0 * (5 * 8 + 64);  // 4784
  // Block 0: modulations 9d + 6d, joint q k v (S = 2), products, projections and MLPs of both streams, and the
  // image stream's own attention (q k v o 8 N d^2, products 4 N^2 d).
  const double block0 = (2.0 * 8 * 72 + 2.0 * 8 * 48) + 6.0 * 2 * 64 + 4.0 * 4 * 8 + 2.0 * 2 * 64 + 16.0 * 2 * 64 +
                        (8.0 * 64 + 4.0 * 8);  // 5664
  // Block 1: modulations 6d + 2d (the pre-only context), projection and MLP of the image stream only.
  const double block1 = (2.0 * 8 * 48 + 2.0 * 8 * 16) + 6.0 * 2 * 64 + 4.0 * 4 * 8 + 2.0 * 64 + 16.0 * 64;  // 3072
  const double final_layer = 2.0 * 8 * 16 + 2.0 * 8 * 16;                                                   // 512
  CHECK(embedders + block0 + block1 + final_layer == 14032);
  CHECK(sd3_forward_flops(small(), 1, 1) == 14032);
}

TEST_CASE("sd3_forward_flops: the attention products grow with the square of the tokens") {
  // Joint products 4 S^2 d per block and the dual block's 4 N^2 d: with L = 0 the second difference in N is
  // 2 (2 blocks x 4 d + 4 d) = 96.
  const sd3_config c = small();
  const double f1 = sd3_forward_flops(c, 1, 0), f2 = sd3_forward_flops(c, 2, 0), f3 = sd3_forward_flops(c, 3, 0);
  CHECK(f3 - 2 * f2 + f1 == 2 * (2 * 4 * 8 + 4 * 8));
}

}  // namespace
