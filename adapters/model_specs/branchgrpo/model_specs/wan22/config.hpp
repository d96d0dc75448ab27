#pragma once
// Hyperparameters of Wan2.2's two-expert text-to-video model (A14B): two transformers of the Wan2.1 architecture
// (model_specs/wan/config.hpp), a high-noise expert for the early steps and a low-noise one for the rest, switched at
// a boundary on the noise scale (Wan2.2's "mixture of experts" is this switch, not routing inside a model).
// Torch-free, so the `branchgrpo weights` command and the run config can name it without LibTorch.
//
//   wan22_config::t2v_a14b()  Wan2.2-T2V-A14B: two Wan 14B experts (dim 5120, FFN 13824, 40 heads, 40 blocks,
//                             16 latent channels, text 4096 x 512), boundary 0.875 (Wan2.2's t2v_A14B.boundary,
//                             diffusers' model_index boundary_ratio)
//   wan22_config::tiny()      for tests: two wan_config::tiny() experts with out_dim = in_dim = 4, boundary 0.875
//
// The rule (diffusers' WanPipeline, Wan2.2's generate): at timestep t = 1000 sigma, the high-noise expert runs when
// t >= 1000 boundary, the low-noise one otherwise. Example: boundary 0.875 -> sigma 0.9 (t 900) high, sigma 0.875
// (t 875) high, sigma 0.8 (t 800) low.
//
// Not here: TI2V-5B (one expert of dim 3072, FFN 14336, 24 heads, 30 blocks, 48 latent channels): its latents are
// those of Wan2.2's own VAE (48 channels, 4 x 16 x 16 compression, another architecture than Wan2.1's), for which
// this project has no decoder.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "branchgrpo/core/error.hpp"
#include "branchgrpo/model_specs/wan/config.hpp"

namespace branchgrpo {

/// Wan2.2 A14B's shape: one Wan expert shape (both experts have it), the boundary, the number of experts.
/// Example: wan22_config::t2v_a14b().expert == wan_config::t2v_14b(), .boundary == 0.875, .experts == 2.
/// @pre validate(config) passes before a model is built from it.
struct wan22_config {
  wan_config expert = wan_config::t2v_14b();  ///< each expert's shape (the high- and low-noise ones share it)
  double boundary = 0.875;                    ///< the high-noise expert runs at timesteps >= 1000 boundary
  std::int64_t experts = 2;                   ///< 2: high_noise_model and low_noise_model (A14B)

  static wan22_config t2v_a14b() { return {}; }
  static wan22_config tiny() {
    wan_config expert = wan_config::tiny();
    expert.out_dim = expert.in_dim;
    return {.expert = expert};
  }

  /// The timestep (Wan's 1000-step scale) from which on the high-noise expert runs: 1000 boundary.
  [[nodiscard]] double boundary_timestep() const { return 1000.0 * boundary; }

  friend bool operator==(const wan22_config&, const wan22_config&) = default;
};

/// Throws invalid_input naming the first bad field: the expert's (validate(wan_config), its message prefixed
/// "wan22_config: "), a boundary outside (0, 1), or another number of experts than 2.
/// Example: wan22_config{.boundary = 1.2} -> "wan22_config: boundary 1.2 is outside (0, 1)";
///   NaN -> "wan22_config: boundary nan is outside (0, 1)"; {.experts = 1} -> "wan22_config: experts 1: only the
///   two-expert A14B layout is supported (high_noise_model and low_noise_model)".
/// @post 0 < boundary < 1 (so both experts run on a schedule from 1 to 0), experts == 2, validate(expert) passes.
inline void validate(const wan22_config& c) {
  require(c.boundary > 0 && c.boundary < 1, "wan22_config: boundary ", c.boundary, " is outside (0, 1)");
  require(c.experts == 2, "wan22_config: experts ", c.experts,
          ": only the two-expert A14B layout is supported (high_noise_model and low_noise_model)");
  try {
    validate(c.expert);
  } catch (const invalid_input& error) {
    fail("wan22_config: expert: ", error.what());
  }
}

}  // namespace branchgrpo
