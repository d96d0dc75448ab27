// Flow-DPPO's edge rule (loss/flow_dppo.hpp, dppo_edge_loss) against the authors' code: the cases of
// dppo_reference_cases.hpp were computed by scripts/generate_dppo_reference.py, which runs UniRL's
// _gaussian_kl_div and _flowdppo_kl_adv_loss (unirl/algorithms/flowdppo.py, at the commit the header names) in
// float64 with torch on seeded inputs: KL below and above the threshold, ratio > 1, < 1, exactly 1 (also from a log
// ratio of one ulp), ratios near overflow and underflow, advantages > 0, < 0 and 0, per-row sigma_t, latents of 4 to
// 6 elements. For each row this test computes the KL as the library does for the update (ppo_ratio.hpp's mean gap:
// kl_from_log_prob_at_reference of the host backend's row_log_prob of the old mean under the new one), then
// dppo_edge_loss, and checks that
//   - the KL is UniRL's kl_per_sample (1e-12 relative, 1e-14 absolute: it is recovered from a log-prob),
//   - the masked rows are exactly those UniRL's rm_mask removes (loss 0),
//   - loss is UniRL's loss_per_elem and loss_gradient autograd's d sum(loss_per_elem) / d new_logp, to 1e-12
//     relative or 1e-12 absolute; a masked row's are exactly 0.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <vector>

#include "branchgrpo/loss/flow_dppo.hpp"
#include "branchgrpo/loss/ppo.hpp"
#include "branchgrpo/rollout/host_backend.hpp"
#include "dppo_reference_cases.hpp"

using namespace branchgrpo;

namespace {

bool close(double value, double reference, double relative, double absolute) {
  return std::abs(value - reference) <= std::max(absolute, relative * std::abs(reference));
}

}  // namespace

TEST_CASE("dppo_edge_loss matches UniRL's _flowdppo_kl_adv_loss row by row", "[flow_dppo][reference]") {
  const host_backend backend;
  for (const dppo_reference::dppo_case& c : dppo_reference::cases) {
    SECTION(c.name) {
      INFO(c.name << ": " << c.description);
      const latent_shape shape{std::vector<std::int64_t>(c.shape.begin(), c.shape.end())};
      const auto rows = static_cast<std::int64_t>(c.new_log_prob.size());
      REQUIRE(rows == c.batch * c.steps);
      REQUIRE(c.old_log_prob.size() == c.new_log_prob.size());
      REQUIRE(c.sigma.size() == c.new_log_prob.size());
      REQUIRE(c.advantage.size() == c.new_log_prob.size());
      REQUIRE(c.loss.size() == c.new_log_prob.size());
      REQUIRE(c.loss_gradient.size() == c.new_log_prob.size());
      REQUIRE(c.masked.size() == c.new_log_prob.size());
      REQUIRE(static_cast<std::int64_t>(c.new_mean.size()) == rows * shape.elements());

      // The KL between N(old_mean, sigma^2) and N(new_mean, sigma^2) as the update computes it (its mean gap).
      const host_tensor old_mean = backend.from_host(c.old_mean, rows, shape);
      const host_tensor new_mean = backend.from_host(c.new_mean, rows, shape);
      const std::vector<double> at_old = backend.row_log_prob(old_mean, new_mean, c.sigma);
      for (std::size_t r = 0; r < c.new_log_prob.size(); ++r) {
        INFO(std::setprecision(17) << "row " << r << ": log_prob " << c.new_log_prob[r] << ", old " << c.old_log_prob[r]
                                   << ", sigma " << c.sigma[r] << ", advantage " << c.advantage[r] << ", UniRL kl "
                                   << c.kl[r] << " (threshold " << c.kl_threshold << "), ratio " << c.ratio[r]);
        const double kl = std::max(0.0, kl_from_log_prob_at_reference(at_old[r], c.sigma[r]));
        CHECK(close(kl, c.kl[r], 1e-12, 1e-14));

        const dppo_edge edge = dppo_edge_loss(c.new_log_prob[r], c.old_log_prob[r], kl, c.advantage[r], c.kl_threshold);
        CHECK(edge.masked == c.masked[r]);
        if (c.masked[r]) {
          CHECK(edge.loss == 0.0);
          CHECK(edge.loss_gradient == 0.0);
        }
        CHECK(close(edge.loss, c.loss[r], 1e-12, 1e-12));
        CHECK(close(edge.loss_gradient, c.loss_gradient[r], 1e-12, 1e-12));
      }
    }
  }
}

TEST_CASE("the UniRL reference cases cover what they claim", "[flow_dppo][reference]") {
  std::size_t rows = 0, masked = 0, kept_above = 0, ratio_one_above = 0, zero_advantage = 0, positive_kept_above = 0,
              negative_kept_above = 0;
  for (const dppo_reference::dppo_case& c : dppo_reference::cases) {
    for (std::size_t r = 0; r < c.new_log_prob.size(); ++r) {
      ++rows;
      const bool above = c.kl[r] >= c.kl_threshold;
      masked += c.masked[r];
      kept_above += above && !c.masked[r];
      ratio_one_above += above && c.ratio[r] == 1.0;
      zero_advantage += c.advantage[r] == 0.0;
      positive_kept_above += above && !c.masked[r] && c.ratio[r] > 1.0 && c.advantage[r] < 0.0;
      negative_kept_above += above && !c.masked[r] && c.ratio[r] < 1.0 && c.advantage[r] > 0.0;
      // UniRL zeroes exactly the rows it removes (no kept row with a nonzero advantage and ratio has loss 0).
      if (c.masked[r]) CHECK(c.loss[r] == 0.0);
    }
  }
  CHECK(dppo_reference::cases.size() >= 12);
  CHECK(rows >= 3 * dppo_reference::cases.size());
  CHECK(masked > 0);
  CHECK(kept_above > 0);
  CHECK(ratio_one_above > 0);
  CHECK(zero_advantage > 0);
  CHECK(positive_kept_above > 0);
  CHECK(negative_kept_above > 0);
}
