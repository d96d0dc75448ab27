// The torch-free part of `branchgrpo bench iteration --model wan-tiny | wan` (tools/cli/bench/wan.hpp): the
// analytic FLOP count of a Wan forward, checked term by term by hand, the token count and the bench's tiny config.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>

#include "branchgrpo/model_specs/wan/config.hpp"
#include "cli/bench/wan.hpp"

namespace {

using namespace branchgrpo;
using namespace branchgrpo::cli;

TEST_CASE("wan_forward_flops: wan_config::tiny() at 1 token, every term by hand") {
  // d 40, ffn 56, 2 blocks, patch volume 4, in 4, out 3, freq 32, text 24 x 8 tokens.
  const double patch = 2.0 * 1 * (4 * 4) * 40;                                        // 1280
  const double time = 2.0 * (32 * 40 + 40 * 40) + 2.0 * 40 * 240;                     // 5760 + 19200
  const double text = 2.0 * 8 * (24 * 40 + 40 * 40);                                  // 40960
  const double self_attention = 8.0 * 1 * 1600 + 4.0 * 1 * 1 * 40;                    // q k v o 12800, products 160
  const double cross_attention = 4.0 * 1 * 1600 + 4.0 * 8 * 1600 + 4.0 * 1 * 8 * 40;  // 6400 + 51200 + 1280
  const double ffn = 4.0 * 1 * 40 * 56;                                               // 8960
  const double head = 2.0 * 1 * 40 * (3 * 4);                                         // 960
  const double expected = patch + time + text + 2 * (self_attention + cross_attention + ffn) + head;
  CHECK(expected == 229760);
  CHECK(wan_forward_flops(wan_config::tiny(), 1) == expected);
}

TEST_CASE("wan_forward_flops: the attention products grow with the square of the tokens") {
  const wan_config c = wan_config::tiny();
  // f(n) = a + b n + 2 blocks x 4 n^2 d: the second difference is 2 x 2 x 4 d = 640.
  const double f1 = wan_forward_flops(c, 1), f2 = wan_forward_flops(c, 2), f3 = wan_forward_flops(c, 3);
  CHECK(f3 - 2 * f2 + f1 == 2 * 2 * 4 * 40);
}

TEST_CASE("wan_forward_flops: Wan2.1-T2V-1.3B at 17 frames of 240 x 416 (1950 tokens)") {
  const wan_config c = wan_config::t2v_1_3b();
  CHECK(wan_tokens(c, wan_latent) == 1950);  // 5 x 15 x 26
  // Per block: 8 N d^2 + 4 N^2 d + 4 N d^2 + 4 T d^2 + 4 N T d + 4 N d m with N 1950, T 512, d 1536, m 8960.
  const double block =
      36'805'017'600.0 + 23'362'560'000.0 + 18'402'508'800.0 + 4'831'838'208.0 + 6'134'169'600.0 + 107'347'968'000.0;
  CHECK(block == 196'884'062'208.0);
  // + patch 383385600 + time 33816576 + text 8858370048 + head 383385600.
  const double expected = 30 * block + 383'385'600.0 + 33'816'576.0 + 8'858'370'048.0 + 383'385'600.0;
  CHECK(wan_forward_flops(c, 1950) == expected);
  CHECK(expected == Approx(5.916e12).epsilon(1e-4));
}

TEST_CASE("wan_tokens pads each side up to the patch") {
  const wan_config c = wan_config::t2v_1_3b();  // patch (1, 2, 2)
  CHECK(wan_tokens(c, {16, 1, 3, 3}) == 4);
  CHECK(wan_tokens(c, {16, 4, 8, 8}) == 64);
  CHECK(wan_tokens(wan_bench_tiny_config(), wan_tiny_latent) == 64);
}

TEST_CASE("the wan-tiny bench config is valid and keeps the latent's channels") {
  const wan_config c = wan_bench_tiny_config();
  CHECK_NOTHROW(validate(c));
  CHECK(c.in_dim == c.out_dim);  // the velocity has the latent's shape
  CHECK(c.in_dim == wan_tiny_latent[0]);
  CHECK(c.rope_axes() == std::array<std::int64_t, 3>{12, 10, 10});
  CHECK(wan_config::t2v_1_3b().in_dim == wan_latent[0]);
  // The figure the CLI test cli_bench_wan_tiny expects as forward_flops_per_row: 64 tokens, text 16 x 32, d 64,
  // ffn 128: patch 524288 + time 61440 + text 196608 + 2 x 6815744 + head 524288.
  CHECK(wan_forward_flops(c, 64) == 14'938'112);
}

}  // namespace
