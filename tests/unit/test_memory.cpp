// byte_text and require_fits (core/memory.hpp): the doc examples.
#include <catch2/catch.hpp>

#include "branchgrpo/core/memory.hpp"
#include "error_text.hpp"

using branchgrpo::byte_text;
using branchgrpo::require_fits;
using branchgrpo::testing::error_of;

TEST_CASE("byte_text prints three significant digits in decimal units", "[memory][reliability]") {
  CHECK(byte_text(512) == "512 B");
  CHECK(byte_text(1.3455e6) == "1.35 MB");
  CHECK(byte_text(23.4e9) == "23.4 GB");
  CHECK(byte_text(999.7e3) == "1 MB");
  CHECK(byte_text(1.234e12) == "1.23 TB");
  CHECK(byte_text(2.5e30) == "2.5e+30 B");
}

TEST_CASE("require_fits names the setting, the estimate and the budget", "[memory][reliability]") {
  CHECK_NOTHROW(require_fits(1e9, {.bytes = 24e9, .source = "physical memory"}, "--prompts = 8", "the rollout"));
  CHECK(error_of([] {
          require_fits(1.2e12, {.bytes = 24e9, .source = "physical memory"}, "--prompts = 2000000000", "the rollout");
        }) == "--prompts = 2000000000: the rollout needs about 1.2 TB (limit: physical memory 24 GB)");
  CHECK_NOTHROW(require_fits(1e300, {}, "x", "y"));  // the default budget is unlimited
}
