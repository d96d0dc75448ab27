#pragma once
// Memory estimates against a budget: a size from a flag, a config or a file is compared with the memory the process
// may use before anything of that size is built, and a refusal names the setting and both figures in readable
// units. The budget itself is the application's to measure (tools/cli/options/memory_budget.hpp: physical memory and
// ulimits); the library only compares.
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>

#include "branchgrpo/core/error.hpp"

namespace branchgrpo {

/// The memory a process may use: `bytes`, and where the figure comes from ("physical memory", "ulimit -v").
struct memory_budget {
  double bytes = std::numeric_limits<double>::infinity();
  std::string source = "unlimited";
};

/// Bytes as a person reads them: decimal units, at most three significant digits; beyond exabytes an exponent,
/// never a 30-digit number. Example: byte_text(512) == "512 B", byte_text(1.3455e6) == "1.35 MB",
/// byte_text(23.4e9) == "23.4 GB", byte_text(999.7e3) == "1 MB", byte_text(2.5e30) == "2.5e+30 B".
inline std::string byte_text(double bytes) {
  static constexpr const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  char text[48];
  if (!(bytes < 999.5e18)) {
    std::snprintf(text, sizeof text, "%.2g B", bytes);
    return text;
  }
  std::size_t unit = 0;
  while (bytes >= 999.5 && unit + 1 < std::size(units)) {  // 999.5 kB prints as "1 MB", not "1e+03 kB"
    bytes /= 1000;
    ++unit;
  }
  std::snprintf(text, sizeof text, "%.3g %s", bytes, units[unit]);
  return text;
}

/// Throws invalid_input "<setting>: <what> needs about <bytes> (limit: <source> <budget>)" when `bytes` exceeds
/// the budget. Example: require_fits(1.2e12, {.bytes = 24e9, .source = "physical memory"},
///   "--prompts = 2000000000", "the rollout") throws
///   "--prompts = 2000000000: the rollout needs about 1.2 TB (limit: physical memory 24 GB)".
inline void require_fits(double bytes, const memory_budget& budget, std::string_view setting, std::string_view what) {
  if (!(bytes > budget.bytes)) return;
  fail(setting, ": ", what, " needs about ", byte_text(bytes), " (limit: ", budget.source, " ", byte_text(budget.bytes),
       ")");
}

}  // namespace branchgrpo
